package models

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"
)

// The most bytes read from a model directory's small files: a model.yaml
// is a page of keys, a vocab.txt a few megabytes even for multilingual
// vocabularies. A weights file is bounded by the memory limit its header
// is checked against before its data is read.
const (
	maxConfigBytes = 1 << 20
	maxVocabBytes  = 16 << 20
)

// ErrNoModel is wrapped by the error of a model directory that does not
// exist or holds no model.yaml.
var ErrNoModel = errors.New("models: no such model")

// repoFile is one file of a model repository, opened for reading through
// an [os.Root] (so that no name or symbolic link leads out of the
// repository) and checked to be a regular file: opening a FIFO or a
// device never blocks, and neither is read. Name is the file's path in the
// repository, which is how errors name it.
type repoFile struct {
	*os.File
	Name string
	Size int64
}

// openFile opens name (a slash-separated path in the repository, as
// "digits/model.yaml") in root, refusing anything but a regular file of at
// most limit bytes (no limit when limit is 0). Errors name the file by
// name, never by its absolute path.
func openFile(root *os.Root, name string, limit int64) (*repoFile, error) {
	// O_NONBLOCK: opening a FIFO for reading waits for a writer; with it,
	// the open returns at once and fstat tells what the file is.
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fileError(root, name, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, unwrapPath(err))
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file (%s); a model's files must be regular files", name, kind(st.Mode()))
	}
	if limit > 0 && st.Size() > limit {
		f.Close()
		return nil, fmt.Errorf("%s: larger than the %d-byte limit (%d bytes)", name, limit, st.Size())
	}
	return &repoFile{File: f, Name: name, Size: st.Size()}, nil
}

// readFile reads the whole of name, a regular file of at most limit bytes.
func readFile(root *os.Root, name string, limit int64) ([]byte, error) {
	f, err := openFile(root, name, limit)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// The size is fstat's; the read is bounded again in case the file
	// grows under us.
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, unwrapPath(err))
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than the %d-byte limit", name, limit)
	}
	return b, nil
}

// statFile checks name as openFile does, without keeping it open; it
// reports false when the file does not exist.
func statFile(root *os.Root, name string, limit int64) (bool, error) {
	f, err := openFile(root, name, limit)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	f.Close()
	return true, nil
}

// fileError says why name could not be opened, naming it as the
// repository does: a symbolic link out of the repository is named as such,
// and the error wraps fs.ErrNotExist when the file is missing.
func fileError(root *os.Root, name string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: %w", name, fs.ErrNotExist)
	case errors.Is(err, syscall.ELOOP):
		return fmt.Errorf("%s: a loop of symbolic links", name)
	}
	// os.Root refuses a path that resolves outside it; find the link that
	// does, the file's or its directory's.
	for p := name; p != "." && p != "/"; p = path.Dir(p) {
		if st, lerr := root.Lstat(p); lerr == nil && st.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%s: a symbolic link out of the model repository; links must stay inside it", p)
		}
	}
	return fmt.Errorf("%s: %w", name, unwrapPath(err))
}

// unwrapPath drops the path an *fs.PathError carries (which may be
// absolute) and keeps what went wrong.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	default:
		return "mode " + m.String()
	}
}
