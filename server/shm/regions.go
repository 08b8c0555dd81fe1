// Package shm is the registry of Triton's system shared-memory
// extension: a client on the same host puts a tensor in a POSIX
// shared-memory object, registers a range of it as a named region, and
// names the region in the tensor's parameters instead of sending the data
// (server/core's sharedmemory_tensor.go reads them). The server maps the
// range when it is registered and keeps it mapped until it is
// unregistered, or the server closes; a request holds the regions it
// names while it runs. Both Triton doors (HTTP, server/admin; gRPC,
// server/grpcapi) register and unregister through it. It imports no part
// of server/ but apierr.
package shm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stepserve/stepserve/internal/bytesize"
	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/internal/memlimit"
	"github.com/stepserve/stepserve/server/apierr"
)

// sharedMemoryDir is where Linux keeps POSIX shared-memory objects:
// shm_open(key) opens sharedMemoryDir/key, the key's leading slash left
// off.
const sharedMemoryDir = "/dev/shm"

// The limits on what clients may have mapped at once, for a server whose
// Options leave them zero. Under RLIMIT_AS the bytes are bounded by a
// share of the address space too ([Bound]).
const (
	DefaultMaxRegions = 64
	DefaultMaxBytes   = 16 << 30
)

// Bound is the most bytes of system shared memory the server
// maps at once: configured (server.shared_memory.max_bytes; 0:
// [DefaultMaxBytes]), or, under RLIMIT_AS, shared memory's
// share of the address space the limit leaves
// ([memlimit.Limit.SharedMemoryShare]: a quarter) where that is less. The
// heap's plan (the memory limit, the in-flight budget, the models') is
// taken from the same address space, and a region is mapped whole, sparse
// or not: without the share, regions registered up to the configured bound
// took the address space the heap grows into, and the next requests ended
// the server ("fatal error: out of memory"). from is empty when the bound
// is configured, and otherwise says where it comes from, for the refusals
// and the log.
func Bound(configured int64, l memlimit.Limit) (bound int64, from string) {
	if configured <= 0 {
		configured = DefaultMaxBytes
	}
	if share := l.SharedMemoryShare(); l.AddressSpaceCapped() && share < configured {
		return share, fmt.Sprintf("a quarter of %s, below server.shared_memory.max_bytes (%s)", l.AddressSpaceSource(), bytesize.Format(configured))
	}
	return configured, ""
}

// CUDAInstead is what to use instead of Triton's CUDA
// shared-memory extension, which stepserve does not implement (501 over
// HTTP, UNIMPLEMENTED over gRPC).
const CUDAInstead = "use system shared memory (/v2/systemsharedmemory, gRPC SystemSharedMemory*), or send tensors in the request, as JSON or binary tensor data (binary_tensor_data)"

// maxRegionName bounds a region's name; a key is bounded by the
// filesystem's NAME_MAX.
const (
	maxRegionName = 128
	maxKeyName    = 255
)

// reservedKeyPrefixes are shared-memory objects that belong to other
// programs on the host and are never a client's tensors: POSIX named
// semaphores (sem_open keeps them as sem.NAME) and torch's shared tensors,
// which the torch workers may hold. Mapping them would let a client read
// or write another process's memory.
var reservedKeyPrefixes = []string{"sem.", "torch_"}

// tmpfsMagic is tmpfs's f_type: a registered object must be in memory, so
// that no file on a disk is ever mapped, whatever links /dev/shm holds.
const tmpfsMagic = 0x01021994

// Regions is the system shared-memory regions clients registered,
// by name, each a range of a POSIX shared-memory object mapped read-write.
//
// A request holds the regions its tensors name while it runs ([Call.Infer]):
// it copies its inputs out before the step and its outputs in after. A
// region unregistered while requests hold it leaves the name table at once
// (a new request naming it is refused, and the name may be registered
// again), and stays mapped until the last request holding it lets go:
// memory a request reads or writes is never unmapped under it.
// [Regions.Unregister] waits for that before it returns, so that once
// it has answered the server no longer touches the memory.
//
// It is safe for concurrent use.
type Regions struct {
	maxRegions int
	maxBytes   int64
	maxFrom    string // where maxBytes comes from when not the key ([Bound])
	logger     *slog.Logger
	disabled   bool // server.shared_memory.enabled: false

	mu      sync.Mutex
	regions map[string]*Region
	mapped  int64 // the live mappings' bytes, those unregistered but still held included
	closed  bool
}

// Region is one registered region and its mapping.
type Region struct {
	name, key    string
	offset, size int64
	mapping      []byte // from the page at or below offset
	cost         int64  // the address space mapping takes: whole pages
	data         []byte // the region: the object's [offset, offset+size)

	// Guarded by Regions.mu.
	users        int  // requests holding it
	unregistered bool // out of the name table; unmapped once users is 0
	unmapped     chan struct{}
}

// New is an empty set of regions that holds at most
// maxRegions regions and maxBytes of mappings at once (0: the defaults).
func New(maxRegions int, maxBytes int64, logger *slog.Logger) *Regions {
	if maxRegions <= 0 {
		maxRegions = DefaultMaxRegions
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Regions{maxRegions: maxRegions, maxBytes: maxBytes, logger: logger, regions: map[string]*Region{}}
}

// CapAddressSpace lowers the bytes s maps at once to shared memory's
// share of the address space RLIMIT_AS leaves, where that is less
// ([Bound]), and logs it; before any region is registered.
func (s *Regions) CapAddressSpace(l memlimit.Limit) {
	configured := s.maxBytes
	bound, from := Bound(configured, l)
	if from == "" {
		return
	}
	s.maxBytes, s.maxFrom = bound, from
	s.logger.Info("system shared memory bounded by the address space RLIMIT_AS leaves: registrations past it are refused",
		"max_bytes", bytesize.Format(bound), "server.shared_memory.max_bytes", bytesize.Format(configured),
		"rlimit_as", bytesize.Format(l.RLimitAS), "from", from)
}

// bound says, in a refusal that names the bytes s maps at most, where the
// figure comes from: the key, in parentheses after it, or the address
// space, at the end; then what the client can do, todo (if anything), and
// what the operator can.
func (s *Regions) bound(todo string) (key, end string) {
	if s.maxFrom == "" {
		if todo != "" {
			end = "; " + todo
		}
		return " (server.shared_memory.max_bytes)", end
	}
	if todo != "" {
		todo += ", or "
	}
	return "", fmt.Sprintf("; the %s is %s: %sraise RLIMIT_AS to map more", bytesize.Format(s.maxBytes), s.maxFrom, todo)
}

// RegionStatus is a registered region, as Triton's status endpoint
// reports it.
type RegionStatus struct {
	Name     string `json:"name"`
	Key      string `json:"key"`
	Offset   int64  `json:"offset"`
	ByteSize int64  `json:"byte_size"`
}

// regionExistsError is a name registered already: 400 over HTTP and
// ALREADY_EXISTS over gRPC, as Triton answers.
type regionExistsError struct{ err *apierr.Error }

func (e regionExistsError) Error() string { return e.err.Msg }
func (e regionExistsError) Unwrap() error { return e.err }
func (e regionExistsError) GRPCStatus() *status.Status {
	return status.New(codes.AlreadyExists, e.err.Msg)
}

// quoteRegion writes a region's name in a message as Triton does
// ('name'), or quoted and clipped when it is not a valid name.
func quoteRegion(name string) string {
	if checkRegionName(name) == nil {
		return "'" + name + "'"
	}
	return strconv.Quote(clip.Clip(name, 64))
}

// checkRegionName accepts 1 to 128 printable ASCII characters but '/' and
// '\': a name travels in a URL's path and in JSON, and every message that
// names it quotes it whole.
func checkRegionName(name string) error {
	if name == "" || len(name) > maxRegionName {
		return fmt.Errorf("a shared memory region's name is 1 to %d characters, got %d", maxRegionName, len(name))
	}
	for i := range len(name) {
		if c := name[i]; c <= ' ' || c > '~' || c == '/' || c == '\\' {
			return fmt.Errorf("shared memory region name %s: use printable ASCII characters but space, '/' and '\\'", strconv.Quote(clip.Clip(name, 64)))
		}
	}
	return nil
}

// keyFile is the name under sharedMemoryDir of the object key names, as
// shm_open finds it: one leading '/' is optional, and what follows is a
// single file name, not "." or "..", and not another program's object
// (reservedKeyPrefixes).
func keyFile(key string) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("key %s: %s", strconv.Quote(clip.Clip(key, 64)), why)
	}
	file := strings.TrimPrefix(key, "/")
	switch {
	case file == "":
		return "", bad("want the name of a POSIX shared-memory object, such as /my_tensors")
	case len(file) > maxKeyName:
		return "", bad(fmt.Sprintf("at most %d characters after its leading '/'", maxKeyName))
	case strings.Contains(file, "/"):
		return "", bad("a key is one name, with no '/' but an optional leading one")
	case strings.Contains(file, ".."):
		return "", bad("a key may not contain \"..\"")
	case strings.ContainsRune(file, 0):
		return "", bad("a key may not contain a NUL byte")
	case file == ".":
		return "", bad("want the name of a POSIX shared-memory object, such as /my_tensors")
	}
	for _, p := range reservedKeyPrefixes {
		if strings.HasPrefix(file, p) {
			return "", bad(fmt.Sprintf("objects named %s... belong to other programs (semaphores, torch's shared tensors) and cannot be registered", p))
		}
	}
	return file, nil
}

// Register maps byteSize bytes at offset of the shared-memory object key
// and registers them as the region name. Its errors are 400s naming the
// region and what was wrong (an existing name is also gRPC's
// ALREADY_EXISTS), or 503 once the server is closing.
func (s *Regions) Register(name, key string, offset, byteSize uint64) error {
	if s.disabled {
		return &apierr.Error{Status: http.StatusNotImplemented, Msg: "failed to register shared memory region: system shared memory is turned off on this server (server.shared_memory.enabled: false); send tensors in the request, as JSON or binary tensor data"}
	}
	if err := checkRegionName(name); err != nil {
		return apierr.BadRequest("failed to register shared memory region: " + err.Error())
	}
	fail := func(format string, args ...any) error {
		return apierr.BadRequest(fmt.Sprintf("failed to register shared memory region '%s': ", name) + fmt.Sprintf(format, args...))
	}
	file, err := keyFile(key)
	if err != nil {
		return fail("%v", err)
	}
	switch {
	case byteSize == 0:
		return fail("byte_size must be at least 1")
	case offset > math.MaxInt64 || byteSize > math.MaxInt64-offset:
		return fail("offset %d + byte_size %d overflows", offset, byteSize)
	}
	off, size := int64(offset), int64(byteSize)
	if size > s.maxBytes {
		// Checked before any rounding: a size near 2^63 would overflow it.
		key, end := s.bound("")
		return fail("byte_size %d is more than the %s the server maps for shared memory%s%s", byteSize, bytesize.Format(s.maxBytes), key, end)
	}
	page := int64(os.Getpagesize())
	pageOff := off / page * page
	mapLen := off - pageOff + size
	cost := (mapLen + page - 1) / page * page // the address space it takes

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return &apierr.Error{Status: http.StatusServiceUnavailable, Msg: fmt.Sprintf("failed to register shared memory region '%s': the server is shutting down", name)}
	case s.regions[name] != nil:
		return regionExistsError{apierr.BadRequest(fmt.Sprintf("shared memory region '%s' already in manager; unregister it first, or register under another name", name))}
	case len(s.regions) >= s.maxRegions:
		return fail("%d regions are registered, the most the server holds (server.shared_memory.max_regions); unregister one first", len(s.regions))
	case cost > s.maxBytes-s.mapped:
		key, end := s.bound("unregister regions first")
		return fail("it would map %s, and %s of the server's %s for shared memory%s is mapped already%s",
			bytesize.Format(cost), bytesize.Format(s.mapped), bytesize.Format(s.maxBytes), key, end)
	}
	mapping, err := mapObject(file, key, pageOff, off, size, mapLen)
	if err != nil {
		return fail("%v", err)
	}
	r := &Region{name: name, key: key, offset: off, size: size, mapping: mapping, cost: cost,
		data: mapping[off-pageOff : off-pageOff+size : off-pageOff+size], unmapped: make(chan struct{})}
	s.regions[name] = r
	s.mapped += cost
	s.logger.Info("shared memory region registered", "name", name, "key", key, "offset", off, "byte_size", size)
	return nil
}

// mapObject opens the object file names under sharedMemoryDir, checks it
// is a regular file in memory of at least off+size bytes, and maps mapLen
// bytes of it from pageOff, read-write and shared.
func mapObject(file, key string, pageOff, off, size, mapLen int64) ([]byte, error) {
	path := sharedMemoryDir + "/" + file
	// O_NOFOLLOW: a symbolic link is refused, not followed out of
	// /dev/shm; O_NONBLOCK: a FIFO cannot hold the open.
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, fmt.Errorf("no shared-memory object %s (key %q): create it (shm_open) before registering it", path, key)
	case errors.Is(err, unix.EISDIR):
		return nil, fmt.Errorf("%s (key %q) is not a regular file", path, key)
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("%s (key %q) is a symbolic link; register the object itself", path, key)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return nil, fmt.Errorf("the server may not read and write %s (key %q): it needs read and write permission", path, key)
	case err != nil:
		return nil, fmt.Errorf("opening %s (key %q): %v", path, key, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat %s: %v", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s (key %q) is not a regular file", path, key)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return nil, fmt.Errorf("fstatfs %s: %v", path, err)
	}
	if fs.Type != tmpfsMagic {
		return nil, fmt.Errorf("%s (key %q) is not in memory (tmpfs); only POSIX shared-memory objects are registered", path, key)
	}
	if st.Size < off || st.Size-off < size {
		return nil, fmt.Errorf("the object %s is %d bytes, but offset %d + byte_size %d needs %d", key, st.Size, off, size, off+size)
	}
	mapping, err := unix.Mmap(fd, pageOff, int(mapLen), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if errors.Is(err, unix.ENOMEM) {
		// Past RLIMIT_AS or vm.max_map_count: the address space is
		// spent, by regions or the heap; nothing was mapped.
		return nil, fmt.Errorf("mapping %s of %s: the server's address space has no room for it (%v: its RLIMIT_AS or vm.max_map_count is reached); unregister regions first", bytesize.Format(mapLen), path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("mapping %d bytes of %s: %v", mapLen, path, err)
	}
	return mapping, nil
}

// Status is every region (name empty), sorted by name, or the one named:
// a 404 when there is none.
func (s *Regions) Status(name string) ([]RegionStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name != "" {
		r := s.regions[name]
		if r == nil {
			return nil, apierr.NotFound("Unable to find system shared memory region: " + quoteRegion(name))
		}
		return []RegionStatus{r.status()}, nil
	}
	out := make([]RegionStatus, 0, len(s.regions))
	for _, r := range s.regions {
		out = append(out, r.status())
	}
	slices.SortFunc(out, func(a, b RegionStatus) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Data is the region's bytes: a request copies its tensors in and out of
// it under [GuardFault] (the object behind it may shrink).
func (r *Region) Data() []byte { return r.data }

// Disable turns the extension off: no region can be registered.
func (s *Regions) Disable() { s.disabled = true }

func (r *Region) status() RegionStatus {
	return RegionStatus{Name: r.name, Key: r.key, Offset: r.offset, ByteSize: r.size}
}

// Unregister removes the region name, or every region when name is empty,
// and returns once no request holds them and they are unmapped. A name
// that is not registered is not an error, as in Triton. When ctx ends
// first, the regions are unregistered all the same and unmapped as soon
// as their last request finishes; the error says so.
func (s *Regions) Unregister(ctx context.Context, name string) error {
	return s.await(ctx, s.detach(name))
}

// detach takes the region name (every region when name is empty) out of
// the name table, unmaps those no request holds, and returns the others.
func (s *Regions) detach(name string) []*Region {
	s.mu.Lock()
	defer s.mu.Unlock()
	var held []*Region
	for n, r := range s.regions {
		if name != "" && n != name {
			continue
		}
		delete(s.regions, n)
		r.unregistered = true
		s.logger.Info("shared memory region unregistered", "name", n, "key", r.key, "in_use", r.users)
		if r.users == 0 {
			s.unmap(r)
		} else {
			held = append(held, r)
		}
	}
	return held
}

// await waits until the detached regions held are unmapped, or ctx ends.
func (s *Regions) await(ctx context.Context, held []*Region) error {
	for _, r := range held {
		select {
		case <-r.unmapped:
		case <-ctx.Done():
			s.mu.Lock()
			users := r.users
			s.mu.Unlock()
			return fmt.Errorf("shared memory region '%s' is unregistered, but requests in flight still hold it (%d); it is unmapped when they finish: %w",
				r.name, users, ctx.Err())
		}
	}
	return nil
}

// Close unregisters every region without waiting: each is unmapped at
// once, or when the last request holding it finishes. Registering fails
// from then on. It is for the server's shutdown.
func (s *Regions) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.detach("")
}

// unmap unmaps r; s.mu is held and no request holds r.
func (s *Regions) unmap(r *Region) {
	if err := unix.Munmap(r.mapping); err != nil {
		s.logger.Error("unmapping a shared memory region", "name", r.name, "key", r.key, "err", err)
	}
	s.mapped -= r.cost
	r.mapping, r.data = nil, nil
	close(r.unmapped)
}

// hold finds the region name for a tensor of byteSize bytes at offset in
// it, and holds it until release: it stays mapped meanwhile.
func (s *Regions) Hold(name string, offset, byteSize int64) (*Region, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.regions[name]
	switch {
	case r == nil && s.disabled:
		return nil, apierr.BadRequest("Unable to find shared memory region: " + quoteRegion(name) + "; system shared memory is turned off on this server (server.shared_memory.enabled: false)")
	case r == nil:
		// Triton's words, then what to do.
		return nil, apierr.BadRequest("Unable to find shared memory region: " + quoteRegion(name) + "; register it first (see GET /v2/systemsharedmemory/status)")
	case offset >= r.size:
		return nil, apierr.BadRequest(fmt.Sprintf("shared_memory_offset %d is past the end of region '%s' (%d bytes)", offset, name, r.size))
	case byteSize > r.size-offset:
		return nil, apierr.BadRequest(fmt.Sprintf("shared_memory_offset %d + shared_memory_byte_size %d = %d runs past the end of region '%s' (%d bytes)",
			offset, byteSize, offset+byteSize, name, r.size))
	}
	r.users++
	return r, nil
}

// release lets go of a region hold returned, unmapping it when it was
// unregistered meanwhile and this was its last user.
func (s *Regions) Release(r *Region) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.users--; r.users == 0 && r.unregistered {
		s.unmap(r)
	}
}

// errShrank is a fault reading or writing a region: its client truncated
// the object under it.
var errShrank = errors.New("the shared-memory object behind it shrank after it was registered (a page of the region is gone); register it again at its new size")

// GuardFault runs f, in which a memory fault (SIGBUS from a mapping whose
// object was truncated under it) is errShrank rather than the end of the
// server.
func GuardFault(f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if _, fault := p.(interface{ Addr() uintptr }); fault {
				err = errShrank
				return
			}
			panic(p)
		}
	}()
	f()
	return nil
}
