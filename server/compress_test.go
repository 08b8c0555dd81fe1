package server

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
)

func compressed(t *testing.T, enc string, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.WriteCloser
	switch enc {
	case "gzip":
		w = gzip.NewWriter(&buf)
	case "deflate":
		w = zlib.NewWriter(&buf)
	case "raw-deflate":
		w, _ = flate.NewWriter(&buf, flate.BestSpeed)
	}
	_, err := w.Write(b)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return buf.Bytes()
}

// TestCompressedRequests: gzip and deflate (zlib or raw) bodies are
// decompressed, JSON and binary alike, as tritonclient's
// request_compression_algorithm sends them.
func TestCompressedRequests(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	body := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[2,3],"data":[1,2,3,4,5,-6]}]}`)
	for _, enc := range []string{"gzip", "deflate", "raw-deflate"} {
		header := strings.TrimPrefix(enc, "raw-")
		w := do(t, s, "POST", "/v2/models/summax/infer", compressed(t, enc, body), "Content-Encoding", header)
		require.Equal(t, http.StatusOK, w.Code, "%s: %s", enc, w.Body.String())
		var r response
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &r))
		assert.Equal(t, []float32{6, 3, 3, 5}, r.Outputs[0].Data, enc)
	}
	bin, hlen := binaryRequest(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}}]}`, 1, 2, 3)
	w := do(t, s, "POST", "/v2/models/summax/infer", compressed(t, "gzip", bin), "Content-Encoding", "gzip",
		"Inference-Header-Content-Length", hlen)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.Contains(t, w.Body.String(), `"data":[6,3]`)
}

// TestCompressionRefusals: an unknown encoding is a 415 naming it; a body
// that is not what its encoding says is a 400; a small body that
// decompresses past server.max_body_bytes (a bomb) is a 413 once the limit
// is reached, not after it is inflated.
func TestCompressionRefusals(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t)) // max body 4096 bytes
	body := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`)

	w := do(t, s, "POST", "/v2/models/summax/infer", body, "Content-Encoding", "br")
	assert.Equal(t, http.StatusUnsupportedMediaType, w.Code)
	assert.Equal(t, `Content-Encoding "br" is not supported; send gzip, deflate or identity`, errorOf(t, w))

	w = do(t, s, "POST", "/v2/models/summax/infer", body, "Content-Encoding", "gzip")
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Contains(t, errorOf(t, w), "the body is not gzip")

	s.c.Opts.MaxBodyBytes = 64 << 10
	bomb := compressed(t, "gzip", bytes.Repeat([]byte{' '}, 64<<20)) // 64 MiB of spaces: about 64 KiB compressed
	require.Less(t, len(bomb), 64<<10, "the bomb itself is under the limit")
	w = do(t, s, "POST", "/v2/models/summax/infer", bomb, "Content-Encoding", "gzip")
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	assert.Equal(t, "request body decompresses to more than the 65536-byte limit (server.max_body_bytes)", errorOf(t, w))

	w = do(t, s, "POST", "/v2/models/summax/infer", body, "Content-Encoding", "identity")
	assert.Equal(t, http.StatusOK, w.Code, w.Body.String())
}

// TestCompressedResponses: a response large enough to gain is compressed
// as Accept-Encoding asks (gzip preferred, q=0 refused); small ones and
// clients that ask for nothing get it plain.
func TestCompressedResponses(t *testing.T) {
	f := newSumMax(t)
	s, _ := newTestServer(t, f)
	rows := 1000
	data := strings.TrimSuffix(strings.Repeat("1,2,3,", rows), ",")
	body := []byte(fmt.Sprintf(`{"inputs":[{"name":"x","datatype":"FP32","shape":[%d,3],"data":[%s]}]}`, rows, data))
	s.c.Opts.MaxBodyBytes = 1 << 20

	for _, tc := range []struct{ accept, want string }{
		{"gzip", "gzip"}, {"deflate", "deflate"}, {"deflate, gzip", "gzip"}, {"gzip;q=0, deflate", "deflate"},
		{"br", ""}, {"", ""}, {"*", "gzip"}, {"gzip;q=0", ""},
	} {
		w := do(t, s, "POST", "/v2/models/summax/infer", body, "Accept-Encoding", tc.accept)
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		assert.Equal(t, tc.want, w.Header().Get("Content-Encoding"), "Accept-Encoding %q", tc.accept)
		var plain []byte
		switch tc.want {
		case "gzip":
			zr, err := gzip.NewReader(w.Body)
			require.NoError(t, err)
			plain, err = io.ReadAll(zr)
			require.NoError(t, err)
		case "deflate":
			zr, err := zlib.NewReader(w.Body)
			require.NoError(t, err)
			plain, err = io.ReadAll(zr)
			require.NoError(t, err)
		default:
			plain = w.Body.Bytes()
		}
		var r response
		require.NoError(t, json.Unmarshal(plain, &r), "Accept-Encoding %q", tc.accept)
		assert.Len(t, r.Outputs[0].Data, 2*rows)
	}
	w := do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`), "Accept-Encoding", "gzip")
	assert.Empty(t, w.Header().Get("Content-Encoding"), "a small response is not worth compressing")
}

// TestOnlyInferenceIsCompressed: as Triton, only inference answers are
// compressed. Every other OIP and Triton-extension answer is sent as it is
// whatever Accept-Encoding says: aiohttp sends "gzip, deflate" on every
// request and tritonclient's http.aio, which turns its decompression off,
// reads the bytes as JSON. The answers marked big would have gone
// compressed before.
func TestOnlyInferenceIsCompressed(t *testing.T) {
	f := newSumMax(t)
	for i := range 24 {
		dir := filepath.Join(f.repo, fmt.Sprintf("unloaded-model-%02d", i))
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, models.ConfigFile), []byte(enginetest.SumMaxYAML), 0o644))
	}
	s, _ := controlServer(t, f)
	s.c.Opts.MaxBodyBytes = 1 << 20
	const aiohttp = "gzip, deflate"
	rows := 1000
	data := strings.TrimSuffix(strings.Repeat("1,2,3,", rows), ",")
	infer := []byte(fmt.Sprintf(`{"inputs":[{"name":"x","datatype":"FP32","shape":[%d,3],"data":[%s]}]}`, rows, data))
	w := do(t, s, "POST", "/v2/models/summax/infer", infer, "Accept-Encoding", aiohttp)
	require.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "gzip", w.Header().Get("Content-Encoding"), "an inference answer is compressed")
	w = do(t, s, "POST", "/v2/models/summax/versions/1/infer", infer, "Accept-Encoding", aiohttp)
	require.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "gzip", w.Header().Get("Content-Encoding"), "through the router too")

	for _, tc := range []struct {
		method, path string
		big          bool
	}{
		{"GET", "/v2/models/summax/config", true},
		{"GET", "/v2/models/summax/versions/1/config", true},
		{"POST", "/v2/repository/index", true},
		{"GET", "/v2/repository/index", true},
		{"GET", "/v2/models/summax/stats", false},
		{"GET", "/v2/models/stats", false},
		{"GET", "/v2/models/summax", false},
		{"GET", "/v2", false},
		{"GET", "/v2/health/ready", false},
		{"GET", "/v2/health/live", false},
		{"GET", "/v2/models/summax/ready", false},
		{"GET", "/v2/models/summax/buckets", false},
		{"GET", "/v2/models/summax/explain", false},
	} {
		w := do(t, s, tc.method, tc.path, nil, "Accept-Encoding", aiohttp)
		require.Equal(t, http.StatusOK, w.Code, tc.path)
		assert.Empty(t, w.Header().Get("Content-Encoding"), "%s %s", tc.method, tc.path)
		assert.True(t, json.Valid(w.Body.Bytes()), "%s %s: the bytes are the JSON", tc.method, tc.path)
		if tc.big {
			assert.GreaterOrEqual(t, w.Body.Len(), 1024, "%s %s is large enough that it would be compressed", tc.method, tc.path)
		}
	}
}

// TestIdentityOverCompression: a client that weighs identity above gzip
// and deflate gets its answer as it is, as Triton's rule has it.
func TestIdentityOverCompression(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	s.c.Opts.MaxBodyBytes = 1 << 20
	rows := 1000
	data := strings.TrimSuffix(strings.Repeat("1,2,3,", rows), ",")
	infer := []byte(fmt.Sprintf(`{"inputs":[{"name":"x","datatype":"FP32","shape":[%d,3],"data":[%s]}]}`, rows, data))
	for accept, want := range map[string]string{
		"identity;q=1, gzip;q=0.5": "",
		"gzip;q=0.5, identity;q=1": "",
		"identity;q=0.5, gzip":     "gzip",
		"identity, gzip":           "gzip",
	} {
		w := do(t, s, "POST", "/v2/models/summax/infer", infer, "Accept-Encoding", accept)
		require.Equal(t, http.StatusOK, w.Code)
		assert.Equal(t, want, w.Header().Get("Content-Encoding"), "Accept-Encoding %q", accept)
	}
}

// TestTextAPIsCompress: OpenAI's and TEI's answers are still compressed
// when the client asks: their clients decompress, and embeddings are large.
func TestTextAPIsCompress(t *testing.T) {
	fx := newTextFixture(t, textOptions{onlyTiny: true})
	texts := make([]string, 16)
	for i := range texts {
		texts[i] = fmt.Sprintf("hello world %d", i)
	}
	for path, body := range map[string]any{
		"/embed":         map[string]any{"inputs": texts},
		"/v1/embeddings": map[string]any{"input": texts, "model": "tiny-encoder"},
	} {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, fx.url+path, bytes.NewReader(b))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Equal(t, "gzip", resp.Header.Get("Content-Encoding"), path)
	}
}
