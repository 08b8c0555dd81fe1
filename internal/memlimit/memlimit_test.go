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
		os.Stdout.WriteString(strconv.FormatInt(l.Bytes, 10) + " " + l.Source)
		return
	}
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("no prlimit")
	}
	cmd := exec.Command("prlimit", "--as=3221225472", "--", os.Args[0], "-test.run=^TestAddressSpaceLimit$")
	cmd.Env = append(os.Environ(), "MEMLIMIT_CHILD=1")
	out, err := cmd.Output()
	require.NoError(t, err)
	var n int64
	var source string
	_, err = fmt.Sscan(string(out), &n, &source)
	require.NoError(t, err, "child said %q", out)
	assert.Positive(t, n)
	assert.LessOrEqual(t, n, int64(3<<30), "the cap bounds the limit (%s)", source)
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
		got, source := memoryLimit(c.files, c.as, 100<<20)
		assert.Equal(t, c.want, got, c.name)
		assert.Contains(t, source, c.source, c.name)
	}
	l := Read()
	assert.Positive(t, l.Bytes, "this machine has a memory limit")
	assert.NotEmpty(t, l.Source)
	t.Logf("memory limit here: %s (%s)", strconv.FormatInt(l.Bytes>>20, 10)+" MiB", l.Source)
}
