// Package memlimit says how much memory this process may use: the
// smallest of its cgroup's memory limit (v2 or v1, on its cgroup or a
// parent), the address space RLIMIT_AS leaves it, and the machine's RAM.
// The budgets that must hold before anything is allocated (the requests in
// flight, the models resident) are taken from it.
package memlimit

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	runtimemetrics "runtime/metrics"
	"strconv"
	"strings"

	"github.com/stepserve/stepserve/internal/bytesize"
)

// Limit is a memory limit and what sets it.
type Limit struct {
	Bytes int64
	// Source says where the figure comes from; empty when nothing could
	// be read.
	Source string
}

// Read returns the memory this process may use: the smallest of the
// cgroup's limit (v2 memory.max or v1 memory.limit_in_bytes, of the
// process's cgroup and its parents), half the address space RLIMIT_AS
// leaves to the Go runtime (the limit less what is mapped outside it now:
// libc, the runtime's own reservations, thread stacks; half, because each
// thread started later maps its stack and, in a cgo build, a malloc
// arena), and the machine's RAM. It reads /proc and /sys; Bytes is 0 when
// none of them says.
func Read() Limit {
	sample := []runtimemetrics.Sample{{Name: "/memory/classes/total:bytes"}}
	runtimemetrics.Read(sample)
	var goMapped int64
	if sample[0].Value.Kind() == runtimemetrics.KindUint64 {
		goMapped = int64(sample[0].Value.Uint64())
	}
	n, source := memoryLimit(os.DirFS("/"), addressSpaceLimit(), goMapped)
	return Limit{n, source}
}

// memoryLimit is Read reading the files under root, with the
// RLIMIT_AS given (0: none) and the bytes the Go runtime has mapped.
func memoryLimit(root fs.FS, rlimitAS uint64, goMapped int64) (int64, string) {
	var limit int64
	var source string
	consider := func(n int64, from string) {
		if n > 0 && (limit == 0 || n < limit) {
			limit, source = n, from
		}
	}
	if kb, ok := procField(root, "proc/meminfo", "MemTotal"); ok {
		consider(kb<<10, "physical memory (MemTotal)")
	}
	if kb, ok := procField(root, "proc/self/status", "VmSize"); ok && rlimitAS > 0 {
		// Half what is left: each thread the runtime starts later maps its
		// stack, and in a cgo-linked build a 64 MiB malloc arena.
		other := max(kb<<10-goMapped, 0)
		consider((int64(rlimitAS)-other)/2, fmt.Sprintf("half the address space RLIMIT_AS (%s) leaves beside the %s mapped outside the Go runtime",
			bytesize.Format(int64(rlimitAS)), bytesize.Format(other)))
	}
	n, from := cgroupLimit(root)
	consider(n, from)
	return limit, source
}

// cgroupLimit is the smallest memory limit set on the process's cgroup or
// its parents, v2 or v1; 0 when none is set.
func cgroupLimit(root fs.FS) (int64, string) {
	b, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return 0, ""
	}
	var limit int64
	var source string
	walk := func(base, file, cg string) {
		for dir := path.Clean("/" + cg); ; dir = path.Dir(dir) {
			p := path.Join(base, dir, file)
			if v, err := fs.ReadFile(root, p); err == nil {
				n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
				if err == nil && n > 0 && n < 1<<62 && (limit == 0 || n < limit) { // "max" and v1's huge "unlimited" are none
					limit, source = n, "cgroup /"+p
				}
			}
			if dir == "/" {
				return
			}
		}
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			walk("sys/fs/cgroup", "memory.max", parts[2])
		case strings.Contains(","+parts[1]+",", ",memory,"):
			walk("sys/fs/cgroup/memory", "memory.limit_in_bytes", parts[2])
		}
	}
	return limit, source
}

// procField reads a "Key: 123 kB" line of a /proc file, in kB.
func procField(root fs.FS, file, key string) (int64, bool) {
	f, err := root.Open(file)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), key+":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		return n, err == nil
	}
	return 0, false
}
