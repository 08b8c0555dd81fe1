package core

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// shmObject creates a shared-memory object of size bytes in /dev/shm,
// removed when the test ends, and returns its key and file.
func shmObject(t *testing.T, size int64) (string, *os.File) {
	t.Helper()
	f, err := os.CreateTemp(sharedMemoryDir, "stepserve-test-*")
	if err != nil {
		t.Skipf("no %s to create shared memory in: %v", sharedMemoryDir, err)
	}
	t.Cleanup(func() { f.Close(); os.Remove(f.Name()) })
	require.NoError(t, f.Truncate(size))
	return "/" + filepath.Base(f.Name()), f
}

func TestSharedMemoryKeys(t *testing.T) {
	for key, want := range map[string]string{"/a": "a", "a": "a", "/input_data.0": "input_data.0", "/x-y": "x-y"} {
		got, err := keyFile(key)
		require.NoError(t, err, key)
		assert.Equal(t, want, got, key)
	}
	for _, key := range []string{"", "/", "//a", "/a/b", "a/", "/..", "..", "/a..b", "/.", "/a\x00b", "/sem.mp-1", "torch_1_2", "/" + string(make([]byte, 256))} {
		_, err := keyFile(key)
		assert.Error(t, err, "%q", key)
	}
	for _, name := range []string{"in0", "input:0_shm", "a.b-c_d~"} {
		assert.NoError(t, checkRegionName(name), name)
	}
	for _, name := range []string{"", "a b", "a/b", `a\b`, "a\nb", "é", string(make([]byte, 129))} {
		assert.Error(t, checkRegionName(name), "%q", name)
	}
}

func TestSharedMemoryParameters(t *testing.T) {
	params := func(js string) WireParams {
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(js), &m))
		return WireParams{m: m}
	}
	got, err := shmParams(params(`{"shared_memory_region":"r","shared_memory_byte_size":12,"shared_memory_offset":4}`))
	require.NoError(t, err)
	assert.Equal(t, &ShmTensor{Region: "r", ByteSize: 12, Offset: 4}, got)
	got, err = shmParams(params(`{"shared_memory_region":"r","shared_memory_byte_size":12}`))
	require.NoError(t, err)
	assert.Equal(t, int64(0), got.Offset, "the offset is 0 when left out")
	got, err = shmParams(params(`{"binary_data_size":12}`))
	require.NoError(t, err)
	assert.Nil(t, got)
	for js, want := range map[string]string{
		`{"shared_memory_byte_size":12}`:                                                     "needs shared_memory_region",
		`{"shared_memory_offset":0}`:                                                         "needs shared_memory_region",
		`{"shared_memory_region":"r"}`:                                                       "shared_memory_byte_size is required",
		`{"shared_memory_region":["r"],"shared_memory_byte_size":1}`:                         "must be a string",
		`{"shared_memory_region":"r","shared_memory_byte_size":1.5}`:                         "must be a non-negative integer",
		`{"shared_memory_region":"r","shared_memory_byte_size":"12"}`:                        "must be a non-negative integer",
		`{"shared_memory_region":"r","shared_memory_byte_size":1,"shared_memory_offset":-1}`: "must be a non-negative integer",
		`{"shared_memory_region":"r","shared_memory_byte_size":99999999999999999999}`:        "of at most 281474976710656",
	} {
		_, err := shmParams(params(js))
		if assert.Error(t, err, js) {
			assert.Contains(t, err.Error(), want, js)
		}
	}
}

// A region held by requests is unregistered at once and unmapped when the
// last of them lets go; Unregister returns then, and Close does not wait.
func TestSharedMemoryUnmapsWhenTheLastRequestLetsGo(t *testing.T) {
	s := NewSharedMemory(0, 0, nil)
	key, _ := shmObject(t, 100)
	require.NoError(t, s.Register("r", key, 10, 90))
	page := int64(os.Getpagesize())
	assert.Equal(t, page, s.mapped, "one page mapped")
	a, err := s.hold("r", 0, 90)
	require.NoError(t, err)
	b, err := s.hold("r", 80, 10)
	require.NoError(t, err)
	assert.Same(t, a, b)

	held := s.detach("r")
	assert.Len(t, held, 1, "held, not unmapped")
	done := make(chan error, 1)
	go func() { done <- s.await(context.Background(), held) }()
	_, err = s.hold("r", 0, 1)
	assert.ErrorContains(t, err, "Unable to find shared memory region: 'r'")
	s.release(a)
	select {
	case <-done:
		t.Fatal("Unregister returned while a request held the region")
	default:
	}
	assert.NotNil(t, b.data, "still mapped")
	s.release(b)
	require.NoError(t, <-done)
	assert.Nil(t, b.data)
	assert.Zero(t, s.mapped)

	// Close unregisters without waiting; the held region is unmapped by
	// its last user.
	require.NoError(t, s.Register("r", key, 0, 100))
	c, err := s.hold("r", 0, 100)
	require.NoError(t, err)
	s.Close()
	assert.NotNil(t, c.data)
	s.release(c)
	assert.Zero(t, s.mapped)
	assert.ErrorContains(t, s.Register("r", key, 0, 100), "the server is shutting down")
}

// A fault reading a mapping whose object shrank is an error; any other
// panic is not swallowed.
func TestSharedMemoryGuardsFaults(t *testing.T) {
	_, f := shmObject(t, 8192)
	m, err := unix.Mmap(int(f.Fd()), 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(m)
	buf := make([]byte, 16)
	require.NoError(t, guardFault(func() { copy(buf, m[4096:]) }))
	require.NoError(t, f.Truncate(4096))
	assert.ErrorIs(t, guardFault(func() { copy(buf, m[4096:]) }), errShrank)
	assert.ErrorIs(t, guardFault(func() { copy(m[4096:], buf) }), errShrank)
	assert.Panics(t, func() { _ = guardFault(func() { panic("not a fault") }) })
}
