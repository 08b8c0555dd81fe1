package cpufallback

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSetThreads(t *testing.T) {
	defer SetThreads(0)
	assert.Equal(t, 3, SetThreads(3))
	assert.Equal(t, int32(3), parallelism.Load())
	assert.Equal(t, runtime.NumCPU(), SetThreads(0), "0 means every CPU")
	if blasThreads != nil {
		assert.Equal(t, 1, blasThreads(), "each product on one OpenBLAS thread")
	}
}
