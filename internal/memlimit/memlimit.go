// Package memlimit says how much memory this process may use: the
// smallest of its cgroup's memory limit, its address-space limit
// (RLIMIT_AS) and the machine's physical memory. Budgets that must hold
// before anything is allocated (a model's load) are taken from it.
package memlimit

import (
	"os"
	"strconv"
	"strings"
)

// Limit is a memory limit and what sets it.
type Limit struct {
	Bytes int64
	// Source names what sets it: "cgroup memory.max", "RLIMIT_AS" or
	// "physical memory"; empty when nothing could be read.
	Source string
}

// Read returns the process's memory limit; Bytes is 0 when none could be
// read.
func Read() Limit {
	var l Limit
	consider := func(n int64, source string) {
		if n > 0 && (l.Bytes == 0 || n < l.Bytes) {
			l = Limit{n, source}
		}
	}
	consider(cgroupLimit(), "cgroup memory.max")
	consider(addressSpaceLimit(), "RLIMIT_AS")
	consider(physicalMemory(), "physical memory")
	return l
}

// cgroupLimit reads cgroup v2's memory.max, or v1's
// memory.limit_in_bytes, of the cgroup the process sees as its root (a
// container's own); 0 when there is none.
func cgroupLimit() int64 {
	for _, path := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		// v1 reports "no limit" as a huge page-aligned number.
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0
		}
		return n
	}
	return 0
}
