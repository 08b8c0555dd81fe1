package suggest

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNearest(t *testing.T) {
	names := []string{"buckets", "batching", "architecture", "inputs", "outputs"}
	assert.Equal(t, "buckets", Nearest("bukets", names))
	assert.Equal(t, "architecture", Nearest("architecure", names))
	assert.Equal(t, "", Nearest("weights", names), "nothing near enough")
}
