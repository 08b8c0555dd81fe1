package server

import (
	"bytes"
	"net/http/httptest"
	"strconv"
	"testing"
)

// BenchmarkInferJSON measures the whole path of a single-row request
// (decode, validate, batcher, step on a fake engine, encode), with
// allocations.
func BenchmarkInferJSON(b *testing.B) {
	s, err := New(Options{Models: newSumMax(b).set})
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"id":"1","inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1.5,2,3]}]}`)
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest("POST", "/v2/models/summax/infer", bytes.NewReader(body)))
		if w.Code != 200 {
			b.Fatal(w.Body.String())
		}
	}
}

// BenchmarkInferBinary is the same with Triton's binary tensors in and out.
func BenchmarkInferBinary(b *testing.B) {
	s, err := New(Options{Models: newSumMax(b).set})
	if err != nil {
		b.Fatal(err)
	}
	hdr := `{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}}],"outputs":[{"name":"y","parameters":{"binary_data":true}}]}`
	body := append([]byte(hdr), "\x00\x00\xc0?\x00\x00\x00@\x00\x00@@"...)
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/v2/models/summax/infer", bytes.NewReader(body))
		r.Header.Set("Inference-Header-Content-Length", strconv.Itoa(len(hdr)))
		s.ServeHTTP(w, r)
		if w.Code != 200 {
			b.Fatal(w.Body.String())
		}
	}
}
