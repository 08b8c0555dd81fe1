package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
)

// TestTorchModelUnderCPUFailover: with engine.failover cpufallback, a
// PyTorch module (which the Go CPU engine cannot run) loads without a
// failover, and the built-in models keep theirs.
func TestTorchModelUnderCPUFailover(t *testing.T) {
	repo := t.TempDir()
	torchModel(t, repo, "mixed")
	copyDigits(t, repo, "digits", "")
	yaml := filepath.Join(repo, "digits", "model.yaml")
	b, err := os.ReadFile(yaml)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(yaml, []byte(strings.Replace(string(b), "engine: cpu", "engine: torch", 1)), 0o644))
	p := start(t, "--model_repository", repo, "--engine.failover", "cpufallback")
	assert.Equal(t, 200, status(t, "GET", p.base+"/v2/models/mixed/ready"))
	assert.Contains(t, p.logs.String(), `msg="model ready" model=mixed engine=torch`)
	assert.Regexp(t, `msg="model ready" model=mixed engine=torch .*failover=false`, p.logs.String())
	assert.Regexp(t, `msg="model ready" model=digits engine=torch .*failover=true`, p.logs.String())
}

// TestTorchModelDatatypes: every datatype architecture torch takes in and
// gives out round-trips through the JSON API with the values the module
// computes.
func TestTorchModelDatatypes(t *testing.T) {
	repo := t.TempDir()
	dir := filepath.Join(repo, "types")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.py"), []byte(`
import torch

class Types(torch.nn.Module):
    def forward(self, a, b, c, d, e):
        return a * 2, b + 1, c.int() + e, d.float() * 3, (c.long() * 1000)

def build(config):
    return Types()
`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(`
architecture: torch
torch: {module: model.py}
inputs:
  - {name: a, datatype: FP16, shape: [-1, 2]}
  - {name: b, datatype: BF16, shape: [-1, 2]}
  - {name: c, datatype: UINT8, shape: [-1, 2]}
  - {name: d, datatype: BOOL, shape: [-1, 2]}
  - {name: e, datatype: INT32, shape: [-1, 2]}
outputs:
  - {name: f16, datatype: FP16, shape: [-1, 2]}
  - {name: bf16, datatype: BF16, shape: [-1, 2]}
  - {name: i32, datatype: INT32, shape: [-1, 2]}
  - {name: f32, datatype: FP32, shape: [-1, 2]}
  - {name: i64, datatype: INT64, shape: [-1, 2]}
buckets: {batch: [1, 4]}
engine: torch
`), 0o644))
	p := start(t, "--model_repository", repo)
	// FP16 and BF16 travel as binary tensor data, as in Triton (JSON has
	// no half-precision numbers); the others go as JSON.
	header := `{"inputs":[` +
		`{"name":"a","datatype":"FP16","shape":[2,2],"parameters":{"binary_data_size":8}},` +
		`{"name":"b","datatype":"BF16","shape":[2,2],"parameters":{"binary_data_size":8}},` +
		`{"name":"c","datatype":"UINT8","shape":[2,2],"data":[0,1,200,255]},` +
		`{"name":"d","datatype":"BOOL","shape":[2,2],"data":[true,false,false,true]},` +
		`{"name":"e","datatype":"INT32","shape":[2,2],"data":[-5,7,100000,-1]}],` +
		`"outputs":[{"name":"f16","parameters":{"binary_data":true}},{"name":"bf16","parameters":{"binary_data":true}},` +
		`{"name":"i32"},{"name":"f32"},{"name":"i64"}]}`
	body := []byte(header)
	for _, h := range []uint16{0x3e00, 0xc000, 0x3400, 0x5640} { // FP16 1.5, -2, 0.25, 100
		body = binary.LittleEndian.AppendUint16(body, h)
	}
	for _, h := range []uint16{0x3f80, 0x4020, 0xc040, 0x3f00} { // BF16 1, 2.5, -3, 0.5
		body = binary.LittleEndian.AppendUint16(body, h)
	}
	resp, out := post(t, p.base+"/v2/models/types/infer", body,
		"Inference-Header-Content-Length", strconv.Itoa(len(header)), "Content-Type", "application/octet-stream")
	require.Equal(t, 200, resp.StatusCode, string(out))
	n, err := strconv.Atoi(resp.Header.Get("Inference-Header-Content-Length"))
	require.NoError(t, err)
	var r struct {
		Outputs []struct {
			Name     string    `json:"name"`
			Datatype string    `json:"datatype"`
			Data     []float64 `json:"data"`
		} `json:"outputs"`
	}
	require.NoError(t, json.Unmarshal(out[:n], &r))
	got := map[string][]float64{}
	for _, o := range r.Outputs {
		got[o.Name+" "+o.Datatype] = o.Data
	}
	raw := out[n:]
	require.Len(t, raw, 16)
	half := func(b []byte) []uint16 {
		var v []uint16
		for i := 0; i < len(b); i += 2 {
			v = append(v, binary.LittleEndian.Uint16(b[i:]))
		}
		return v
	}
	assert.Equal(t, []uint16{0x4200, 0xc400, 0x3800, 0x5a40}, half(raw[:8]), "FP16 a*2: 3, -4, 0.5, 200")
	assert.Equal(t, []uint16{0x4000, 0x4060, 0xc000, 0x3fc0}, half(raw[8:]), "BF16 b+1: 2, 3.5, -2, 1.5")
	assert.Equal(t, map[string][]float64{
		"f16 FP16":  nil,
		"bf16 BF16": nil,
		"i32 INT32": {-5, 8, 100200, 254},
		"f32 FP32":  {3, 0, 0, 3},
		"i64 INT64": {0, 1000, 200000, 255000},
	}, got)
}

// TestTorchModelWiderDatatypes: INT8, INT16, UINT16, UINT32, UINT64 and
// FP64 in and out of a torch module, at the ends of their ranges:
// unsigned ones reach the module as the next wider signed type, UINT64
// from 2^63 saturates, FP64 computes in the compute dtype. (BYTES is
// refused by model.yaml's check, naming why: models/torch_test.go.)
func TestTorchModelWiderDatatypes(t *testing.T) {
	repo := t.TempDir()
	dir := filepath.Join(repo, "wide")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.py"), []byte(`
import torch

class Wide(torch.nn.Module):
    def forward(self, a, b, c, d, e, f):
        assert c.dtype == torch.int32 and d.dtype == torch.int64 and e.dtype == torch.int64, (c.dtype, d.dtype, e.dtype)
        return a + 1, b * 2, c - 1, d + 0, e + 0, f * 2

def build(config):
    return Wide()
`), 0o644))
	spec := `
architecture: torch
torch: {module: model.py}
inputs:
  - {name: a, datatype: INT8, shape: [-1, 2]}
  - {name: b, datatype: INT16, shape: [-1, 2]}
  - {name: c, datatype: UINT16, shape: [-1, 2]}
  - {name: d, datatype: UINT32, shape: [-1, 2]}
  - {name: e, datatype: UINT64, shape: [-1, 2]}
  - {name: f, datatype: FP64, shape: [-1, 2]}
outputs:
  - {name: i8, datatype: INT8, shape: [-1, 2]}
  - {name: i16, datatype: INT16, shape: [-1, 2]}
  - {name: u16, datatype: UINT16, shape: [-1, 2]}
  - {name: u32, datatype: UINT32, shape: [-1, 2]}
  - {name: u64, datatype: UINT64, shape: [-1, 2]}
  - {name: f64, datatype: FP64, shape: [-1, 2]}
buckets: {batch: [1, 2]}
engine: torch
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(spec), 0o644))
	p := start(t, "--model_repository", repo)
	body := `{"inputs":[` +
		`{"name":"a","datatype":"INT8","shape":[1,2],"data":[-128,126]},` +
		`{"name":"b","datatype":"INT16","shape":[1,2],"data":[-16384,16383]},` +
		`{"name":"c","datatype":"UINT16","shape":[1,2],"data":[65535,1]},` +
		`{"name":"d","datatype":"UINT32","shape":[1,2],"data":[4294967295,0]},` +
		`{"name":"e","datatype":"UINT64","shape":[1,2],"data":[18446744073709551615,7]},` +
		`{"name":"f","datatype":"FP64","shape":[1,2],"data":[1.5,-2.25]}]}`
	resp, out := post(t, p.base+"/v2/models/wide/infer", []byte(body), "Content-Type", "application/json")
	require.Equal(t, 200, resp.StatusCode, string(out))
	var r struct {
		Outputs []struct {
			Name     string        `json:"name"`
			Datatype string        `json:"datatype"`
			Data     []json.Number `json:"data"`
		} `json:"outputs"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&r))
	got := map[string]string{}
	for _, o := range r.Outputs {
		got[o.Name+" "+o.Datatype] = fmt.Sprint(o.Data)
	}
	assert.Equal(t, map[string]string{
		"i8 INT8":    "[-127 127]",
		"i16 INT16":  "[-32768 32766]",
		"u16 UINT16": "[65534 0]",
		"u32 UINT32": "[4294967295 0]",
		"u64 UINT64": "[9223372036854775807 7]", // 2^64-1 saturated at 2^63-1 on the way in
		"f64 FP64":   "[3 -4.5]",
	}, got)

}

// TestTorchProbeRunsOnTheHost: a module's signature is probed once on
// zeros on the host CPU in float32, before its weights move to the device
// in the compute dtype: an eager device run with the unsupported_op
// fallback disabled would refuse a module the compiler lowers whole
// (issue 33, item 2). The torch engine computes in bfloat16 here (the
// worker's device dtype, as on an NPU), so the probe's float32 shows.
func TestTorchProbeRunsOnTheHost(t *testing.T) {
	repo := t.TempDir()
	dir := filepath.Join(repo, "probe")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	log := filepath.Join(t.TempDir(), "forward.log")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.py"), []byte(`import os
import torch
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        with open(os.environ["PROBE_LOG"], "a") as f:
            f.write(f"{self.lin.weight.dtype} {x.dtype} {x.device.type}\n")
        return self.lin(x)


def build(config):
    return M()
`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(`architecture: torch
torch: {module: model.py, weights: weights.safetensors}
inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
outputs: [{name: y, datatype: FP32, shape: [-1, 2]}]
buckets: {batch: [1]}
engine: torch
device_dtype: bfloat16
`), 0o644))
	f, err := os.Create(filepath.Join(dir, "weights.safetensors"))
	require.NoError(t, err)
	require.NoError(t, models.WriteSafetensors(f, []*models.Tensor{
		{Name: "lin.weight", Shape: []int{2, 4}, Data: []float32{1, 0, 0, 0, 0, 1, 0, 0}},
		{Name: "lin.bias", Shape: []int{2}, Data: []float32{0, 0}},
	}, nil))
	require.NoError(t, f.Close())

	p := start(t, "--model_repository", repo, "--rbln.env", "STEPSERVE_WORKER_CPU_DTYPE=device,PROBE_LOG="+log)
	resp, out := post(t, p.base+"/v2/models/probe/infer", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[3,4,0,0]}]}`))
	require.Equal(t, 200, resp.StatusCode, string(out))
	assert.Contains(t, string(out), `"data":[3,4]`)
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.GreaterOrEqual(t, len(lines), 2)
	assert.Equal(t, "torch.float32 torch.float32 cpu", lines[0], "the probe: on the host, in float32, before the weights move")
	for _, l := range lines[1:] {
		assert.Equal(t, "torch.bfloat16 torch.bfloat16 cpu", l, "every step after it computes in the compute dtype")
	}
}
