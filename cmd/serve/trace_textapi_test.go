package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTraceCoversTheTextAPIs: with tracing on, requests through TEI's
// /embed and OpenAI's /v1/embeddings are never sampled (only OIP's infer
// calls Tracer.Sample, server/oip/infer.go): 120 text API requests with
// trace_level TIMESTAMPS and log_frequency 1 left no trace file, while
// OIP requests to the same model did. A text API request must be traced
// as its OIP equivalent is.
func TestTraceCoversTheTextAPIs(t *testing.T) {
	dir := t.TempDir()
	const token = "trace-admin-token-0123"
	p := start(t, "--trace.dir", dir, "--auth.repository.token", token)
	code, body := admin(t, "POST", p.base+"/v2/models/tiny-xlmr/trace/setting", token,
		`{"trace_level":["TIMESTAMPS"],"trace_rate":"1","trace_count":"2","trace_file":"text_ts"}`)
	require.Equal(t, 200, code, string(body))
	resp, out := post(t, p.base+"/embed", []byte(`{"model":"tiny-xlmr","inputs":"traced through TEI"}`))
	require.Equal(t, 200, resp.StatusCode, string(out))
	resp, out = post(t, p.base+"/v1/embeddings", []byte(`{"model":"tiny-xlmr","input":"traced through OpenAI"}`))
	require.Equal(t, 200, resp.StatusCode, string(out))
	info, c := waitTrace(t, p.base, token, "text_ts.0.json")
	assert.Equal(t, 2, info.Steps)
	assert.Equal(t, 2, c.OtherData.Stepserve.Requests)
}
