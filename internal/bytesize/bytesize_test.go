package bytesize

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 1536: "1.5 KiB", 64 << 20: "64 MiB", 3 << 29: "1.5 GiB", 25<<40 + 1<<39: "25.5 TiB"} {
		assert.Equal(t, want, Format(n), n)
	}
}
