package oip

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
)

// headerContentLength is Triton's binary-tensor extension header: the
// length of the JSON part of a body that binary tensors follow.
const headerContentLength = "Inference-Header-Content-Length"

func (s *API) infer(w http.ResponseWriter, r *http.Request) {
	s.inferNamed(w, r, chi.URLParam(r, "model"), chi.URLParam(r, "version"))
}

// inferNamed answers one inference request for model and version: the
// core's call runs its life (core.Call), this decodes its body and
// encodes its answer.
func (s *API) inferNamed(w http.ResponseWriter, r *http.Request, model, version string) {
	call := s.c.BeginHTTP(w, r, core.ProtocolHTTP, writeError)
	defer call.End()
	if _, err := call.Find(model, version); err != nil {
		call.Fail(err)
		return
	}
	if err := call.Ready(); err != nil {
		call.Fail(err)
		return
	}
	// Everything the request allocates from here on is charged to the
	// in-flight budget first, and stays charged until its response is
	// written: a client that reads its answer slowly holds it, not more.
	body, err := call.Read(w, r)
	if err != nil {
		call.Fail(err)
		return
	}
	headerLen := -1
	if h := r.Header.Get(headerContentLength); h != "" {
		n, perr := strconv.Atoi(h)
		if perr != nil || n < 0 {
			call.Fail(apierr.BadRequest(fmt.Sprintf("%s %q is not a non-negative integer", headerContentLength, apierr.ClipName(h))))
			return
		}
		headerLen = n
	}
	call.Trace()
	req, f, err := wire.ParseRequest(body, headerLen, call.Model().Model(), s.c.Opts.MaxRequestElements)
	if err != nil {
		call.Fail(err)
		return
	}
	res, err := call.Infer(req, f)
	if err != nil {
		call.Fail(err)
		return
	}
	if err := s.writeResponse(w, call.Model().Model(), req, res, f.JSON); err != nil {
		call.Fail(err)
		return
	}
	call.Succeed(res)
}

// writeResponse encodes the outputs: JSON data inline, binary outputs
// after the JSON header as Triton's extension lays them out, and for an
// output written to shared memory its metadata and the region's
// parameters, with no data.
//
// jsonBound is the most the JSON may take (footprint.json), which the
// buffer is sized to: it is charged already, and never grows.
func (s *API) writeResponse(w http.ResponseWriter, m *models.Model, req *wire.InferRequest, res *serving.Result, jsonBound int64) error {
	b := make([]byte, 0, jsonBound)
	b = append(b, `{"model_name":`...)
	b = strconv.AppendQuote(b, m.Name)
	b = append(b, `,"model_version":`...)
	b = strconv.AppendQuote(b, m.Version)
	if req.ID != "" {
		idJSON, _ := json.Marshal(req.ID)
		b = append(b, `,"id":`...)
		b = append(b, idJSON...)
	}
	b = append(b, `,"outputs":[`...)
	var parts [4][]byte
	binaryParts := parts[:0]
	for i, c := range req.Outputs {
		spec := m.Config.Outputs[c.Index]
		data := res.Outputs[c.Index]
		if i > 0 {
			b = append(b, ',')
		}
		if c.Classes > 0 {
			b, binaryParts = wire.AppendClassOutput(b, binaryParts, m, c, data, req.Rows)
			continue
		}
		b = append(b, `{"name":`...)
		b = strconv.AppendQuote(b, spec.Name)
		b = append(b, `,"datatype":"`...)
		b = append(b, spec.Datatype...)
		b = append(b, `","shape":[`...)
		b = strconv.AppendInt(b, int64(req.Rows), 10)
		for _, d := range spec.Shape[1:] {
			b = append(b, ',')
			b = strconv.AppendInt(b, int64(d), 10)
		}
		b = append(b, ']')
		if shm := c.SharedMemory; shm != nil {
			// Written to its region (core.Call.Infer): where, and how much.
			b = append(b, `,"parameters":{"shared_memory_region":`...)
			b = strconv.AppendQuote(b, shm.Region) // printable ASCII: valid JSON
			b = append(b, `,"shared_memory_offset":`...)
			b = strconv.AppendInt(b, shm.Offset, 10)
			b = append(b, `,"shared_memory_byte_size":`...)
			b = strconv.AppendInt(b, shm.Written, 10)
			b = append(b, "}}"...)
			continue
		}
		if c.Binary {
			b = append(b, `,"parameters":{"binary_data_size":`...)
			b = strconv.AppendInt(b, int64(len(data)), 10)
			b = append(b, "}}"...)
			binaryParts = append(binaryParts, data)
			continue
		}
		b = append(b, `,"data":`...)
		var err error
		if b, err = wire.AppendJSONData(b, data, spec.Datatype); err != nil {
			return fmt.Errorf("model %s produced a bad value in output %q: %w", m.Name, spec.Name, err)
		}
		b = append(b, '}')
	}
	b = append(b, "]}"...)

	// Header keys already canonical, and shared values: no allocation or
	// canonicalization per response.
	h := w.Header()
	if len(binaryParts) == 0 {
		h["Content-Type"] = core.ContentTypeJSON
		h["Content-Length"] = []string{strconv.Itoa(len(b))}
		w.WriteHeader(http.StatusOK)
		w.Write(b)
		return nil
	}
	total := len(b)
	for _, p := range binaryParts {
		total += len(p)
	}
	lengths := []string{strconv.Itoa(len(b)), strconv.Itoa(total)}
	h["Content-Type"] = core.ContentTypeOctets
	h[headerContentLength] = lengths[0:1:1]
	h["Content-Length"] = lengths[1:2:2]
	w.WriteHeader(http.StatusOK)
	w.Write(b)
	for _, p := range binaryParts {
		w.Write(p)
	}
	return nil
}

// writeError is OIP's refusal: {"error": msg}.
func writeError(w http.ResponseWriter, status int, err error) {
	core.WriteError(w, status, err.Error())
}
