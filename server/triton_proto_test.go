package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// protobufPython is a Python with google.protobuf and grpc_tools (Debian's
// python3-protobuf and python3-grpc-tools, which make deps installs), and
// a directory holding proto/inference.proto (the protocol as the gRPC API
// serves it) compiled for it.
func protobufPython(t *testing.T) (python, pbDir string) {
	t.Helper()
	python = os.Getenv("PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	if err := exec.Command(python, "-c", "import google.protobuf, grpc_tools").Run(); err != nil {
		t.Skipf("%s has no google.protobuf or grpc_tools (make deps installs python3-protobuf and python3-grpc-tools): %v", python, err)
	}
	pbDir = t.TempDir()
	out, err := exec.Command(python, "-m", "grpc_tools.protoc", "-I../proto", "--python_out="+pbDir, "../proto/inference.proto").CombinedOutput()
	require.NoError(t, err, string(out))
	return python, pbDir
}

// parseAsTriton parses each document as the Triton message named, with
// protobuf's own JSON parser, strictly, and returns what it read back.
func parseAsTriton(t *testing.T, docs map[string][]byte, message map[string]string) map[string]map[string]any {
	t.Helper()
	python, pbDir := protobufPython(t)
	dir := t.TempDir()
	args := []string{"testdata/triton/parse.py", pbDir}
	for name, doc := range docs {
		path := filepath.Join(dir, name+".json")
		require.NoError(t, os.WriteFile(path, doc, 0o644))
		args = append(args, message[name]+"="+path)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(python, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	got := map[string]map[string]any{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line struct {
			File    string
			Message map[string]any
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line))
		name := filepath.Base(line.File)
		got[name[:len(name)-len(".json")]] = line.Message
	}
	require.Len(t, got, len(docs))
	return got
}

// The model configuration and statistics answers parse as Triton's
// ModelConfig and ModelStatisticsResponse (model_config.proto,
// grpc_service.proto): every field name, enum name and value type is
// the protocol's, as tritonclient and perf_analyzer read them.
func TestAnswersParseAsTritonMessages(t *testing.T) {
	s := shippedOnFakes(t)
	docs := map[string][]byte{}
	message := map[string]string{}
	for _, m := range []string{"digits", "digits-cnn", "tiny-encoder"} {
		docs[m] = []byte(getConfig(t, s, "/v2/models/"+m+"/config"))
		message[m] = "ModelConfig"
	}
	pixels := `{"inputs":[{"name":"pixels","datatype":"FP32","shape":[40,64],"data":[` + zeros(40*64) + `]}]}`
	require.Equal(t, 200, do(t, s, "POST", "/v2/models/digits/infer", []byte(pixels)).Code)
	require.Equal(t, 400, do(t, s, "POST", "/v2/models/digits/infer", []byte(`{}`)).Code)
	docs["stats"] = do(t, s, "GET", "/v2/models/stats", nil).Body.Bytes()
	message["stats"] = "ModelStatisticsResponse"

	got := parseAsTriton(t, docs, message)

	digits := got["digits"]
	assert.Equal(t, "digits", digits["name"])
	assert.EqualValues(t, 32, digits["max_batch_size"])
	in := digits["input"].([]any)[0].(map[string]any)
	assert.Equal(t, "TYPE_FP32", in["data_type"])
	assert.Equal(t, []any{"64"}, in["dims"], "int64 dims, read back in protobuf's JSON form")
	assert.Equal(t, "labels.txt", digits["output"].([]any)[0].(map[string]any)["label_filename"])
	assert.Equal(t, "KIND_CPU", digits["instance_group"].([]any)[0].(map[string]any)["kind"])
	assert.Equal(t, []any{1.0, 4.0, 16.0, 32.0}, digits["dynamic_batching"].(map[string]any)["preferred_batch_size"])
	assert.Equal(t, "TYPE_STRING", got["tiny-encoder"]["input"].([]any)[0].(map[string]any)["data_type"])
	assert.Equal(t, "pytorch_libtorch", got["digits-cnn"]["platform"])

	var digitsStats map[string]any
	for _, ms := range got["stats"]["model_stats"].([]any) {
		if ms.(map[string]any)["name"] == "digits" {
			digitsStats = ms.(map[string]any)
		}
	}
	require.NotNil(t, digitsStats)
	assert.Equal(t, "40", digitsStats["inference_count"])
	assert.Equal(t, "2", digitsStats["execution_count"], "40 rows: 32, then 8")
	is := digitsStats["inference_stats"].(map[string]any)
	assert.Equal(t, "1", is["fail"].(map[string]any)["count"])
	assert.Equal(t, "1", is["compute_infer"].(map[string]any)["count"])
	assert.Len(t, digitsStats["batch_stats"], 2)
}

func zeros(n int) string {
	b := make([]byte, 0, 2*n)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '0')
	}
	return string(b)
}
