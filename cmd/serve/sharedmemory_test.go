package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mappedObjects are the /dev/shm objects the server maps now, from its
// /proc maps.
func (p *process) mappedObjects(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.cmd.Process.Pid))
	require.NoError(t, err, "the server is gone")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.Index(line, "/dev/shm/"); i >= 0 {
			out = append(out, line[i:])
		}
	}
	return strings.Join(out, "\n")
}

// TestPythonSharedMemory runs a Python client (Debian's python3 with
// grpcio and grpc_tools; testdata/shm_client.py) against the real binary:
// shared memory made as Python's multiprocessing and tritonclient make it,
// registered over HTTP and gRPC, the held-out 7 classified with its input
// read from shared memory and its output written there, the status, the
// refusals' codes, and unregistering; the server maps nothing of it
// afterwards.
func TestPythonSharedMemory(t *testing.T) {
	const python = "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import grpc, grpc_tools.protoc").CombinedOutput(); err != nil {
		t.Skipf("Python's grpcio and grpc_tools are needed (make deps installs python3-grpcio and python3-grpc-tools): %s", out)
	}
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	p := start(t)
	protos, err := filepath.Abs("../../proto")
	require.NoError(t, err)
	out, err := exec.Command(python, "testdata/shm_client.py", protos, t.TempDir(), p.base, p.grpc).CombinedOutput()
	require.NoError(t, err, "shared-memory client:\n%s", out)
	t.Logf("shared-memory client: %s", strings.TrimSpace(string(out)))
	assert.Contains(t, string(out), "ok")
	assert.Empty(t, p.mappedObjects(t), "every region unregistered is unmapped")
}

// TestSharedMemoryEndToEnd: text in Triton's BYTES serialization read out
// of shared memory embeds as the same text sent as JSON, the embedding
// written to shared memory; the region is mapped while registered and not
// after.
func TestSharedMemoryEndToEnd(t *testing.T) {
	f, err := os.CreateTemp("/dev/shm", "stepserve-e2e-*")
	if err != nil {
		t.Skipf("no /dev/shm to create shared memory in: %v", err)
	}
	t.Cleanup(func() { f.Close(); os.Remove(f.Name()) })
	key := "/" + filepath.Base(f.Name())
	texts := []string{"The water is warm.", "Children play near the river."}
	var blob []byte
	for _, s := range texts {
		blob = binary.LittleEndian.AppendUint32(blob, uint32(len(s)))
		blob = append(blob, s...)
	}
	const outAt, outBytes = 4096, 2 * 128 * 4
	require.NoError(t, f.Truncate(outAt+outBytes))
	_, err = f.WriteAt(blob, 0)
	require.NoError(t, err)

	p := start(t)
	resp, body := post(t, p.base+"/v2/systemsharedmemory/region/text/register", fmt.Appendf(nil, `{"key":%q,"byte_size":%d}`, key, outAt+outBytes))
	require.Equal(t, 200, resp.StatusCode, string(body))
	assert.Contains(t, p.mappedObjects(t), f.Name(), "mapped while registered")

	js, _ := json.Marshal(map[string]any{"inputs": []map[string]any{{"name": "text", "datatype": "BYTES", "shape": []int{2}, "data": texts}}})
	resp, body = post(t, p.base+"/v2/models/tiny-encoder/infer", js)
	require.Equal(t, 200, resp.StatusCode, string(body))
	var viaJSON inferResponse
	require.NoError(t, json.Unmarshal(body, &viaJSON))

	resp, body = post(t, p.base+"/v2/models/tiny-encoder/infer", fmt.Appendf(nil,
		`{"inputs":[{"name":"text","datatype":"BYTES","shape":[2],"parameters":{"shared_memory_region":"text","shared_memory_byte_size":%d}}],`+
			`"outputs":[{"name":"embedding","parameters":{"shared_memory_region":"text","shared_memory_byte_size":%d,"shared_memory_offset":%d}}]}`, len(blob), outBytes, outAt))
	require.Equal(t, 200, resp.StatusCode, string(body))
	assert.JSONEq(t, fmt.Sprintf(`{"model_name":"tiny-encoder","model_version":"1","outputs":[{"name":"embedding","datatype":"FP32","shape":[2,128],`+
		`"parameters":{"shared_memory_region":"text","shared_memory_offset":%d,"shared_memory_byte_size":%d}}]}`, outAt, outBytes), string(body))
	raw := make([]byte, outBytes)
	_, err = f.ReadAt(raw, outAt)
	require.NoError(t, err)
	assert.InDeltaSlice(t, viaJSON.Outputs[0].Data, rawFP32(raw), 1e-6)

	// One byte short of the serialization: the last element's length runs
	// past the data.
	resp, body = post(t, p.base+"/v2/models/tiny-encoder/infer", fmt.Appendf(nil,
		`{"inputs":[{"name":"text","datatype":"BYTES","shape":[2],"parameters":{"shared_memory_region":"text","shared_memory_byte_size":%d}}]}`, len(blob)-1))
	assert.Equal(t, 400, resp.StatusCode)
	assert.Contains(t, string(body), `input \"text\": element 1: length 29 runs past the 28 bytes of binary data left`)

	resp, body = post(t, p.base+"/v2/systemsharedmemory/unregister", nil)
	require.Equal(t, 200, resp.StatusCode, string(body))
	assert.NotContains(t, p.mappedObjects(t), f.Name(), "unmapped once unregistered")
}
