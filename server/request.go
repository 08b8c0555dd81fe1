package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/models"
)

// The wire form of an Open Inference Protocol v2 inference request, with
// Triton's binary-tensor extension.
type wireRequest struct {
	ID         string                     `json:"id"`
	Parameters map[string]json.RawMessage `json:"parameters"`
	Inputs     []wireInput                `json:"inputs"`
	Outputs    []wireOutput               `json:"outputs"`
	pairs      paramPairs                 // Parameters as parseWire reads them
}

type wireInput struct {
	Name       string                     `json:"name"`
	Shape      []int64                    `json:"shape"`
	Datatype   string                     `json:"datatype"`
	Parameters map[string]json.RawMessage `json:"parameters"`
	Data       json.RawMessage            `json:"data"`
	pairs      paramPairs
}

// declared is what a checked input declares: its elements, and its
// binary_data_size when it has one. (Read again rather than kept, so that
// a request stays the size it was.)
func (in *wireInput) declared() (elems int64, binSize int, hasBin bool) {
	elems, _ = declaredElements(in.Shape)
	binSize, hasBin, _ = intParam(wireParams{in.Parameters, in.pairs}, "binary_data_size")
	return elems, binSize, hasBin
}

type wireOutput struct {
	Name       string                     `json:"name"`
	Parameters map[string]json.RawMessage `json:"parameters"`
	pairs      paramPairs
}

// paramPairs is a parameters object as parseWire reads it: its keys and
// raw values in order, with no map built for the one or two a request
// carries.
type paramPairs []paramPair

type paramPair struct {
	key string
	raw json.RawMessage
}

// wireParams is a parameters object from either decoder.
type wireParams struct {
	m     map[string]json.RawMessage
	pairs paramPairs
}

// get returns a parameter's raw value; the last of repeated keys wins, as
// it does in a map.
func (p wireParams) get(key string) (json.RawMessage, bool) {
	for i := len(p.pairs) - 1; i >= 0; i-- {
		if p.pairs[i].key == key {
			return p.pairs[i].raw, true
		}
	}
	raw, ok := p.m[key]
	return raw, ok
}

// inferRequest is a decoded, validated request.
type inferRequest struct {
	id      string
	rows    int
	inputs  []models.Input // one per model input, in model order; absent optional inputs are zero
	outputs []outputChoice
	params  batching.Params

	// The inputs as sent, in order, and the binary part of the body, which
	// decodeValues reads once the request is admitted.
	wire       []wireInput
	binaryPart []byte

	// Room for the usual few inputs and outputs, so that a request is
	// one allocation rather than three.
	inputsBuf  [3]models.Input
	outputsBuf [2]outputChoice
}

// outputChoice is one output to return, and how.
type outputChoice struct {
	index   int // into the model's outputs
	binary  bool
	classes int // the top classes to return per row (classification.go); 0 for the raw output
}

// decodeRequest parses and decodes a whole request: parseRequest, then
// decodeValues.
func decodeRequest(body []byte, headerLen int, m *models.Model, maxElements int64) (*inferRequest, error) {
	req, _, err := parseRequest(body, headerLen, m, maxElements)
	if err != nil {
		return nil, err
	}
	if err := req.decodeValues(m); err != nil {
		return nil, err
	}
	return req, nil
}

// parseRequest parses body as an inference request for m and checks
// everything but the tensors' values: names, datatypes, shapes, binary
// sizes, outputs and parameters; and bounds what the request will cost,
// before any tensor is built. headerLen is the value of
// Inference-Header-Content-Length, or -1 when the request has no binary
// part. Every error is a 400 that names the input or field at fault.
func parseRequest(body []byte, headerLen int, m *models.Model, maxElements int64) (*inferRequest, footprint, error) {
	header, binaryPart := body, []byte(nil)
	if headerLen >= 0 {
		if headerLen > len(body) {
			return nil, footprint{}, badRequest(fmt.Sprintf("Inference-Header-Content-Length %d exceeds the %d-byte body", headerLen, len(body)))
		}
		header, binaryPart = body[:headerLen], body[headerLen:]
	}
	cfg := m.Config
	lim := limitsOf(cfg)
	var wr wireRequest
	if !parseWire(header, &wr, lim) {
		// Not the plain form parseWire reads: encoding/json decides, and
		// its errors say what is wrong, once the limits parseWire keeps
		// are known to hold.
		if err := checkLimits(header, m, lim); err != nil {
			return nil, footprint{}, err
		}
		wr = wireRequest{}
		if err := json.Unmarshal(header, &wr); err != nil {
			return nil, footprint{}, badRequest(jsonErrorMessage(header, err))
		}
	}

	if len(wr.Inputs) == 0 {
		return nil, footprint{}, badRequest(fmt.Sprintf("request has no inputs; model %s takes %s", m.Name, signature(cfg.Inputs)))
	}
	req := &inferRequest{id: wr.ID, rows: -1, wire: wr.Inputs, binaryPart: binaryPart}
	req.inputs, req.outputs = req.inputsBuf[:0], req.outputsBuf[:0]
	if len(cfg.Inputs) > len(req.inputsBuf) {
		req.inputs = make([]models.Input, 0, len(cfg.Inputs))
	}
	req.inputs = req.inputs[:len(cfg.Inputs)]
	var seenBuf [8]bool
	seen := seenBuf[:0]
	if len(cfg.Inputs) > len(seenBuf) {
		seen = make([]bool, 0, len(cfg.Inputs))
	}
	seen = seen[:len(cfg.Inputs)]
	var elements, decoded int64
	seq := 0 // the longest sequence the inputs declare
	binLeft := len(binaryPart)
	for i := range wr.Inputs {
		in := &wr.Inputs[i]
		idx := specIndex(cfg.Inputs, in.Name)
		if idx < 0 {
			return nil, footprint{}, badRequest(fmt.Sprintf("unknown input %q; model %s takes %s", in.Name, m.Name, signature(cfg.Inputs)))
		}
		if seen[idx] {
			return nil, footprint{}, badRequest(fmt.Sprintf("input %q appears more than once", in.Name))
		}
		seen[idx] = true
		if n, ok := declaredElements(in.Shape); ok {
			if elements += n; elements > maxElements {
				return nil, footprint{}, badRequest(fmt.Sprintf("the inputs declare %d elements, above the limit of %d (server.max_request_elements)", elements, maxElements))
			}
		}
		spec := cfg.Inputs[idx]
		if err := refuseSharedMemory(wireParams{in.Parameters, in.pairs}); err != nil {
			return nil, footprint{}, badRequest(fmt.Sprintf("input %q: %v", in.Name, err))
		}
		size, binSize, err := checkInput(in, spec, len(body), binLeft)
		if err != nil {
			return nil, footprint{}, badRequest(fmt.Sprintf("input %q: %v", in.Name, err))
		}
		binLeft -= binSize
		decoded += size
		for d, want := range spec.Shape[1:] {
			if want < 0 {
				seq = max(seq, int(in.Shape[1+d]))
			}
		}
		rows := int(in.Shape[0])
		if req.rows >= 0 && rows != req.rows {
			return nil, footprint{}, badRequest(fmt.Sprintf("input %q has %d rows but an earlier input has %d; every input's first dimension is the batch and must agree", in.Name, rows, req.rows))
		}
		req.rows = rows
		req.inputs[idx].Shape = in.Shape
	}
	for i, s := range cfg.Inputs {
		if !seen[i] && !cfg.OptionalInput(s.Name) {
			return nil, footprint{}, badRequest(fmt.Sprintf("missing input %q (%s %v)", s.Name, s.Datatype, s.Shape))
		}
	}
	if binLeft > 0 {
		return nil, footprint{}, badRequest(fmt.Sprintf("%d bytes of binary data follow the inputs' binary_data_size total; the sizes and the body disagree", binLeft))
	}

	// Triton's request parameters: priority (1 is the highest; a level the
	// model lacks is its default) and timeout in microseconds, which may
	// only lower the model's default.
	prio, err := priorityParam(wireParams{wr.Parameters, wr.pairs})
	if err != nil {
		return nil, footprint{}, badRequest(err.Error())
	}
	timeout, _, err := intParam(wireParams{wr.Parameters, wr.pairs}, "timeout")
	if err != nil {
		return nil, footprint{}, badRequest(err.Error() + " (microseconds)")
	}
	req.params = batching.Params{Priority: prio, Timeout: time.Duration(timeout) * time.Microsecond}

	allBinary, err := boolParam(wireParams{wr.Parameters, wr.pairs}, "binary_data_output")
	if err != nil {
		return nil, footprint{}, badRequest(err.Error())
	}
	if len(wr.Outputs) == 0 {
		for i := range cfg.Outputs {
			req.outputs = append(req.outputs, outputChoice{index: i, binary: allBinary})
		}
	}
	for _, o := range wr.Outputs {
		idx := specIndex(cfg.Outputs, o.Name)
		if idx < 0 {
			return nil, footprint{}, badRequest(fmt.Sprintf("unknown output %q; model %s gives %s", o.Name, m.Name, signature(cfg.Outputs)))
		}
		for _, c := range req.outputs {
			if c.index == idx {
				return nil, footprint{}, badRequest(fmt.Sprintf("output %q is requested more than once", o.Name))
			}
		}
		params := wireParams{o.Parameters, o.pairs}
		if err := refuseSharedMemory(params); err != nil {
			return nil, footprint{}, badRequest(fmt.Sprintf("output %q: %v", o.Name, err))
		}
		classes, err := classificationParam(params, cfg.Outputs[idx])
		if err != nil {
			return nil, footprint{}, badRequest(fmt.Sprintf("output %q: %v", o.Name, err))
		}
		// An output's own binary_data overrides the request's
		// binary_data_output, either way, as in Triton.
		bin := allBinary
		if _, ok := params.get("binary_data"); ok {
			if bin, err = boolParam(params, "binary_data"); err != nil {
				return nil, footprint{}, badRequest(fmt.Sprintf("output %q: %v", o.Name, err))
			}
		}
		req.outputs = append(req.outputs, outputChoice{index: idx, binary: bin, classes: classes})
	}
	return req, footprintOf(m, req, decoded, seq), nil
}

// checkInput checks one input's datatype, shape and binary size against
// its spec, and returns the bytes its values will take once decoded and
// the binary data it claims. bodyLen bounds the elements a shape may
// claim, so that no declared shape can make the server allocate more than
// the body justifies; binLeft is the binary data not claimed by the inputs
// before it.
func checkInput(in *wireInput, spec models.TensorSpec, bodyLen, binLeft int) (decoded int64, binSize int, err error) {
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
	binSize, hasBin, err := intParam(wireParams{in.Parameters, in.pairs}, "binary_data_size")
	if err != nil {
		return 0, 0, err
	}
	hasData := len(in.Data) > 0 && string(in.Data) != "null"
	if !hasBin && !hasData {
		return 0, 0, errors.New("has no data; send data or binary_data_size")
	}
	if elems > int64(bodyLen) {
		// Every value takes at least a byte on the wire: no declared shape
		// makes the server allocate more than the body justifies.
		return 0, 0, fmt.Errorf("shape %v declares %d elements, more than a %d-byte body can carry", in.Shape, elems, bodyLen)
	}
	if hasBin {
		if spec.Datatype != models.BYTES {
			if hasData {
				return 0, 0, errors.New("has both data and binary_data_size; send one")
			}
			if nbytes := elems * int64(spec.Datatype.Size()); int64(binSize) != nbytes {
				return 0, 0, fmt.Errorf("binary_data_size is %d bytes, but %s %v needs %d", binSize, spec.Datatype, in.Shape, nbytes)
			}
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
		if hasBin {
			text = int64(binSize)
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

// decodeValues decodes the inputs' values into place, in the order they
// were sent, which is the order of their binary data.
func (req *inferRequest) decodeValues(m *models.Model) error {
	rest := req.binaryPart
	for i := range req.wire {
		in := &req.wire[i]
		idx := specIndex(m.Config.Inputs, in.Name)
		t := &req.inputs[idx]
		var err error
		if t.Data, t.Strings, rest, err = decodeValues(in, m.Config.Inputs[idx], rest); err != nil {
			return badRequest(fmt.Sprintf("input %q: %v", in.Name, err))
		}
	}
	return nil
}

// decodeValues decodes one checked input's values, taking its binary data
// from the front of binaryPart.
func decodeValues(in *wireInput, spec models.TensorSpec, binaryPart []byte) (data []byte, strs []string, rest []byte, err error) {
	elems, binSize, hasBin := in.declared()
	if spec.Datatype == models.BYTES {
		strs, rest, err := decodeStrings(in, int(elems), binSize, hasBin, binaryPart)
		return nil, strs, rest, err
	}
	data = make([]byte, int(elems)*spec.Datatype.Size())
	if hasBin {
		copy(data, binaryPart[:binSize])
		rest = binaryPart[binSize:]
	} else {
		n, err := decodeJSONData(in.Data, spec.Datatype, data, len(in.Shape))
		if err != nil {
			return nil, nil, nil, err
		}
		if int64(n) != elems {
			return nil, nil, nil, fmt.Errorf("shape %v needs %d values, data has %d", in.Shape, elems, n)
		}
		rest = binaryPart
	}
	if err := checkFinite(data, spec.Datatype); err != nil {
		return nil, nil, nil, err
	}
	return data, nil, rest, nil
}

// declaredElements is the product of a shape's dimensions, when they are
// all non-negative and the product fits; the detailed shape checks come
// later.
func declaredElements(shape []int64) (int64, bool) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt64/d) {
			return 0, false
		}
		n *= d
	}
	return n, true
}

func specIndex(specs []models.TensorSpec, name string) int {
	for i, s := range specs {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// signature describes tensors for error messages: `pixels (FP32 [-1 64])`.
func signature(specs []models.TensorSpec) string {
	parts := make([]string, len(specs))
	for i, s := range specs {
		parts[i] = fmt.Sprintf("%q (%s %v)", s.Name, s.Datatype, s.Shape)
	}
	return strings.Join(parts, ", ")
}

// refuseSharedMemory refuses a tensor's shared-memory parameters: the
// extensions that would put its data in a registered region are not
// implemented, and answering inline instead would hide that.
func refuseSharedMemory(params wireParams) error {
	for _, key := range []string{"shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"} {
		if _, ok := params.get(key); ok {
			return fmt.Errorf("parameter %s: the shared-memory extensions (system and CUDA) are not supported; send the data in the request", key)
		}
	}
	return nil
}

func boolParam(params wireParams, key string) (bool, error) {
	raw, ok := params.get(key)
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

func intParam(params wireParams, key string) (int, bool, error) {
	raw, ok := params.get(key)
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

// jsonErrorMessage explains a JSON decoding error with its byte offset, and
// recognises NaN and Infinity, which Python's json module writes by default
// but JSON does not allow.
func jsonErrorMessage(body []byte, err error) string {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		at := int(syn.Offset) - 1
		if at >= 0 && at < len(body) {
			rest := body[at:]
			for _, lit := range []string{"NaN", "Infinity", "-Infinity"} {
				if bytes.HasPrefix(rest, []byte(lit)) {
					return fmt.Sprintf("malformed JSON at byte %d: %s is not a JSON number; values must be finite", at, lit)
				}
			}
		}
		return fmt.Sprintf("malformed JSON at byte %d: %v", syn.Offset, err)
	}
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		field := typ.Field
		if field == "" {
			field = "request"
		}
		return fmt.Sprintf("malformed request: %s must be %s, got a JSON %s (byte %d)", field, jsonKind(typ.Type.Kind().String()), typ.Value, typ.Offset)
	}
	return "malformed request: " + err.Error()
}

func jsonKind(k string) string {
	switch k {
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	case "int64", "int":
		return "an integer"
	}
	return "a " + k
}

// excerpt shows a raw JSON value in a message: as it is when short, clipped
// and quoted when long.
func excerpt(b []byte) string {
	if len(b) > 32 {
		return strconv.Quote(clip.Clip(b, 32))
	}
	return string(b)
}
