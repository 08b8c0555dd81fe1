package rbln

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
)

func TestStagingLayout(t *testing.T) {
	page := os.Getpagesize()
	regions, total := layoutStaging([]int{10, 0, page, page + 1})
	assert.Equal(t, []region{{0, 10}, {page, 0}, {page, page}, {2 * page, page + 1}}, regions)
	assert.Equal(t, 4*page, total)
}

// TestStagingHasNoName: the memory is a memfd, in no filesystem, and each
// buffer ends where it says.
func TestStagingHasNoName(t *testing.T) {
	s, err := newStaging("stepserve-test", 3*os.Getpagesize())
	require.NoError(t, err)
	defer s.close()
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(s.f.Fd())))
	require.NoError(t, err)
	assert.Equal(t, "/memfd:stepserve-test (deleted)", link)
	b := s.buffer(region{offset: 4096, size: 8})
	assert.Equal(t, 8, cap(b), "an append cannot run into the next buffer")
	b[0] = 7
	assert.Equal(t, byte(7), s.data[4096])
	require.NoError(t, s.close())
	assert.NoError(t, s.close(), "a second close does nothing")
}

// TestLoadedModelLeavesNothingInShm: a model loaded on a real worker has
// its staging in memory no file names.
func TestLoadedModelLeavesNothingInShm(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{})
	prog, err := e.Load(context.Background(), loadDigits(t), []bucketing.Shape{{Batch: 1}, {Batch: 4}})
	require.NoError(t, err)
	defer prog.Close()
	require.NoError(t, prog.Compile(context.Background(), 1))
	assert.Empty(t, shmLeftovers(os.Getpid()), "staging files in /dev/shm")
	w := e.workers[0]
	w.mu.Lock()
	pid := w.pid
	w.mu.Unlock()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	require.NoError(t, err)
	assert.Contains(t, string(maps), "/memfd:stepserve-digits.", "the worker maps the memfd it was sent")
}
