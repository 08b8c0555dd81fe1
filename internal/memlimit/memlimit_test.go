package memlimit

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAddressSpaceLimit runs the test binary again under prlimit --as: the
// limit it reads is the cap.
func TestAddressSpaceLimit(t *testing.T) {
	if os.Getenv("MEMLIMIT_CHILD") != "" {
		l := Read()
		os.Stdout.WriteString(strconv.FormatInt(l.Bytes, 10) + " " + strconv.FormatInt(l.SharedMemoryShare(), 10) + " " + l.Source)
		return
	}
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("no prlimit")
	}
	cmd := exec.Command("prlimit", "--as=3221225472", "--", os.Args[0], "-test.run=^TestAddressSpaceLimit$")
	cmd.Env = append(os.Environ(), "MEMLIMIT_CHILD=1")
	out, err := cmd.Output()
	require.NoError(t, err)
	var n, share int64
	var source string
	_, err = fmt.Sscan(string(out), &n, &share, &source)
	require.NoError(t, err, "child said %q", out)
	assert.Positive(t, n)
	assert.LessOrEqual(t, n, int64(3<<30), "the cap bounds the limit (%s)", source)
	assert.Positive(t, share, "shared memory has a share of the capped address space")
	assert.LessOrEqual(t, share, int64(3<<30)/4)
}

func TestMemoryLimit(t *testing.T) {
	const gib = 1 << 30
	meminfo := &fstest.MapFile{Data: []byte("MemTotal:       16384000 kB\nMemFree: 1 kB\n")}
	status := &fstest.MapFile{Data: []byte("Name: stepserve\nVmSize:  1843200 kB\nVmRSS: 20480 kB\n")}
	cases := []struct {
		name   string
		files  fstest.MapFS
		as     uint64
		want   int64
		source string
	}{
		{"RAM", fstest.MapFS{"proc/meminfo": meminfo}, 0, 16384000 << 10, "MemTotal"},
		{"cgroup v2, set on a parent", fstest.MapFS{"proc/meminfo": meminfo,
			"proc/self/cgroup":                          {Data: []byte("0::/kubepods/pod1/c1\n")},
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max": {Data: []byte("max\n")},
			"sys/fs/cgroup/kubepods/pod1/memory.max":    {Data: []byte("4294967296\n")},
			"sys/fs/cgroup/memory.max":                  {Data: []byte("8589934592\n")},
		}, 0, 4 * gib, "cgroup /sys/fs/cgroup/kubepods/pod1/memory.max"},
		{"cgroup v1", fstest.MapFS{"proc/meminfo": meminfo,
			"proc/self/cgroup": {Data: []byte("4:memory:/docker/abc\n3:cpu:/\n")},
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": {Data: []byte("2147483648\n")},
			"sys/fs/cgroup/memory/memory.limit_in_bytes":            {Data: []byte("9223372036854771712\n")},
		}, 0, 2 * gib, "memory.limit_in_bytes"},
		{"RLIMIT_AS: half what the mapped space leaves", fstest.MapFS{"proc/meminfo": meminfo, "proc/self/status": status},
			2 * gib, (2*gib - (1843200<<10 - 100<<20)) / 2, "RLIMIT_AS"},
	}
	for _, c := range cases {
		got := memoryLimit(c.files, c.as, 100<<20)
		assert.Equal(t, c.want, got.Bytes, c.name)
		assert.Contains(t, got.Source, c.source, c.name)
	}
	l := Read()
	assert.Positive(t, l.Bytes, "this machine has a memory limit")
	assert.Equal(t, l.AddressSpaceCapped(), l.RLimitAS > 0)
	assert.NotEmpty(t, l.Source)
	t.Logf("memory limit here: %s (%s)", strconv.FormatInt(l.Bytes>>20, 10)+" MiB", l.Source)
}

// TestMemlimitSharedMemoryShare: under RLIMIT_AS, shared memory's share is
// a quarter of what the limit leaves beside the mapped space, the heap's
// plan half of it (or less, under a smaller cgroup limit), so both fit
// with a quarter to spare; without RLIMIT_AS there is no share.
func TestMemlimitSharedMemoryShare(t *testing.T) {
	const gib = 1 << 30
	meminfo := &fstest.MapFile{Data: []byte("MemTotal:       16384000 kB\n")}
	status := &fstest.MapFile{Data: []byte("Name: stepserve\nVmSize:  1572864 kB\n")} // 1.5 GiB, 200 MiB of it the Go runtime's
	files := fstest.MapFS{"proc/meminfo": meminfo, "proc/self/status": status}

	l := memoryLimit(files, 4*gib, 200<<20)
	assert.True(t, l.AddressSpaceCapped())
	assert.Equal(t, int64(4*gib), l.RLimitAS)
	assert.Equal(t, int64(1536-200)<<20, l.Outside)
	left := int64(4*gib - (1536-200)<<20)
	assert.Equal(t, left, l.AddressSpace)
	assert.Equal(t, left/2, l.Bytes, "the heap's plan is half")
	assert.Equal(t, left/4, l.SharedMemoryShare(), "shared memory's a quarter")
	assert.LessOrEqual(t, l.Outside+l.Bytes+l.SharedMemoryShare(), int64(4*gib)-left/4, "a quarter left for threads and arenas")
	assert.Equal(t, "the address space RLIMIT_AS (4 GiB) leaves beside the 1.3 GiB mapped outside the Go runtime", l.AddressSpaceSource())

	// A cgroup limit below half lowers the heap's plan, not the share.
	cg := fstest.MapFS{"proc/meminfo": meminfo, "proc/self/status": status,
		"proc/self/cgroup": {Data: []byte("0::/c\n")}, "sys/fs/cgroup/c/memory.max": {Data: []byte("536870912\n")}}
	l = memoryLimit(cg, 4*gib, 200<<20)
	assert.Equal(t, int64(512<<20), l.Bytes)
	assert.Equal(t, left/4, l.SharedMemoryShare())

	// No RLIMIT_AS, or no size to take from it: no share.
	for _, l := range []Limit{memoryLimit(files, 0, 200<<20), memoryLimit(fstest.MapFS{"proc/meminfo": meminfo}, 4*gib, 200<<20)} {
		assert.False(t, l.AddressSpaceCapped())
		assert.Zero(t, l.SharedMemoryShare())
		assert.Equal(t, int64(16384000<<10), l.Bytes)
	}
	// Mapped past the limit already: a share of nothing, not a negative one.
	l = memoryLimit(files, gib, 200<<20)
	assert.True(t, l.AddressSpaceCapped())
	assert.Zero(t, l.SharedMemoryShare())
}
