// Package memlimit says how much memory this process may use: the
// smallest of its cgroup's memory limit (v2 or v1, on its cgroup or a
// parent), the address space RLIMIT_AS leaves it, and the machine's RAM.
// The budgets that must hold before anything is allocated (the requests in
// flight, the models resident) are taken from it, and, under RLIMIT_AS,
// the address space left to what is mapped outside the heap
// ([Limit.SharedMemoryShare]).
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

	// RLimitAS is the address-space limit (RLIMIT_AS); Outside is what
	// was mapped outside the Go runtime when it was read (libc, the
	// runtime's reservations, thread stacks); AddressSpace is what the
	// limit leaves beside it. All three are 0 when there is no RLIMIT_AS
	// (or the process's size could not be read). The heap is planned on
	// at most half of AddressSpace (Bytes), clients' shared memory on a
	// quarter ([Limit.SharedMemoryShare]), and the last quarter is what
	// the process maps as it runs: each new thread's stack, malloc's
	// arenas, the heap past its soft limit.
	RLimitAS, Outside, AddressSpace int64
}

// SharedMemoryShare is the address space that mappings made at clients'
// request (Triton's system shared-memory regions) may take together under
// RLIMIT_AS: a quarter of what it leaves beside what is mapped outside the
// Go runtime, so that the heap's half, the regions and the threads'
// quarter all fit under the limit. It means nothing without RLIMIT_AS
// ([Limit.AddressSpaceCapped] false): then it is 0, and the regions are
// bounded by configuration alone.
func (l Limit) SharedMemoryShare() int64 { return l.AddressSpace / 4 }

// AddressSpaceCapped reports whether RLIMIT_AS applies, and the address
// space it leaves is known.
func (l Limit) AddressSpaceCapped() bool { return l.RLimitAS > 0 }

// AddressSpaceSource says where AddressSpace comes from, for messages.
func (l Limit) AddressSpaceSource() string {
	return fmt.Sprintf("the address space RLIMIT_AS (%s) leaves beside the %s mapped outside the Go runtime",
		bytesize.Format(l.RLimitAS), bytesize.Format(l.Outside))
}

// Read returns the memory this process may use: the smallest of the
// cgroup's limit (v2 memory.max or v1 memory.limit_in_bytes, of the
// process's cgroup and its parents), half the address space RLIMIT_AS
// leaves to the Go runtime (the limit less what is mapped outside it now:
// libc, the runtime's own reservations, thread stacks; half, because each
// thread started later maps its stack and, in a cgo build, a malloc
// arena, and clients' shared memory has a quarter), and the machine's RAM. It reads /proc and /sys; Bytes is 0 when
// none of them says.
func Read() Limit {
	sample := []runtimemetrics.Sample{{Name: "/memory/classes/total:bytes"}}
	runtimemetrics.Read(sample)
	var goMapped int64
	if sample[0].Value.Kind() == runtimemetrics.KindUint64 {
		goMapped = int64(sample[0].Value.Uint64())
	}
	return memoryLimit(os.DirFS("/"), addressSpaceLimit(), goMapped)
}

// memoryLimit is Read reading the files under root, with the
// RLIMIT_AS given (0: none) and the bytes the Go runtime has mapped.
func memoryLimit(root fs.FS, rlimitAS uint64, goMapped int64) Limit {
	var l Limit
	consider := func(n int64, from string) {
		if n > 0 && (l.Bytes == 0 || n < l.Bytes) {
			l.Bytes, l.Source = n, from
		}
	}
	if kb, ok := procField(root, "proc/meminfo", "MemTotal"); ok {
		consider(kb<<10, "physical memory (MemTotal)")
	}
	if kb, ok := procField(root, "proc/self/status", "VmSize"); ok && rlimitAS > 0 {
		// Half what is left: each thread the runtime starts later maps its
		// stack, and in a cgo-linked build a 64 MiB malloc arena; shared
		// memory clients register takes a quarter (SharedMemoryShare).
		l.RLimitAS = int64(min(rlimitAS, 1<<62))
		l.Outside = max(kb<<10-goMapped, 0)
		l.AddressSpace = max(l.RLimitAS-l.Outside, 0)
		consider(l.AddressSpace/2, "half "+l.AddressSpaceSource())
	}
	n, from := cgroupLimit(root)
	consider(n, from)
	return l
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
