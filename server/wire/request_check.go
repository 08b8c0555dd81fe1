package wire

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/serving"
)

// CheckRequest checks a decoded request against m, whichever protocol
// carried it (JSON, JSON with binary tensors, gRPC): everything but the
// tensors' values, which decodeValues checks once the request is admitted:
// names, datatypes, shapes, binary sizes, outputs and parameters. It gives
// each input its share of binaryPart, the binary data after an HTTP
// request's JSON. bodyLen is the size of the request as it arrived, which
// bounds the elements a shape may claim. It returns the bytes the inputs
// will take decoded and the longest sequence they declare. Every error is
// a 400 that names the input or field at fault.
func CheckRequest(wr *WireRequest, binaryPart []byte, bodyLen int, m *models.Model, maxElements int64) (req *InferRequest, decoded int64, seq int, err error) {
	cfg := m.Config
	if err := CheckRequestID(wr.ID); err != nil {
		return nil, 0, 0, err
	}
	if len(wr.Inputs) == 0 {
		return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("request has no inputs; model %s takes %s", m.Name, Signature(cfg.Inputs)))
	}
	req = &InferRequest{ID: wr.ID, Rows: -1, wire: wr.Inputs}
	req.Inputs, req.Outputs = req.InputsBuf[:0], req.OutputsBuf[:0]
	if len(cfg.Inputs) > len(req.InputsBuf) {
		req.Inputs = make([]models.Input, 0, len(cfg.Inputs))
	}
	req.Inputs = req.Inputs[:len(cfg.Inputs)]
	var seenBuf [8]bool
	seen := seenBuf[:0]
	if len(cfg.Inputs) > len(seenBuf) {
		seen = make([]bool, 0, len(cfg.Inputs))
	}
	seen = seen[:len(cfg.Inputs)]
	var elements int64
	binLeft := len(binaryPart)
	for i := range wr.Inputs {
		in := &wr.Inputs[i]
		idx := specIndex(cfg.Inputs, in.Name)
		if idx < 0 {
			return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("unknown input %q; model %s takes %s", in.Name, m.Name, Signature(cfg.Inputs)))
		}
		if seen[idx] {
			return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("input %q appears more than once", in.Name))
		}
		seen[idx] = true
		if n, ok := models.ShapeElements(in.Shape); ok {
			if elements += n; elements > maxElements {
				return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("the inputs declare %d elements, above the limit of %d (server.max_request_elements)", elements, maxElements))
			}
		}
		spec := cfg.Inputs[idx]
		if in.shm, err = shmParams(WireParams{in.Parameters, in.Pairs}); err != nil {
			return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("input %q: %v", in.Name, err))
		}
		req.shm = req.shm || in.shm != nil
		avail := binLeft
		if in.BinSet {
			avail = len(in.Bin)
		}
		size, binSize, err := checkInput(in, spec, bodyLen, avail)
		if err != nil {
			return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("input %q: %v", in.Name, err))
		}
		if binSize > 0 && !in.BinSet {
			in.Bin, binaryPart = binaryPart[:binSize:binSize], binaryPart[binSize:]
			in.BinSet = true
			binLeft -= binSize
		}
		decoded += size
		for d, want := range spec.Shape[1:] {
			if want < 0 {
				seq = max(seq, int(in.Shape[1+d]))
			}
		}
		rows := int(in.Shape[0])
		if req.Rows >= 0 && rows != req.Rows {
			return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("input %q has %d rows but an earlier input has %d; every input's first dimension is the batch and must agree", in.Name, rows, req.Rows))
		}
		req.Rows = rows
		req.Inputs[idx].Shape = in.Shape
	}
	for i, s := range cfg.Inputs {
		if !seen[i] && !cfg.OptionalInput(s.Name) {
			return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("missing input %q (%s %v)", s.Name, s.Datatype, s.Shape))
		}
	}
	if binLeft > 0 {
		return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("%d bytes of binary data follow the inputs' binary_data_size total; the sizes and the body disagree", binLeft))
	}

	// Triton's request parameters: priority (1 is the highest; a level the
	// model lacks is its default) and timeout in microseconds, which may
	// only lower the model's default.
	prio, err := priorityParam(WireParams{wr.Parameters, wr.Pairs})
	if err != nil {
		return nil, 0, 0, apierr.BadRequest(err.Error())
	}
	timeout, _, err := intParam(WireParams{wr.Parameters, wr.Pairs}, "timeout")
	if err != nil {
		return nil, 0, 0, apierr.BadRequest(err.Error() + " (microseconds)")
	}
	req.params = serving.Params{Priority: prio, Timeout: time.Duration(timeout) * time.Microsecond}

	allBinary, err := boolParam(WireParams{wr.Parameters, wr.Pairs}, "binary_data_output")
	if err != nil {
		return nil, 0, 0, apierr.BadRequest(err.Error())
	}
	if len(wr.Outputs) == 0 {
		for i := range cfg.Outputs {
			req.Outputs = append(req.Outputs, OutputChoice{Index: i, Binary: allBinary})
		}
	}
	for _, o := range wr.Outputs {
		idx := specIndex(cfg.Outputs, o.Name)
		if idx < 0 {
			return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("unknown output %q; model %s gives %s", o.Name, m.Name, Signature(cfg.Outputs)))
		}
		for _, c := range req.Outputs {
			if c.Index == idx {
				return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("output %q is requested more than once", o.Name))
			}
		}
		params := WireParams{o.Parameters, o.Pairs}
		shm, err := shmParams(params)
		if err != nil {
			return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("output %q: %v", o.Name, err))
		}
		classes, err := classificationParam(params, cfg.Outputs[idx])
		if err != nil {
			return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("output %q: %v", o.Name, err))
		}
		// An output's own binary_data overrides the request's
		// binary_data_output, either way, as in Triton.
		bin := allBinary
		_, binSet := params.Get("binary_data")
		if binSet {
			if bin, err = boolParam(params, "binary_data"); err != nil {
				return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("output %q: %v", o.Name, err))
			}
		}
		if shm != nil {
			if err := checkShmOutput(shm, cfg.Outputs[idx], req.Rows, classes, binSet && bin); err != nil {
				return nil, 0, 0, apierr.BadRequest(fmt.Sprintf("output %q: %v", o.Name, err))
			}
			bin, req.shm = false, true
		}
		req.Outputs = append(req.Outputs, OutputChoice{Index: idx, Binary: bin, Classes: classes, SharedMemory: shm})
	}
	return req, decoded, seq, nil
}

// checkInput checks one input's datatype, shape and binary size against
// its spec, and returns the bytes its values will take once decoded and
// the binary data it claims. bodyLen bounds the elements a shape may
// claim, so that no declared shape can make the server allocate more than
// the body justifies; binLeft is the binary data the input may claim: what
// the inputs before it left of the body's, or its own.
func checkInput(in *WireInput, spec models.TensorSpec, bodyLen, binLeft int) (decoded int64, binSize int, err error) {
	if in.Datatype != string(spec.Datatype) {
		if _, perr := models.ParseDatatype(in.Datatype); perr != nil {
			return 0, 0, perr
		}
		return 0, 0, fmt.Errorf("datatype %s, want %s", in.Datatype, spec.Datatype)
	}
	if len(in.Shape) != len(spec.Shape) {
		return 0, 0, fmt.Errorf("shape %v has %d dimensions, want %d (%v)", in.Shape, len(in.Shape), len(spec.Shape), spec.Shape)
	}
	elems := int64(1)
	for i, d := range in.Shape {
		want := int64(spec.Shape[i])
		switch {
		case d < 0:
			return 0, 0, fmt.Errorf("shape %v: dimension %d is negative", in.Shape, i)
		case i == 0 && d == 0:
			return 0, 0, fmt.Errorf("shape %v: the batch dimension must be at least 1", in.Shape)
		case want < 0 && d == 0:
			return 0, 0, fmt.Errorf("shape %v: dimension %d (the sequence) must be at least 1", in.Shape, i)
		case want >= 0 && d != want:
			return 0, 0, fmt.Errorf("shape %v, want %v: dimension %d must be %d", in.Shape, spec.Shape, i, want)
		}
		if d > 0 && elems > math.MaxInt32/d {
			return 0, 0, fmt.Errorf("shape %v holds too many elements", in.Shape)
		}
		elems *= d
	}
	if in.shm != nil {
		decoded, err := checkShmInput(in, spec, elems)
		return decoded, 0, err
	}
	binSize, hasBin, err := intParam(WireParams{in.Parameters, in.Pairs}, "binary_data_size")
	if err != nil {
		return 0, 0, err
	}
	hasData := len(in.Data) > 0 && string(in.Data) != "null" || in.Contents != nil
	if !hasBin && !hasData {
		return 0, 0, fmt.Errorf("has no %s; send %[1]s or %s", in.dataTerm(), in.binTerm())
	}
	if elems > int64(bodyLen) {
		// Every value takes at least a byte on the wire: no declared shape
		// makes the server allocate more than the body justifies.
		return 0, 0, fmt.Errorf("shape %v declares %d elements, more than a %d-byte body can carry", in.Shape, elems, bodyLen)
	}
	if hasBin {
		if spec.Datatype != models.BYTES {
			if hasData {
				return 0, 0, fmt.Errorf("has both %s and %s; send one", in.dataTerm(), in.binTerm())
			}
			if nbytes := elems * int64(spec.Datatype.Size()); int64(binSize) != nbytes {
				return 0, 0, fmt.Errorf("%s is %d bytes, but %s %v needs %d", in.binTerm(), binSize, spec.Datatype, in.Shape, nbytes)
			}
		} else if hasData {
			return 0, 0, fmt.Errorf("has both %s and %s; send one", in.dataTerm(), in.binTerm())
		}
		if binSize > binLeft {
			return 0, 0, fmt.Errorf("binary_data_size is %d bytes, but only %d bytes of binary data remain in the body", binSize, binLeft)
		}
	}
	if spec.Datatype == models.BYTES {
		// A string header each, and the text, which unescaping only
		// shortens.
		const stringHeader = 16
		text := int64(len(in.Data))
		switch {
		case hasBin:
			text = int64(binSize)
		case in.Contents != nil:
			text = in.Contents.TextBytes()
		}
		decoded = stringHeader*elems + text
	} else {
		decoded = elems * int64(spec.Datatype.Size())
	}
	if !hasBin {
		binSize = 0
	}
	return decoded, binSize, nil
}

func specIndex(specs []models.TensorSpec, name string) int {
	for i, s := range specs {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// Signature describes tensors for error messages: `pixels (FP32 [-1 64])`.
func Signature(specs []models.TensorSpec) string {
	parts := make([]string, len(specs))
	for i, s := range specs {
		parts[i] = fmt.Sprintf("%q (%s %v)", s.Name, s.Datatype, s.Shape)
	}
	return strings.Join(parts, ", ")
}

func boolParam(params WireParams, key string) (bool, error) {
	raw, ok := params.Get(key)
	if !ok {
		return false, nil
	}
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	var v bool
	if err := json.Unmarshal(raw, &v); err != nil {
		return false, fmt.Errorf("parameter %s must be true or false, got %s", key, excerpt(raw))
	}
	return v, nil
}

func intParam(params WireParams, key string) (int, bool, error) {
	raw, ok := params.Get(key)
	if !ok {
		return 0, false, nil
	}
	v, ok := parseInt64(raw)
	if !ok {
		var slow int64
		if err := json.Unmarshal(raw, &slow); err != nil {
			slow = -1
		}
		v = slow
	}
	if v < 0 || v > math.MaxInt32 {
		return 0, true, fmt.Errorf("parameter %s must be a non-negative integer, got %s", key, excerpt(raw))
	}
	return int(v), true, nil
}
