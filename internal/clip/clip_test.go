package clip

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestClip(t *testing.T) {
	assert.Equal(t, "short", Clip("short", 8))
	assert.Equal(t, "exactly8", Clip("exactly8", 8))
	assert.Equal(t, "abcdefgh...", Clip("abcdefghij", 8))
	assert.Equal(t, "abcdefgh...", Clip([]byte("abcdefghij"), 8))
	assert.Equal(t, "abcdefg...", Clip("abcdefgé", 8), "a character is never split")
	assert.Equal(t, "...", Clip("ééé", 0))
	long := strings.Repeat("x", 1<<20)
	assert.Len(t, Clip(long, 64), 67)
}
