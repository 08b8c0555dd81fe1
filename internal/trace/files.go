package trace

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Store is the directory of trace files: at most maxFiles of them, the
// oldest deleted first. It knows the files it wrote, and, from its first
// use, those an earlier run left there.
type Store struct {
	dir      string
	maxFiles int

	mu      sync.Mutex
	scanned bool
	files   []FileInfo // oldest first
	next    map[string]int
}

func newStore(dir string, maxFiles int) *Store {
	return &Store{dir: dir, maxFiles: maxFiles, next: map[string]int{}}
}

// ErrNoFile is returned for a trace file name that is not in the store.
var ErrNoFile = errors.New("trace: no such trace file")

// ErrBadName is returned for a name that is not a trace file's.
var ErrBadName = errors.New("trace: not a trace file name")

// validName reports whether name is one the store could have written: a
// plain name ending .json, no path.
func validName(name string) bool {
	return strings.HasSuffix(name, ".json") && len(name) <= 128 && fileName.MatchString(name)
}

// List returns the trace files, newest first.
func (s *Store) List() ([]FileInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.scan(); err != nil {
		return nil, err
	}
	out := slices.Clone(s.files)
	slices.Reverse(out)
	return out, nil
}

// Open opens the trace file name for reading; ErrBadName for a name that
// is not a trace file's (a path, a traversal), ErrNoFile for one it does
// not hold.
func (s *Store) Open(name string) (*os.File, FileInfo, error) {
	if !validName(name) {
		return nil, FileInfo{}, ErrBadName
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.scan(); err != nil {
		return nil, FileInfo{}, err
	}
	i := slices.IndexFunc(s.files, func(f FileInfo) bool { return f.Name == name })
	if i < 0 {
		return nil, FileInfo{}, ErrNoFile
	}
	f, err := os.Open(filepath.Join(s.dir, name))
	if errors.Is(err, os.ErrNotExist) {
		s.files = slices.Delete(s.files, i, i+1)
		return nil, FileInfo{}, ErrNoFile
	}
	return f, s.files[i], err
}

// scan reads the directory once: the trace files an earlier run left.
// Called with s.mu held.
func (s *Store) scan() error {
	if s.scanned {
		return nil
	}
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, os.ErrNotExist) {
		s.scanned = true
		return nil
	}
	if err != nil {
		return fmt.Errorf("trace: reading trace.dir %s: %w", s.dir, err)
	}
	for _, d := range entries {
		if !d.Type().IsRegular() || !validName(d.Name()) {
			continue
		}
		info, err := d.Info()
		if err != nil {
			continue
		}
		fi := readInfo(filepath.Join(s.dir, d.Name()))
		fi.Name, fi.Size = d.Name(), info.Size()
		if fi.Created.IsZero() {
			fi.Created = info.ModTime().UTC()
		}
		s.files = append(s.files, fi)
		s.noteIndex(d.Name())
	}
	slices.SortStableFunc(s.files, func(a, b FileInfo) int { return a.Created.Compare(b.Created) })
	s.scanned = true
	s.prune()
	return nil
}

// readInfo reads the stepserve block at the head of a trace file; zero
// fields where it has none.
func readInfo(path string) FileInfo {
	f, err := os.Open(path)
	if err != nil {
		return FileInfo{}
	}
	defer f.Close()
	var head struct {
		OtherData struct {
			Stepserve FileInfo `json:"stepserve"`
		} `json:"otherData"`
	}
	d := json.NewDecoder(io.LimitReader(f, 8<<10))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return FileInfo{}
	}
	if tok, err := d.Token(); err != nil || tok != "otherData" {
		return FileInfo{}
	}
	if err := d.Decode(&head.OtherData); err != nil {
		return FileInfo{}
	}
	return head.OtherData.Stepserve
}

// noteIndex keeps the next free index of name's prefix (prefix.N.json).
func (s *Store) noteIndex(name string) {
	base := strings.TrimSuffix(name, ".json")
	dot := strings.LastIndexByte(base, '.')
	if dot < 0 {
		return
	}
	if n, err := strconv.Atoi(base[dot+1:]); err == nil && n >= 0 {
		s.next[base[:dot]] = max(s.next[base[:dot]], n+1)
	}
}

// prune deletes the oldest files past maxFiles. Called with s.mu held.
func (s *Store) prune() {
	for len(s.files) > s.maxFiles {
		os.Remove(filepath.Join(s.dir, s.files[0].Name))
		s.files = s.files[1:]
	}
}

// write stores data as prefix.N.json (N the next free index of prefix),
// whole or not at all, and deletes the oldest files past the bound.
func (s *Store) write(prefix string, data []byte, info FileInfo) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.MkdirAll(s.dir, 0o750); err != nil {
		return "", fmt.Errorf("trace: creating trace.dir: %w", err)
	}
	if s.dir == defaultDir() {
		// A directory under the shared temp directory that another user
		// made first (or a link) is not ours to write traces into.
		st, err := os.Lstat(s.dir)
		if err != nil {
			return "", fmt.Errorf("trace: %w", err)
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); !st.IsDir() || ok && int(sys.Uid) != os.Getuid() {
			return "", fmt.Errorf("trace: %s is not a directory of this user's; set trace.dir", s.dir)
		}
	}
	if err := s.scan(); err != nil {
		return "", err
	}
	n := s.next[prefix]
	name := prefix + "." + strconv.Itoa(n) + ".json"
	if !validName(name) {
		return "", fmt.Errorf("trace: file name %q is too long", name)
	}
	tmp, err := os.CreateTemp(s.dir, ".writing-*")
	if err != nil {
		return "", fmt.Errorf("trace: %w", err)
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(s.dir, name))
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("trace: writing %s: %w", name, err)
	}
	s.next[prefix] = n + 1
	info.Name, info.Size = name, int64(len(data))
	if info.Created.IsZero() {
		info.Created = time.Now().UTC()
	}
	s.files = slices.DeleteFunc(s.files, func(f FileInfo) bool { return f.Name == name })
	s.files = append(s.files, info)
	s.prune()
	return name, nil
}
