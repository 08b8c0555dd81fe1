package cpufallback

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSetThreads(t *testing.T) {
	if blasThreads == nil {
		assert.Equal(t, 1, SetThreads(4), "gonum's products run serially")
		return
	}
	defer SetThreads(runtime.NumCPU())
	assert.Equal(t, 1, SetThreads(1))
	assert.Equal(t, 1, blasThreads())
	half := max(1, runtime.NumCPU()/2)
	assert.Equal(t, half, SetThreads(0))
	assert.Equal(t, half, blasThreads(), "0 means half the CPUs")
}
