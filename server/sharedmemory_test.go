package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// shmObject creates a POSIX shared-memory object of size bytes, as a
// client's shm_open and ftruncate do, under a name of its own, removed
// when the test ends. It returns the key that names it (/name) and its
// file, through which the test reads and writes what the server maps.
func shmObject(t *testing.T, size int64) (string, *os.File) {
	t.Helper()
	f, err := os.CreateTemp("/dev/shm", "stepserve-test-*")
	if err != nil {
		t.Skipf("no /dev/shm to create shared memory in: %v", err)
	}
	t.Cleanup(func() { f.Close(); os.Remove(f.Name()) })
	require.NoError(t, f.Truncate(size))
	return "/" + filepath.Base(f.Name()), f
}

// shmServer serves summax (f) with opts, its regions unregistered when
// the test ends, as the server's shutdown does.
func shmServer(t *testing.T, f *fixture, opts Options) *Server {
	t.Helper()
	opts.Models = f.set
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = 4096
	}
	s, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(s.CloseSharedMemory)
	return s
}

func registerBody(key string, offset, size int64) []byte {
	return fmt.Appendf(nil, `{"key":%q,"offset":%d,"byte_size":%d}`, key, offset, size)
}

func putFP32(t *testing.T, f *os.File, off int64, vs ...float32) {
	t.Helper()
	_, err := f.WriteAt(fp32(vs...), off)
	require.NoError(t, err)
}

func readFP32(t *testing.T, f *os.File, off int64, n int) []float32 {
	t.Helper()
	b := make([]byte, 4*n)
	_, err := f.ReadAt(b, off)
	require.NoError(t, err)
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

type shmStatus struct {
	Name     string `json:"name"`
	Key      string `json:"key"`
	Offset   int64  `json:"offset"`
	ByteSize int64  `json:"byte_size"`
}

func statusOf(t *testing.T, s http.Handler, path string) []shmStatus {
	t.Helper()
	w := do(t, s, "GET", path, nil)
	require.Equal(t, 200, w.Code, w.Body.String())
	var out []shmStatus
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &out), w.Body.String())
	return out
}

// TestSharedMemoryHTTP registers regions, infers with the input read from
// one and the output written to another (at an offset that is not on a
// page boundary), in JSON and binary requests, reads the status, and
// unregisters one region, then all.
func TestSharedMemoryHTTP(t *testing.T) {
	s := shmServer(t, newSumMax(t), Options{})
	inKey, in := shmObject(t, 24)
	outKey, out := shmObject(t, 4096+100+16)
	putFP32(t, in, 0, 1, 2, 3, 4, 5, -6)

	w := do(t, s, "POST", "/v2/systemsharedmemory/region/in0/register", registerBody(inKey, 0, 24))
	require.Equal(t, 200, w.Code, w.Body.String())
	w = do(t, s, "POST", "/v2/systemsharedmemory/region/out0/register", registerBody(outKey, 100, 4096+16))
	require.Equal(t, 200, w.Code, w.Body.String())

	assert.Equal(t, []shmStatus{{"in0", inKey, 0, 24}, {"out0", outKey, 100, 4096 + 16}}, statusOf(t, s, "/v2/systemsharedmemory/status"))
	assert.Equal(t, []shmStatus{{"out0", outKey, 100, 4096 + 16}}, statusOf(t, s, "/v2/systemsharedmemory/region/out0/status"))

	// The output goes 4096 bytes into out0: the object's byte 4196.
	body := `{"id":"shm","inputs":[{"name":"x","datatype":"FP32","shape":[2,3],"parameters":{"shared_memory_region":"in0","shared_memory_byte_size":24}}],` +
		`"outputs":[{"name":"y","parameters":{"binary_data":false,"shared_memory_region":"out0","shared_memory_byte_size":16,"shared_memory_offset":4096}}]}`
	w = do(t, s, "POST", "/v2/models/summax/infer", []byte(body))
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.JSONEq(t, `{"model_name":"summax","model_version":"1","id":"shm","outputs":[{"name":"y","datatype":"FP32","shape":[2,2],`+
		`"parameters":{"shared_memory_region":"out0","shared_memory_offset":4096,"shared_memory_byte_size":16}}]}`, w.Body.String())
	assert.Empty(t, w.Header().Get("Inference-Header-Content-Length"), "no data in the response")
	assert.Equal(t, []float32{6, 3, 3, 5}, readFP32(t, out, 4196, 4))

	// A binary request whose input is in shared memory and whose output
	// comes back in the body; the input's range starts inside the region.
	putFP32(t, in, 12, 7, 8, 9)
	hdr := `{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"shared_memory_region":"in0","shared_memory_byte_size":12,"shared_memory_offset":12}}],` +
		`"outputs":[{"name":"y","parameters":{"binary_data":true}}]}`
	w = do(t, s, "POST", "/v2/models/summax/infer", []byte(hdr), "Inference-Header-Content-Length", fmt.Sprint(len(hdr)), "Content-Type", "application/octet-stream")
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.Equal(t, fp32(24, 9), w.Body.Bytes()[len(w.Body.Bytes())-8:])

	w = do(t, s, "POST", "/v2/systemsharedmemory/region/in0/unregister", nil)
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.Equal(t, []shmStatus{{"out0", outKey, 100, 4096 + 16}}, statusOf(t, s, "/v2/systemsharedmemory/status"))
	w = do(t, s, "POST", "/v2/models/summax/infer", []byte(body))
	assert.Equal(t, 400, w.Code)
	assert.Equal(t, `input "x": Unable to find shared memory region: 'in0'; register it first (see GET /v2/systemsharedmemory/status)`, errorOf(t, w))
	// Unregistering a name that is not registered does nothing, as in
	// Triton; unregister with no name is every region.
	assert.Equal(t, 200, do(t, s, "POST", "/v2/systemsharedmemory/region/in0/unregister", nil).Code)
	assert.Equal(t, 200, do(t, s, "POST", "/v2/systemsharedmemory/unregister", nil).Code)
	assert.Empty(t, statusOf(t, s, "/v2/systemsharedmemory/status"))

	// The name is free again; a name tritonclient quotes in the URL
	// (perf_analyzer names regions after tensors, "input:0_shm") is the
	// name unquoted.
	w = do(t, s, "POST", "/v2/systemsharedmemory/region/in0/register", registerBody(inKey, 0, 24))
	require.Equal(t, 200, w.Code, w.Body.String())
	w = do(t, s, "POST", "/v2/systemsharedmemory/region/input%3A0_shm/register", registerBody(inKey, 0, 24))
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.Equal(t, []shmStatus{{"input:0_shm", inKey, 0, 24}}, statusOf(t, s, "/v2/systemsharedmemory/region/input%3A0_shm/status"))
}

// TestSharedMemoryRefusals: every bad registration and every tensor whose
// parameters do not fit its region or its shape is a 400 naming the
// region, the tensor and the sizes; a region's status that is not there
// is a 404.
func TestSharedMemoryRefusals(t *testing.T) {
	s := shmServer(t, newSumMax(t), Options{})
	key, _ := shmObject(t, 64)
	dir, err := os.MkdirTemp("/dev/shm", "stepserve-test-dir-*")
	require.NoError(t, err)
	t.Cleanup(func() { os.Remove(dir) })
	link := dir + ".link"
	require.NoError(t, os.Symlink("/etc/hostname", link))
	t.Cleanup(func() { os.Remove(link) })
	fifo := dir + ".fifo"
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	t.Cleanup(func() { os.Remove(fifo) })

	w := do(t, s, "POST", "/v2/systemsharedmemory/region/r/register", registerBody(key, 0, 64))
	require.Equal(t, 200, w.Code, w.Body.String())

	for _, tc := range []struct {
		name, path, body, want string
	}{
		{"a name registered already", "r", string(registerBody(key, 0, 8)), "shared memory region 'r' already in manager"},
		{"a key with a path", "k", string(registerBody("/a/b", 0, 8)), `failed to register shared memory region 'k': key "/a/b": a key is one name, with no '/' but an optional leading one`},
		{"a key that climbs", "k", string(registerBody("/..", 0, 8)), `key "/..": a key may not contain ".."`},
		{"a key that climbs further", "k", string(registerBody("../etc/passwd", 0, 8)), `a key is one name`},
		{"an empty key", "k", string(registerBody("/", 0, 8)), `key "/": want the name of a POSIX shared-memory object`},
		{"a semaphore", "k", string(registerBody("/sem.lock", 0, 8)), `objects named sem.... belong to other programs`},
		{"torch's memory", "k", string(registerBody("/torch_123_0", 0, 8)), `objects named torch_... belong to other programs`},
		{"no such object", "k", string(registerBody("/stepserve-test-none", 0, 8)), "no shared-memory object /dev/shm/stepserve-test-none (key \"/stepserve-test-none\"): create it (shm_open) before registering it"},
		{"a directory", "k", string(registerBody("/"+filepath.Base(dir), 0, 8)), "is not a regular file"},
		{"a symbolic link", "k", string(registerBody("/"+filepath.Base(link), 0, 8)), "is a symbolic link; register the object itself"},
		{"a FIFO", "k", string(registerBody("/"+filepath.Base(fifo), 0, 8)), "is not a regular file"},
		{"past the object's end", "k", string(registerBody(key, 60, 8)), fmt.Sprintf("failed to register shared memory region 'k': the object %s is 64 bytes, but offset 60 + byte_size 8 needs 68", key)},
		{"larger than the object", "k", string(registerBody(key, 0, 65)), "is 64 bytes, but offset 0 + byte_size 65 needs 65"},
		{"offset and size overflow", "k", fmt.Sprintf(`{"key":%q,"offset":9223372036854775807,"byte_size":9223372036854775807}`, key), "offset 9223372036854775807 + byte_size 9223372036854775807 overflows"},
		{"size past every limit", "k", fmt.Sprintf(`{"key":%q,"offset":0,"byte_size":9223372036854775807}`, key), "byte_size 9223372036854775807 is more than the"},
		{"an empty region", "k", string(registerBody(key, 0, 0)), "byte_size must be at least 1"},
		{"a negative offset", "k", fmt.Sprintf(`{"key":%q,"offset":-1,"byte_size":8}`, key), "offset must be a non-negative integer (bytes), got -1"},
		{"no key", "k", `{"byte_size":8}`, "key is required"},
		{"no size", "k", fmt.Sprintf(`{"key":%q}`, key), "byte_size is required"},
		{"an unknown field", "k", fmt.Sprintf(`{"key":%q,"byte_size":8,"device_id":0}`, key), `unknown field "device_id"`},
		{"not JSON", "k", `key=/x`, "the body is not a JSON object"},
		{"a name with a space", "a%20b", string(registerBody(key, 0, 8)), `shared memory region name "a b": use printable ASCII characters`},
	} {
		w := do(t, s, "POST", "/v2/systemsharedmemory/region/"+tc.path+"/register", []byte(tc.body))
		assert.Equal(t, 400, w.Code, tc.name)
		assert.Contains(t, errorOf(t, w), tc.want, tc.name)
	}
	assert.Equal(t, []shmStatus{{"r", key, 0, 64}}, statusOf(t, s, "/v2/systemsharedmemory/status"), "no refused region is registered")

	w = do(t, s, "GET", "/v2/systemsharedmemory/region/nosuch/status", nil)
	assert.Equal(t, 404, w.Code)
	assert.Equal(t, "Unable to find system shared memory region: 'nosuch'", errorOf(t, w))

	infer := func(input, output string) *httptest.ResponseRecorder {
		body := `{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],` + input + `}]`
		if output != "" {
			body += `,"outputs":[{"name":"y","parameters":` + output + `}]`
		}
		return do(t, s, "POST", "/v2/models/summax/infer", []byte(body+"}"))
	}
	const inR = `"parameters":{"shared_memory_region":"r","shared_memory_byte_size":12}`
	for _, tc := range []struct {
		name, input, output, want string
	}{
		{"an unknown region", `"parameters":{"shared_memory_region":"nosuch","shared_memory_byte_size":12}`, "",
			`input "x": Unable to find shared memory region: 'nosuch'`},
		{"an offset past the region", `"parameters":{"shared_memory_region":"r","shared_memory_byte_size":12,"shared_memory_offset":64}`, "",
			`input "x": shared_memory_offset 64 is past the end of region 'r' (64 bytes)`},
		{"a range past the region", `"parameters":{"shared_memory_region":"r","shared_memory_byte_size":12,"shared_memory_offset":56}`, "",
			`input "x": shared_memory_offset 56 + shared_memory_byte_size 12 = 68 runs past the end of region 'r' (64 bytes)`},
		{"a size the shape does not take", `"parameters":{"shared_memory_region":"r","shared_memory_byte_size":8}`, "",
			`input "x": shared_memory_byte_size is 8 bytes, but FP32 [1 3] needs 12`},
		{"a huge offset", `"parameters":{"shared_memory_region":"r","shared_memory_byte_size":12,"shared_memory_offset":9223372036854775807}`, "",
			`input "x": parameter shared_memory_offset must be a non-negative integer (bytes) of at most 281474976710656, got 9223372036854775807`},
		{"a negative size", `"parameters":{"shared_memory_region":"r","shared_memory_byte_size":-12}`, "",
			`parameter shared_memory_byte_size must be a non-negative integer`},
		{"data and a region", `"data":[1,2,3],` + inR, "", `input "x": has both shared_memory_region and data; send one`},
		{"a size with no region", `"data":[1,2,3],"parameters":{"shared_memory_byte_size":12}`, "",
			`input "x": parameter shared_memory_byte_size needs shared_memory_region`},
		{"an offset with no region", `"data":[1,2,3],"parameters":{"shared_memory_offset":0}`, "",
			`input "x": parameter shared_memory_offset needs shared_memory_region`},
		{"a region with no size", `"parameters":{"shared_memory_region":"r"}`, "",
			`input "x": parameter shared_memory_byte_size is required with shared_memory_region`},
		{"a region that is not a string", `"parameters":{"shared_memory_region":7,"shared_memory_byte_size":12}`, "",
			`input "x": parameter shared_memory_region must be a string, the name of a registered region; got 7`},
		{"an output range too small", inR, `{"shared_memory_region":"r","shared_memory_byte_size":4,"shared_memory_offset":12}`,
			`output "y": shared_memory_byte_size is 4 bytes, too small for FP32 [1 2], which takes 8`},
		{"an output past the region", inR, `{"shared_memory_region":"r","shared_memory_byte_size":8,"shared_memory_offset":60}`,
			`output "y": shared_memory_offset 60 + shared_memory_byte_size 8 = 68 runs past the end of region 'r' (64 bytes)`},
		{"an output as classes", inR, `{"shared_memory_region":"r","shared_memory_byte_size":64,"classification":1}`,
			`output "y": shared_memory_region and classification cannot both be set`},
		{"an output as binary data", inR, `{"shared_memory_region":"r","shared_memory_byte_size":8,"binary_data":true}`,
			`output "y": shared_memory_region and binary_data: true cannot both be set`},
	} {
		w := infer(tc.input, tc.output)
		assert.Equal(t, 400, w.Code, tc.name)
		assert.Contains(t, errorOf(t, w), tc.want, tc.name)
	}
	w = infer(inR, "")
	assert.Equal(t, 200, w.Code, "the server serves on: %s", w.Body.String())
}

// TestSharedMemoryUnregisterWaitsForRequests: unregistering regions a
// request is reading or writing takes them out of use at once (a new
// request naming one is refused, the name may be registered again) and
// answers once the request has finished with them, or, when its caller
// stops waiting first, says so; the request completes, its output written
// to memory that stayed mapped.
func TestSharedMemoryUnregisterWaitsForRequests(t *testing.T) {
	set, eng, gate := gatedSumMax(t)
	s := shmServer(t, &fixture{set: set, eng: eng}, Options{})
	key, f := shmObject(t, 64)
	putFP32(t, f, 0, 1, 2, 3)
	for _, name := range []string{"in", "out"} {
		require.Equal(t, 200, do(t, s, "POST", "/v2/systemsharedmemory/region/"+name+"/register", registerBody(key, 0, 64)).Code)
	}

	g := make(chan struct{})
	gate.Store(&g)
	body := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"shared_memory_region":"in","shared_memory_byte_size":12}}],` +
		`"outputs":[{"name":"y","parameters":{"shared_memory_region":"out","shared_memory_byte_size":8,"shared_memory_offset":32}}]}`)
	inferred := make(chan *httptest.ResponseRecorder, 1)
	go func() { inferred <- do(t, s, "POST", "/v2/models/summax/infer", body) }()
	require.Eventually(t, func() bool { return eng.Last().Steps() > 4 }, 5*time.Second, time.Millisecond, "the held step started")

	// An unregister whose caller stops waiting: the region is
	// unregistered all the same, and the answer says why it did not wait.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequestWithContext(ctx, "POST", "/v2/systemsharedmemory/region/out/unregister", nil))
	assert.Equal(t, 504, w.Code)
	assert.Equal(t, "shared memory region 'out' is unregistered, but requests in flight still hold it (1); it is unmapped when they finish: context deadline exceeded", errorOf(t, w))
	assert.Equal(t, []shmStatus{{"in", key, 0, 64}}, statusOf(t, s, "/v2/systemsharedmemory/status"))

	// An unregister that waits.
	unregistered := make(chan *httptest.ResponseRecorder, 1)
	go func() { unregistered <- do(t, s, "POST", "/v2/systemsharedmemory/unregister", nil) }()
	require.Eventually(t, func() bool { return len(statusOf(t, s, "/v2/systemsharedmemory/status")) == 0 }, 5*time.Second, time.Millisecond)
	w = do(t, s, "POST", "/v2/models/summax/infer", body)
	assert.Equal(t, 400, w.Code, "a new request cannot name it")
	require.Equal(t, 200, do(t, s, "POST", "/v2/systemsharedmemory/region/in/register", registerBody(key, 0, 64)).Code, "the name is free")
	select {
	case <-inferred:
		t.Fatal("the request finished while its step was held")
	case <-unregistered:
		t.Fatal("the unregister answered while a request held the region")
	default:
	}

	gate.Store(nil)
	close(g)
	w = <-inferred
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.Equal(t, []float32{6, 3}, readFP32(t, f, 32, 2), "the output reached the memory that stayed mapped")
	assert.Equal(t, 200, (<-unregistered).Code)
	assert.Equal(t, []shmStatus{{"in", key, 0, 64}}, statusOf(t, s, "/v2/systemsharedmemory/status"), "the region registered meanwhile stays")
}

// TestSharedMemoryLimits: the regions at once and the bytes they map are
// bounded; a request's shared-memory input is charged to the in-flight
// budget as a body is; and an object truncated under its region is a 400,
// not the end of the server.
func TestSharedMemoryLimits(t *testing.T) {
	page := int64(os.Getpagesize())
	s := shmServer(t, newSumMax(t), Options{MaxSharedMemoryRegions: 2, MaxSharedMemoryBytes: 3 * page})
	key, f := shmObject(t, 1<<20)
	register := func(name string, offset, size int64) *httptest.ResponseRecorder {
		return do(t, s, "POST", "/v2/systemsharedmemory/region/"+name+"/register", registerBody(key, offset, size))
	}
	require.Equal(t, 200, register("a", 0, page).Code)
	// A page and two bytes across two page boundaries map three pages.
	w := register("b", page-1, page+2)
	assert.Equal(t, 400, w.Code)
	assert.Contains(t, errorOf(t, w), "it would map 12 KiB, and 4 KiB of the server's 12 KiB for shared memory (server.shared_memory.max_bytes) is mapped already")
	require.Equal(t, 200, register("b", page, page).Code)
	w = register("c", 0, 8)
	assert.Equal(t, 400, w.Code)
	assert.Contains(t, errorOf(t, w), "failed to register shared memory region 'c': 2 regions are registered, the most the server holds (server.shared_memory.max_regions); unregister one first")
	require.Equal(t, 200, do(t, s, "POST", "/v2/systemsharedmemory/unregister", nil).Code)

	// A quarter MiB of rows in the region: their copy out of it alone
	// fills the quarter-MiB budget.
	s = shmServer(t, newSumMax(t), Options{MaxInflightBytes: 256 << 10})
	require.Equal(t, 200, register("big", 0, 1<<20).Code)
	rows := (1 << 20) / 12 / 4
	w = do(t, s, "POST", "/v2/models/summax/infer", fmt.Appendf(nil,
		`{"inputs":[{"name":"x","datatype":"FP32","shape":[%d,3],"parameters":{"shared_memory_region":"big","shared_memory_byte_size":%d}}]}`, rows, rows*12))
	assert.Equal(t, 413, w.Code)
	assert.Contains(t, errorOf(t, w), "more than the server's whole in-flight budget of 256 KiB")

	// The client shrinks the object under the region: the page is gone.
	putFP32(t, f, 0, 1, 2, 3)
	one := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"shared_memory_region":"big","shared_memory_byte_size":12,"shared_memory_offset":8192}}]}`)
	require.Equal(t, 200, do(t, s, "POST", "/v2/models/summax/infer", one).Code)
	require.NoError(t, f.Truncate(4096))
	w = do(t, s, "POST", "/v2/models/summax/infer", one)
	assert.Equal(t, 400, w.Code)
	assert.Equal(t, `input "x": shared memory region 'big': the shared-memory object behind it shrank after it was registered (a page of the region is gone); register it again at its new size`, errorOf(t, w))
	w = do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"shared_memory_region":"big","shared_memory_byte_size":12}}]}`))
	assert.Equal(t, 200, w.Code, "the pages that remain serve: %s", w.Body.String())

	// Closed at shutdown: the regions are gone and none can be registered.
	s.CloseSharedMemory()
	assert.Empty(t, statusOf(t, s, "/v2/systemsharedmemory/status"))
	w = register("late", 0, 8)
	assert.Equal(t, 503, w.Code)
	assert.Contains(t, errorOf(t, w), "the server is shutting down")
}

// TestSharedMemoryTokens: the shared-memory endpoints take the repository
// token where one is set, else the inference token; an inference request
// that names a region takes the inference token.
func TestSharedMemoryTokens(t *testing.T) {
	const tok, repoTok = "token-0123456789abcdef", "repo-token-0123456789"
	key, f := shmObject(t, 64)
	putFP32(t, f, 0, 1, 2, 3)
	infer := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"shared_memory_region":"r","shared_memory_byte_size":12}}]}`)

	s := shmServer(t, newSumMax(t), Options{InferenceTokens: []string{tok}, RepositoryTokens: []string{repoTok}})
	for _, path := range []string{"/v2/systemsharedmemory/status", "/v2/systemsharedmemory/region/r/status"} {
		assert.Equal(t, 401, do(t, s, "GET", path, nil).Code, path)
		assert.Equal(t, 401, do(t, s, "GET", path, nil, "Authorization", "Bearer "+tok).Code, path)
	}
	for _, path := range []string{"/v2/systemsharedmemory/region/r/register", "/v2/systemsharedmemory/region/r/unregister", "/v2/systemsharedmemory/unregister"} {
		assert.Equal(t, 401, do(t, s, "POST", path, registerBody(key, 0, 64)).Code, path)
		assert.Equal(t, 401, do(t, s, "POST", path, registerBody(key, 0, 64), "Authorization", "Bearer "+tok).Code, path)
	}
	require.Equal(t, 200, do(t, s, "POST", "/v2/systemsharedmemory/region/r/register", registerBody(key, 0, 64), "Authorization", "Bearer "+repoTok).Code)
	assert.Equal(t, 401, do(t, s, "POST", "/v2/models/summax/infer", infer, "Authorization", "Bearer "+repoTok).Code)
	assert.Equal(t, 200, do(t, s, "POST", "/v2/models/summax/infer", infer, "Authorization", "Bearer "+tok).Code)

	// gRPC: the same scopes.
	c, _ := grpcClients(t, s)
	bearer := func(t string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+t)
	}
	_, err := c.SystemSharedMemoryStatus(bearer(tok), &pb.SystemSharedMemoryStatusRequest{})
	code, _ := codeOf(err)
	assert.Equal(t, codes.Unauthenticated, code)
	_, err = c.SystemSharedMemoryRegister(bearer(tok), &pb.SystemSharedMemoryRegisterRequest{Name: "g", Key: key, ByteSize: 64})
	code, _ = codeOf(err)
	assert.Equal(t, codes.Unauthenticated, code)
	st, err := c.SystemSharedMemoryStatus(bearer(repoTok), &pb.SystemSharedMemoryStatusRequest{})
	require.NoError(t, err)
	assert.Len(t, st.Regions, 1)

	// With an inference token and no repository token, they are closed
	// as the administrator's endpoints are: an inference client cannot
	// make the server map the host's shared memory.
	s = shmServer(t, newSumMax(t), Options{InferenceTokens: []string{tok}})
	for _, h := range [][]string{nil, {"Authorization", "Bearer " + tok}} {
		w := do(t, s, "POST", "/v2/systemsharedmemory/region/r/register", registerBody(key, 0, 64), h...)
		assert.Equal(t, 403, w.Code)
		assert.Contains(t, w.Body.String(), "system shared memory")
	}
	c, _ = grpcClients(t, s)
	_, err = c.SystemSharedMemoryRegister(bearer(tok), &pb.SystemSharedMemoryRegisterRequest{Name: "g", Key: key, ByteSize: 64})
	code, _ = codeOf(err)
	assert.Equal(t, codes.PermissionDenied, code)
	// Left open on purpose, the inference token's holders may use them.
	s = shmServer(t, newSumMax(t), Options{InferenceTokens: []string{tok}, RepositoryAnonymous: true})
	require.Equal(t, 200, do(t, s, "POST", "/v2/systemsharedmemory/region/r/register", registerBody(key, 0, 64), "Authorization", "Bearer "+tok).Code)
	assert.Equal(t, 200, do(t, s, "POST", "/v2/models/summax/infer", infer, "Authorization", "Bearer "+tok).Code)
}

// TestSharedMemoryGRPC: Triton's SystemSharedMemory RPCs, and ModelInfer
// with its input read from a region (no raw_input_contents entry) and its
// output written to one (an empty raw_output_contents entry, the region's
// parameters on the output); the refusals with their gRPC codes; CUDA
// shared memory is UNIMPLEMENTED, named.
func TestSharedMemoryGRPC(t *testing.T) {
	s := shmServer(t, newSumMax(t), Options{})
	c, _ := grpcClients(t, s)
	ctx := context.Background()
	key, f := shmObject(t, 64)
	putFP32(t, f, 0, 1, 2, 3, 4, 5, -6)

	_, err := c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: "io", Key: key, ByteSize: 64})
	require.NoError(t, err)
	st, err := c.SystemSharedMemoryStatus(ctx, &pb.SystemSharedMemoryStatusRequest{})
	require.NoError(t, err)
	require.Contains(t, st.Regions, "io")
	assert.Equal(t, key, st.Regions["io"].Key)
	assert.Equal(t, uint64(64), st.Regions["io"].ByteSize)

	shm := func(region string, size, offset int64) map[string]*pb.InferParameter {
		return map[string]*pb.InferParameter{
			"shared_memory_region":    {ParameterChoice: &pb.InferParameter_StringParam{StringParam: region}},
			"shared_memory_byte_size": {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: size}},
			"shared_memory_offset":    {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: offset}},
		}
	}
	req := &pb.ModelInferRequest{ModelName: "summax", Id: "g",
		Inputs:  []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{2, 3}, Parameters: shm("io", 24, 0)}},
		Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: shm("io", 16, 32)}}}
	resp, err := c.ModelInfer(ctx, req)
	require.NoError(t, err)
	require.Len(t, resp.Outputs, 1)
	assert.Equal(t, []int64{2, 2}, resp.Outputs[0].Shape)
	assert.Equal(t, "io", resp.Outputs[0].Parameters["shared_memory_region"].GetStringParam())
	assert.Equal(t, int64(32), resp.Outputs[0].Parameters["shared_memory_offset"].GetInt64Param())
	assert.Equal(t, int64(16), resp.Outputs[0].Parameters["shared_memory_byte_size"].GetInt64Param())
	assert.Equal(t, [][]byte{{}}, resp.RawOutputContents, "one entry per output, empty")
	assert.Equal(t, []float32{6, 3, 3, 5}, readFP32(t, f, 32, 4))

	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
		want string
	}{
		{"a name registered already", func() error {
			_, err := c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: "io", Key: key, ByteSize: 8})
			return err
		}, codes.AlreadyExists, "shared memory region 'io' already in manager"},
		{"a bad key", func() error {
			_, err := c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: "k", Key: "/../x", ByteSize: 8})
			return err
		}, codes.InvalidArgument, `key "/../x": a key is one name`},
		{"a size past the object", func() error {
			_, err := c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: "k", Key: key, Offset: 1 << 63, ByteSize: 1 << 63})
			return err
		}, codes.InvalidArgument, "offset 9223372036854775808 + byte_size 9223372036854775808 overflows"},
		{"an unknown region's status", func() error {
			_, err := c.SystemSharedMemoryStatus(ctx, &pb.SystemSharedMemoryStatusRequest{Name: "nosuch"})
			return err
		}, codes.NotFound, "Unable to find system shared memory region: 'nosuch'"},
		{"an unknown region in a request", func() error {
			_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "summax",
				Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 3}, Parameters: shm("nosuch", 12, 0)}}})
			return err
		}, codes.InvalidArgument, `input "x": Unable to find shared memory region: 'nosuch'`},
		{"contents and a region", func() error {
			_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "summax",
				Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 3}, Parameters: shm("io", 12, 0),
					Contents: &pb.InferTensorContents{Fp32Contents: []float32{1, 2, 3}}}}})
			return err
		}, codes.InvalidArgument, `input "x": has both shared_memory_region and contents; send one`},
		{"a raw entry for an input in shared memory", func() error {
			_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "summax",
				Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 3}, Parameters: shm("io", 12, 0)}},
				RawInputContents: [][]byte{fp32(1, 2, 3)}})
			return err
		}, codes.InvalidArgument, "raw_input_contents has 1 entries for 0 inputs not in shared memory"},
		{"a size the shape does not take", func() error {
			_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "summax",
				Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 3}, Parameters: shm("io", 16, 0)}}})
			return err
		}, codes.InvalidArgument, `input "x": shared_memory_byte_size is 16 bytes, but FP32 [1 3] needs 12`},
		{"CUDA shared memory", func() error {
			_, err := c.CudaSharedMemoryRegister(ctx, &pb.CudaSharedMemoryRegisterRequest{Name: "cuda", ByteSize: 8})
			return err
		}, codes.Unimplemented, "the cuda_shared_memory extension is not supported by stepserve; use system shared memory"},
		{"a CUDA shared memory region's status", func() error {
			_, err := c.CudaSharedMemoryStatus(ctx, &pb.CudaSharedMemoryStatusRequest{Name: "cuda"})
			return err
		}, codes.NotFound, `Unable to find cuda shared memory region: "cuda"`},
	} {
		code, msg := codeOf(tc.call())
		assert.Equal(t, tc.code, code, tc.name)
		assert.Contains(t, msg, tc.want, tc.name)
	}

	// CUDA shared memory, as a Triton without GPUs: no region, and
	// unregistering succeeds.
	cst, err := c.CudaSharedMemoryStatus(ctx, &pb.CudaSharedMemoryStatusRequest{})
	require.NoError(t, err)
	assert.Empty(t, cst.Regions)
	_, err = c.CudaSharedMemoryUnregister(ctx, &pb.CudaSharedMemoryUnregisterRequest{})
	require.NoError(t, err)

	_, err = c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{Name: "io"})
	require.NoError(t, err)
	st, err = c.SystemSharedMemoryStatus(ctx, &pb.SystemSharedMemoryStatusRequest{})
	require.NoError(t, err)
	assert.Empty(t, st.Regions)
	_, err = c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{})
	assert.NoError(t, err, "every region, none left")
	md, err := c.ServerMetadata(ctx, &pb.ServerMetadataRequest{})
	require.NoError(t, err)
	assert.Contains(t, md.Extensions, "system_shared_memory")
	assert.NotContains(t, md.Extensions, "cuda_shared_memory")
}

// TestSharedMemoryTurnedOff: with server.shared_memory.enabled false, no
// region can be registered over HTTP (501) or gRPC (UNIMPLEMENTED), both
// naming the key; GET /v2 does not list the extension; a request naming
// a region is refused saying why.
func TestSharedMemoryTurnedOff(t *testing.T) {
	s := shmServer(t, newSumMax(t), Options{NoSharedMemory: true})
	key, _ := shmObject(t, 64)
	w := do(t, s, "POST", "/v2/systemsharedmemory/region/io/register", registerBody(key, 0, 64))
	assert.Equal(t, 501, w.Code)
	assert.Contains(t, errorOf(t, w), "system shared memory is turned off on this server (server.shared_memory.enabled: false)")

	var meta struct {
		Extensions []string `json:"extensions"`
	}
	w = do(t, s, "GET", "/v2", nil)
	require.Equal(t, 200, w.Code)
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &meta))
	assert.NotContains(t, meta.Extensions, "system_shared_memory")
	assert.Contains(t, meta.Extensions, "binary_tensor_data")

	w = do(t, s, "POST", "/v2/models/summax/infer",
		[]byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"shared_memory_region":"io","shared_memory_byte_size":12}}]}`))
	assert.Equal(t, 400, w.Code)
	assert.Contains(t, errorOf(t, w), "server.shared_memory.enabled: false")

	c, _ := grpcClients(t, s)
	_, err := c.SystemSharedMemoryRegister(context.Background(), &pb.SystemSharedMemoryRegisterRequest{Name: "io", Key: key, ByteSize: 64})
	assert.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "server.shared_memory.enabled: false")
}
