package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/stepserve/stepserve/internal/memlimit"
	"github.com/stepserve/stepserve/server/apierr"
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

// A region held by requests is unregistered at once and unmapped when the
// last of them lets go; Unregister returns then, and Close does not wait.
func TestSharedMemoryUnmapsWhenTheLastRequestLetsGo(t *testing.T) {
	s := New(0, 0, nil)
	key, _ := shmObject(t, 100)
	require.NoError(t, s.Register("r", key, 10, 90))
	page := int64(os.Getpagesize())
	assert.Equal(t, page, s.mapped, "one page mapped")
	a, err := s.Hold("r", 0, 90)
	require.NoError(t, err)
	b, err := s.Hold("r", 80, 10)
	require.NoError(t, err)
	assert.Same(t, a, b)

	held := s.detach("r")
	assert.Len(t, held, 1, "held, not unmapped")
	done := make(chan error, 1)
	go func() { done <- s.await(context.Background(), held) }()
	_, err = s.Hold("r", 0, 1)
	assert.ErrorContains(t, err, "Unable to find shared memory region: 'r'")
	s.Release(a)
	select {
	case <-done:
		t.Fatal("Unregister returned while a request held the region")
	default:
	}
	assert.NotNil(t, b.data, "still mapped")
	s.Release(b)
	require.NoError(t, <-done)
	assert.Nil(t, b.data)
	assert.Zero(t, s.mapped)

	// Close unregisters without waiting; the held region is unmapped by
	// its last user.
	require.NoError(t, s.Register("r", key, 0, 100))
	c, err := s.Hold("r", 0, 100)
	require.NoError(t, err)
	s.Close()
	assert.NotNil(t, c.data)
	s.Release(c)
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
	require.NoError(t, GuardFault(func() { copy(buf, m[4096:]) }))
	require.NoError(t, f.Truncate(4096))
	assert.ErrorIs(t, GuardFault(func() { copy(buf, m[4096:]) }), errShrank)
	assert.ErrorIs(t, GuardFault(func() { copy(m[4096:], buf) }), errShrank)
	assert.Panics(t, func() { _ = GuardFault(func() { panic("not a fault") }) })
}

// addressSpace is a memlimit.Limit under an RLIMIT_AS of limit, with
// outside mapped outside the Go runtime.
func addressSpace(limit, outside int64) memlimit.Limit {
	return memlimit.Limit{Bytes: (limit - outside) / 2, RLimitAS: limit, Outside: outside, AddressSpace: limit - outside}
}

// The configured bound, lowered under RLIMIT_AS to a quarter of what the
// limit leaves, and said so.
func TestSharedMemoryBound(t *testing.T) {
	const gib = 1 << 30
	n, from := Bound(0, memlimit.Limit{Bytes: 16 * gib})
	assert.Equal(t, int64(DefaultMaxBytes), n, "no RLIMIT_AS: the default")
	assert.Empty(t, from)
	n, from = Bound(1*gib, memlimit.Limit{Bytes: 16 * gib})
	assert.Equal(t, int64(gib), n, "no RLIMIT_AS: the key")
	assert.Empty(t, from)

	under4 := addressSpace(4*gib, 1*gib)
	n, from = Bound(0, under4)
	assert.Equal(t, int64(3*gib/4), n, "a quarter of the 3 GiB left")
	assert.Equal(t, "a quarter of the address space RLIMIT_AS (4 GiB) leaves beside the 1 GiB mapped outside the Go runtime, below server.shared_memory.max_bytes (16 GiB)", from)
	n, from = Bound(512<<20, under4)
	assert.Equal(t, int64(512<<20), n, "a key below the share holds")
	assert.Empty(t, from)

	// Mapped past the limit already: nothing to share.
	n, from = Bound(0, memlimit.Limit{RLimitAS: gib, Outside: 2 * gib})
	assert.Zero(t, n)
	assert.Contains(t, from, "RLIMIT_AS (1 GiB)")
}

// Under RLIMIT_AS, a registration past shared memory's share of the
// address space is a 400 (gRPC INVALID_ARGUMENT) naming the bytes mapped,
// the bound and where it comes from; the start says so once.
func TestSharedMemoryRefusedPastTheAddressSpaceShare(t *testing.T) {
	page := int64(os.Getpagesize())
	pages := func(n int64) uint64 { return uint64(n * page) }
	var logs bytes.Buffer
	s := New(0, 0, slog.New(slog.NewTextHandler(&logs, nil)))
	l := addressSpace(64<<30, 64<<30-12*page) // 12 pages left: a share of 3
	s.CapAddressSpace(l)
	assert.Equal(t, 3*page, s.maxBytes)
	assert.Contains(t, logs.String(), "system shared memory bounded by the address space RLIMIT_AS leaves")
	assert.Contains(t, logs.String(), "max_bytes=\"12 KiB\" server.shared_memory.max_bytes=\"16 GiB\" rlimit_as=\"64 GiB\"")

	key, _ := shmObject(t, 1<<20)
	require.NoError(t, s.Register("a", key, 0, pages(2)))
	err := s.Register("b", key, 0, pages(2))
	require.Error(t, err)
	assert.Equal(t, 400, statusOf(err))
	assert.Equal(t, "failed to register shared memory region 'b': it would map 8 KiB, and 8 KiB of the server's 12 KiB for shared memory is mapped already; "+
		"the 12 KiB is a quarter of the address space RLIMIT_AS (64 GiB) leaves beside the 64 GiB mapped outside the Go runtime, below server.shared_memory.max_bytes (16 GiB): "+
		"unregister regions first, or raise RLIMIT_AS to map more", err.Error())
	err = s.Register("c", key, 0, pages(4))
	assert.Equal(t, 400, statusOf(err))
	assert.ErrorContains(t, err, "byte_size 16384 is more than the 12 KiB the server maps for shared memory; the 12 KiB is a quarter of the address space RLIMIT_AS (64 GiB) leaves")
	assert.ErrorContains(t, err, "below server.shared_memory.max_bytes (16 GiB): raise RLIMIT_AS to map more")
	assert.Equal(t, 2*page, s.mapped, "nothing more mapped")
	require.NoError(t, s.Register("b", key, 0, pages(1)), "what fits the share is registered")

	// No RLIMIT_AS: the key alone, and its own words.
	s = New(0, 2*page, nil)
	s.CapAddressSpace(memlimit.Limit{Bytes: 1 << 40})
	require.NoError(t, s.Register("a", key, 0, pages(2)))
	assert.EqualError(t, s.Register("b", key, 0, pages(1)), "failed to register shared memory region 'b': it would map 4 KiB, and 8 KiB of the server's 8 KiB for shared memory (server.shared_memory.max_bytes) is mapped already; unregister regions first")
	s.Close()
}

// An mmap the address space has no room for (ENOMEM under RLIMIT_AS) is a
// 400 saying so, not the end of the server: a child test process under
// prlimit --as registers a sparse object larger than its cap, its bound
// left at 16 GiB.
func TestSharedMemoryMapFailureIsARefusal(t *testing.T) {
	if os.Getenv("SHM_ENOMEM_CHILD") != "" {
		s := New(0, 0, nil)
		err := s.Register("big", os.Getenv("SHM_ENOMEM_CHILD"), 0, 4<<30)
		fmt.Printf("%d %v", statusOf(err), err)
		return
	}
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("no prlimit")
	}
	key, _ := shmObject(t, 4<<30) // sparse: no memory
	cmd := exec.Command("prlimit", "--as=3221225472", "--", os.Args[0], "-test.run=^TestSharedMemoryMapFailureIsARefusal$")
	cmd.Env = append(os.Environ(), "SHM_ENOMEM_CHILD="+key)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.True(t, strings.HasPrefix(string(out), "400 failed to register shared memory region 'big': mapping 4 GiB of /dev/shm/"), "%s", out)
	assert.Contains(t, string(out), "the server's address space has no room for it (cannot allocate memory: its RLIMIT_AS or vm.max_map_count is reached); unregister regions first")
}

// statusOf is the HTTP status a refusal carries (the core maps it, and
// to gRPC's codes: core's TestSharedMemoryRefusalsKeepTheirStatus).
func statusOf(err error) int {
	var e *apierr.Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}
