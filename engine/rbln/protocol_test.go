package rbln

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
)

// wire is req as the worker receives it: framed with its type and id.
func wire(t *testing.T, req request, id uint64) string {
	t.Helper()
	req.address(req.kind(), id)
	var buf bytes.Buffer
	require.NoError(t, writeFrame(&buf, req))
	return string(buf.Bytes()[4:])
}

// TestRequestsOnTheWire pins the field names the Python worker reads
// (worker.py, nets.py).
func TestRequestsOnTheWire(t *testing.T) {
	for _, tc := range []struct {
		req  request
		want string
	}{
		{&pingRequest{}, `{"type":"ping","id":7}`},
		{&memoryRequest{}, `{"type":"memory","id":7}`},
		{&compileRequest{Model: "digits", Bucket: 2}, `{"type":"compile","id":7,"model":"digits","bucket":2}`},
		{&stepRequest{Model: "digits", Bucket: 0}, `{"type":"step","id":7,"model":"digits","bucket":0}`},
		{&unloadRequest{Model: "digits"}, `{"type":"unload","id":7,"model":"digits"}`},
	} {
		t.Run(tc.req.kind(), func(t *testing.T) {
			assert.Equal(t, tc.want, wire(t, tc.req, 7))
		})
	}
}

// TestLoadRequestOnTheWire holds the load request to what the supervisor
// sent when it built it as a map, for both architectures, in float16: every
// row of staging padded to 64 elements, floats in 2 bytes, token ids in 4.
func TestLoadRequestOnTheWire(t *testing.T) {
	for _, tc := range []struct {
		model, yaml string
		shapes      []bucketing.Shape
		want        string
	}{
		{"digits", `
architecture: mlp
mlp: {sizes: [64, 128, 10], activation: relu, output_activation: softmax}
inputs: [{name: pixels, datatype: FP32, shape: [-1, 64]}]
outputs: [{name: probabilities, datatype: FP32, shape: [-1, 10]}]
buckets: {batch: [1, 4]}
`, []bucketing.Shape{{Batch: 1}, {Batch: 4}},
			`{"architecture":"mlp","buckets":[` +
				`{"batch":1,"seq":0,"in_fd":0,"in_offset":0,"in_bytes":128,"in_dtype":"float16","in_cols":64,"in_row":64,"out_fd":0,"out_offset":4096,"out_bytes":128,"out_dtype":"float16","out_cols":10,"out_row":64},` +
				`{"batch":4,"seq":0,"in_fd":0,"in_offset":8192,"in_bytes":512,"in_dtype":"float16","in_cols":64,"in_row":64,"out_fd":0,"out_offset":12288,"out_bytes":512,"out_dtype":"float16","out_cols":10,"out_row":64}],` +
				`"compile_cache_dir":"/cache","device_dtype":"float16","compute_dtype":"float16","id":9,"mlp":{"activation":"relu","output_activation":"softmax","sizes":[64,128,10]},"model":"digits","name":"digits","version":"2","slot":3,"strict_warmup":false,"type":"load","weights":"/models/digits/weights.safetensors"}`},
		{"tiny-encoder", `
architecture: encoder
encoder: {vocab_size: 1024, hidden: 128, layers: 2, heads: 4, intermediate: 512, max_position: 128, pooling: mean, normalize: true, lowercase: true, truncate: true}
inputs: [{name: text, datatype: BYTES, shape: [-1]}]
outputs: [{name: embedding, datatype: FP32, shape: [-1, 128]}]
buckets: {batch: [1, 4], seq: [32]}
`, []bucketing.Shape{{Batch: 1, Seq: 32}, {Batch: 4, Seq: 32}},
			`{"architecture":"encoder","buckets":[` +
				`{"batch":1,"seq":32,"in_fd":0,"in_offset":0,"in_bytes":512,"in_dtype":"int32","in_cols":96,"in_row":128,"out_fd":0,"out_offset":4096,"out_bytes":256,"out_dtype":"float16","out_cols":128,"out_row":128},` +
				`{"batch":4,"seq":32,"in_fd":0,"in_offset":8192,"in_bytes":2048,"in_dtype":"int32","in_cols":96,"in_row":128,"out_fd":0,"out_offset":12288,"out_bytes":1024,"out_dtype":"float16","out_cols":128,"out_row":128}],` +
				`"compile_cache_dir":"/cache","device_dtype":"float16","compute_dtype":"float16","encoder":{"family":"bert","head":"none","hidden_act":"gelu","pad_token_id":0,"heads":4,"hidden":128,"intermediate":512,"layer_norm_eps":1e-12,"layers":2,"max_position":128,"normalize":true,"pooling":"mean","type_vocab_size":2,"vocab_size":1024},"id":9,"model":"tiny-encoder","name":"tiny-encoder","version":"2","slot":3,"strict_warmup":false,"type":"load","weights":"/models/tiny-encoder/weights.safetensors"}`},
	} {
		t.Run(tc.model, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), models.ConfigFile)
			require.NoError(t, os.WriteFile(path, []byte(tc.yaml), 0o644))
			cfg, err := models.ReadConfig(path)
			require.NoError(t, err)
			m := &models.Model{Name: tc.model, Version: "2", Config: cfg, Weights: &models.Weights{Path: "/models/" + tc.model + "/weights.safetensors"}}
			p := &program{w: &worker{e: &Engine{opts: Options{CompileCacheDir: "/cache"}}}, model: m, key: m.Name, slot: 3, shapes: tc.shapes, floats: dtFloat16}
			p.staging = &staging{}
			for i, s := range tc.shapes {
				l := engine.NewLayout(m.Config, s)
				b, err := newBoundary(l, dtFloat16, false)
				require.NoError(t, err)
				p.layouts, p.bounds = append(p.layouts, l), append(p.bounds, b)
				if i == 0 {
					p.lanes = []*lane{{p: p}}
				}
				p.lanes[0].in = append(p.lanes[0].in, region{offset: 8192 * i})
				p.lanes[0].out = append(p.lanes[0].out, region{offset: 8192*i + 4096})
			}
			assert.JSONEq(t, tc.want, wire(t, p.loadRequest(), 9))
		})
	}
}

// TestResultDecodesIntoExplain: the worker's report lands in engine.Explain
// as it is, and a count the worker left out or sent as null is unknown,
// never zero.
func TestResultDecodesIntoExplain(t *testing.T) {
	m, err := decodeMessage([]byte(`{"type":"result","id":3,"ok":true,"explain":{"measured":true,"clean":false,` +
		`"reasons":["cpu_fallback: aten::nonzero"],"cpu_fallbacks":2,"recompiles":0,"h2d":1,"d2h":null,` +
		`"v2v_slow":0,"h2d_ns":450,"cpu_fallback_reasons":{"dtype-not-fp16":2},"notes":["dispatch/cpu_fallback: graph mode"],` +
		`"cpu_fallback_by_op":{"aten::nonzero":2},"recompile_by_op":null,"report":"[overhead] x"}}`))
	require.NoError(t, err)
	r := stepReply{Explain: engine.Unmeasured()}
	require.NoError(t, m.decode("step result", &r))
	assert.Equal(t, engine.Explain{
		Measured:           true,
		Reasons:            []string{"cpu_fallback: aten::nonzero"},
		CPUFallbacks:       2,
		Recompiles:         0,
		HostBounces:        engine.Unknown, // absent
		HostBounceBytes:    engine.Unknown, // absent
		H2D:                1,
		D2H:                engine.Unknown, // null
		WallNS:             engine.Unknown, // absent
		H2DNS:              450,
		D2HNS:              engine.Unknown, // absent
		V2V:                engine.Unknown, // absent
		V2VSlow:            0,
		DeviceNS:           engine.Unknown, // left out: unknown
		HostOps:            engine.Unknown, // absent
		CPUFallbackByOp:    map[string]int64{"aten::nonzero": 2},
		CPUFallbackReasons: map[string]int64{"dtype-not-fp16": 2},
		Notes:              []string{"dispatch/cpu_fallback: graph mode"},
		Report:             "[overhead] x",
	}, r.Explain)

	m, err = decodeMessage([]byte(`{"type":"result","id":4,"ok":true}`))
	require.NoError(t, err)
	r = stepReply{Explain: engine.Unmeasured()}
	require.NoError(t, m.decode("step result", &r))
	assert.Equal(t, engine.Unmeasured(), r.Explain, "a result without a report measured nothing")
}

func TestMalformedReplyIsAProtocolError(t *testing.T) {
	m, err := decodeMessage([]byte(`{"type":"result","id":3,"ok":true,"explain":{"h2d":"one"}}`))
	require.NoError(t, err)
	var r stepReply
	err = m.decode("step result", &r)
	assert.ErrorIs(t, err, ErrProtocol)
	assert.ErrorContains(t, err, "step result")
}
