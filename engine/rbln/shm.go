package rbln

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// staging is one program's shared memory: an anonymous memfd that holds
// every bucket's input and output buffer, each at a page boundary, mapped
// here and passed to the worker over the control socket with the load. It
// has no name in any filesystem, so nothing of it outlives the processes
// that map it, however they end. Tensor data crosses between the two
// processes through it without a copy.
type staging struct {
	f    *os.File
	data []byte
}

// region is one buffer's place in a staging.
type region struct{ offset, size int }

// layoutStaging places buffers of the given sizes one after another, each
// at a page boundary (the worker maps the whole memory once, but a page of
// its own per buffer keeps a stray write from reaching the next).
func layoutStaging(sizes []int) (regions []region, total int) {
	page := os.Getpagesize()
	for _, n := range sizes {
		regions = append(regions, region{offset: total, size: n})
		total += (n + page - 1) / page * page
	}
	return regions, total
}

// newStaging creates and maps size bytes of shared memory; name shows in
// /proc/<pid>/fd as memfd:<name>.
func newStaging(name string, size int) (*staging, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("rbln: staging memory %s: memfd_create: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	n := max(size, 1) // mmap refuses empty mappings
	if err := f.Truncate(int64(n)); err != nil {
		f.Close()
		return nil, fmt.Errorf("rbln: staging memory %s: %w", name, err)
	}
	data, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("rbln: mapping staging memory %s: %w", name, err)
	}
	return &staging{f: f, data: data}, nil
}

// buffer is r's bytes, which cannot be appended into the next buffer.
func (s *staging) buffer(r region) []byte {
	return s.data[r.offset : r.offset+r.size : r.offset+r.size]
}

// close unmaps the memory and closes the memfd; once is enough, and a
// second call does nothing.
func (s *staging) close() error {
	if s.data == nil {
		return nil
	}
	err := unix.Munmap(s.data)
	s.data = nil
	s.f.Close()
	return err
}
