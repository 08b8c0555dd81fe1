package rbln

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// staging is one shared-memory buffer: a file in /dev/shm that Go creates
// and maps, and the worker maps by path. Tensor data crosses between the
// two processes through it without a copy.
type staging struct {
	path string
	data []byte
}

// shmDir is where staging files live: tmpfs where the system has one.
func shmDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

func newStaging(dir, name string, size int) (*staging, error) {
	f, err := os.CreateTemp(dir, name+"-*")
	if err != nil {
		return nil, fmt.Errorf("rbln: staging buffer: %w", err)
	}
	defer f.Close()
	n := max(size, 1) // mmap refuses empty mappings
	if err := f.Truncate(int64(n)); err != nil {
		os.Remove(f.Name())
		return nil, fmt.Errorf("rbln: staging buffer %s: %w", f.Name(), err)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(f.Name())
		return nil, fmt.Errorf("rbln: mapping staging buffer %s: %w", f.Name(), err)
	}
	return &staging{path: f.Name(), data: data[:size]}, nil
}

func (s *staging) close() error {
	err := syscall.Munmap(s.data[:max(cap(s.data), 1)])
	os.Remove(s.path)
	return err
}

func stagingName(model string, bucket int, dir string) string {
	return filepath.Base(fmt.Sprintf("stepserve-%d-%s-%d-%s", os.Getpid(), model, bucket, dir))
}
