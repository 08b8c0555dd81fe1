package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
)

// The wire form of an Open Inference Protocol v2 inference request, with
// Triton's binary-tensor extension.
type WireRequest struct {
	ID         string                     `json:"id"`
	Parameters map[string]json.RawMessage `json:"parameters"`
	Inputs     []WireInput                `json:"inputs"`
	Outputs    []WireOutput               `json:"outputs"`
	Pairs      ParamPairs                 // Parameters as parseWire reads them
}

type WireInput struct {
	Name       string                     `json:"name"`
	Shape      []int64                    `json:"shape"`
	Datatype   string                     `json:"datatype"`
	Parameters map[string]json.RawMessage `json:"parameters"`
	Data       json.RawMessage            `json:"data"`
	Pairs      ParamPairs

	// Bin is the input's binary data: the share of an HTTP body's binary
	// part that its binary_data_size claims (set by checkRequest), or its
	// entry of gRPC's raw_input_contents (set by the gRPC adapter, with
	// binary_data_size its length: binSet).
	Bin    []byte
	BinSet bool
	// Contents are the input's values as gRPC's typed Contents carry
	// them; nil for HTTP, and for gRPC inputs sent raw.
	Contents TypedContents
	// Proto says the input came over gRPC, for the names error messages
	// give its fields.
	Proto bool

	// shm is where the input's data lies in shared memory, from its
	// parameters (set by CheckRequest); nil when it is in the request.
	shm *ShmTensor
}

// TypedContents are an input's values as typed protocol fields carry them
// (gRPC's InferTensorContents), read by the protocol's adapter. Every
// check on them is the caller's: names, shapes, counts, finite values.
type TypedContents interface {
	// Count is how many values of dt the contents hold; an error when
	// they hold values in a field dt does not take.
	Count(dt models.Datatype) (int, error)
	// Put writes the count(dt) values into dst, packed little-endian as
	// dt; an error names the first value out of dt's range.
	Put(dt models.Datatype, dst []byte) error
	// Strings appends the BYTES elements to out.
	Strings(out []string) []string
	// TextBytes is the length of the BYTES elements together.
	TextBytes() int64
}

// dataTerm and binTerm name an input's two ways of carrying values, as its
// protocol spells them.
func (in *WireInput) dataTerm() string {
	if in.Proto {
		return "contents"
	}
	return "data"
}

func (in *WireInput) binTerm() string {
	if in.Proto {
		return "raw_input_contents"
	}
	return "binary_data_size"
}

// declared is what a checked input declares: its elements, and its
// binary_data_size when it has one. (Read again rather than kept, so that
// a request stays the size it was.)
func (in *WireInput) declared() (elems int64, binSize int, hasBin bool) {
	elems, _ = models.ShapeElements(in.Shape)
	if in.shm != nil {
		return elems, len(in.Bin), true // copied out of its region (readSharedMemory)
	}
	binSize, hasBin, _ = intParam(WireParams{in.Parameters, in.Pairs}, "binary_data_size")
	return elems, binSize, hasBin
}

type WireOutput struct {
	Name       string                     `json:"name"`
	Parameters map[string]json.RawMessage `json:"parameters"`
	Pairs      ParamPairs
}

// ParamPairs is a parameters object as parseWire reads it: its keys and
// raw values in order, with no map built for the one or two a request
// carries.
type ParamPairs []ParamPair

type ParamPair struct {
	Key string
	Raw json.RawMessage
}

// WireParams is a parameters object from either decoder.
type WireParams struct {
	m     map[string]json.RawMessage
	Pairs ParamPairs
}

// Get returns a parameter's raw value; the last of repeated keys wins, as
// it does in a map.
func (p WireParams) Get(key string) (json.RawMessage, bool) {
	for i := len(p.Pairs) - 1; i >= 0; i-- {
		if p.Pairs[i].Key == key {
			return p.Pairs[i].Raw, true
		}
	}
	raw, ok := p.m[key]
	return raw, ok
}

// InferRequest is a decoded, validated request.
type InferRequest struct {
	ID      string
	Rows    int
	Trace   *trace.Request // nil unless tracing sampled the request
	Inputs  []models.Input // one per model input, in model order; absent optional inputs are zero
	Outputs []OutputChoice
	params  serving.Params

	// The inputs as sent, in order, each with its binary data, which
	// decodeValues reads once the request is admitted.
	wire []WireInput
	// shm says a tensor's data is in shared memory (sharedmemory_tensor.go).
	shm bool

	// Room for the usual few inputs and outputs, so that a request is
	// one allocation rather than three.
	InputsBuf  [3]models.Input
	OutputsBuf [2]OutputChoice
}

// ForModel is the request as the model runs it.
func (req *InferRequest) ForModel() *serving.Request {
	return &serving.Request{Rows: req.Rows, Inputs: req.Inputs, Params: req.params, Trace: req.Trace}
}

// OutputChoice is one output to return, and how.
type OutputChoice struct {
	Index   int // into the model's outputs
	Binary  bool
	Classes int // the top classes to return per row (classification.go); 0 for the raw output
	// SharedMemory is the range of a registered region the output is
	// written to ([Core.Run]), when its parameters name one: the
	// response then carries its metadata and the region's parameters, no
	// data.
	SharedMemory *ShmTensor
}

// DecodeRequest parses and decodes a whole request: parseRequest, then
// decodeValues.
func DecodeRequest(body []byte, headerLen int, m *models.Model, maxElements int64) (*InferRequest, error) {
	req, _, err := ParseRequest(body, headerLen, m, maxElements)
	if err != nil {
		return nil, err
	}
	if err := req.DecodeValues(m); err != nil {
		return nil, err
	}
	return req, nil
}

// ParseRequest parses body as an inference request for m, then checks it
// with checkRequest, and bounds what the request and its JSON response
// will cost, before any tensor is built. headerLen is the value of
// Inference-Header-Content-Length, or -1 when the request has no binary
// part. Every error is a 400 that names the input or field at fault.
func ParseRequest(body []byte, headerLen int, m *models.Model, maxElements int64) (*InferRequest, Footprint, error) {
	header, binaryPart := body, []byte(nil)
	if headerLen >= 0 {
		if headerLen > len(body) {
			return nil, Footprint{}, BadRequest(fmt.Sprintf("Inference-Header-Content-Length %d exceeds the %d-byte body", headerLen, len(body)))
		}
		header, binaryPart = body[:headerLen], body[headerLen:]
	}
	cfg := m.Config
	lim := limitsOf(cfg)
	var wr WireRequest
	if !parseWire(header, &wr, lim) {
		// Not the plain form parseWire reads: encoding/json decides, and
		// its errors say what is wrong, once the limits parseWire keeps
		// are known to hold.
		if err := checkLimits(header, m, lim); err != nil {
			return nil, Footprint{}, err
		}
		wr = WireRequest{}
		if err := json.Unmarshal(header, &wr); err != nil {
			return nil, Footprint{}, BadRequest(JSONErrorMessage(header, err))
		}
	}
	req, decoded, seq, err := CheckRequest(&wr, binaryPart, len(body), m, maxElements)
	if err != nil {
		return nil, Footprint{}, err
	}
	return req, FootprintOf(m, req, decoded, seq), nil
}

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
		return nil, 0, 0, BadRequest(fmt.Sprintf("request has no inputs; model %s takes %s", m.Name, Signature(cfg.Inputs)))
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
			return nil, 0, 0, BadRequest(fmt.Sprintf("unknown input %q; model %s takes %s", in.Name, m.Name, Signature(cfg.Inputs)))
		}
		if seen[idx] {
			return nil, 0, 0, BadRequest(fmt.Sprintf("input %q appears more than once", in.Name))
		}
		seen[idx] = true
		if n, ok := models.ShapeElements(in.Shape); ok {
			if elements += n; elements > maxElements {
				return nil, 0, 0, BadRequest(fmt.Sprintf("the inputs declare %d elements, above the limit of %d (server.max_request_elements)", elements, maxElements))
			}
		}
		spec := cfg.Inputs[idx]
		if in.shm, err = shmParams(WireParams{in.Parameters, in.Pairs}); err != nil {
			return nil, 0, 0, BadRequest(fmt.Sprintf("input %q: %v", in.Name, err))
		}
		req.shm = req.shm || in.shm != nil
		avail := binLeft
		if in.BinSet {
			avail = len(in.Bin)
		}
		size, binSize, err := checkInput(in, spec, bodyLen, avail)
		if err != nil {
			return nil, 0, 0, BadRequest(fmt.Sprintf("input %q: %v", in.Name, err))
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
			return nil, 0, 0, BadRequest(fmt.Sprintf("input %q has %d rows but an earlier input has %d; every input's first dimension is the batch and must agree", in.Name, rows, req.Rows))
		}
		req.Rows = rows
		req.Inputs[idx].Shape = in.Shape
	}
	for i, s := range cfg.Inputs {
		if !seen[i] && !cfg.OptionalInput(s.Name) {
			return nil, 0, 0, BadRequest(fmt.Sprintf("missing input %q (%s %v)", s.Name, s.Datatype, s.Shape))
		}
	}
	if binLeft > 0 {
		return nil, 0, 0, BadRequest(fmt.Sprintf("%d bytes of binary data follow the inputs' binary_data_size total; the sizes and the body disagree", binLeft))
	}

	// Triton's request parameters: priority (1 is the highest; a level the
	// model lacks is its default) and timeout in microseconds, which may
	// only lower the model's default.
	prio, err := priorityParam(WireParams{wr.Parameters, wr.Pairs})
	if err != nil {
		return nil, 0, 0, BadRequest(err.Error())
	}
	timeout, _, err := intParam(WireParams{wr.Parameters, wr.Pairs}, "timeout")
	if err != nil {
		return nil, 0, 0, BadRequest(err.Error() + " (microseconds)")
	}
	req.params = serving.Params{Priority: prio, Timeout: time.Duration(timeout) * time.Microsecond}

	allBinary, err := boolParam(WireParams{wr.Parameters, wr.Pairs}, "binary_data_output")
	if err != nil {
		return nil, 0, 0, BadRequest(err.Error())
	}
	if len(wr.Outputs) == 0 {
		for i := range cfg.Outputs {
			req.Outputs = append(req.Outputs, OutputChoice{Index: i, Binary: allBinary})
		}
	}
	for _, o := range wr.Outputs {
		idx := specIndex(cfg.Outputs, o.Name)
		if idx < 0 {
			return nil, 0, 0, BadRequest(fmt.Sprintf("unknown output %q; model %s gives %s", o.Name, m.Name, Signature(cfg.Outputs)))
		}
		for _, c := range req.Outputs {
			if c.Index == idx {
				return nil, 0, 0, BadRequest(fmt.Sprintf("output %q is requested more than once", o.Name))
			}
		}
		params := WireParams{o.Parameters, o.Pairs}
		shm, err := shmParams(params)
		if err != nil {
			return nil, 0, 0, BadRequest(fmt.Sprintf("output %q: %v", o.Name, err))
		}
		classes, err := classificationParam(params, cfg.Outputs[idx])
		if err != nil {
			return nil, 0, 0, BadRequest(fmt.Sprintf("output %q: %v", o.Name, err))
		}
		// An output's own binary_data overrides the request's
		// binary_data_output, either way, as in Triton.
		bin := allBinary
		_, binSet := params.Get("binary_data")
		if binSet {
			if bin, err = boolParam(params, "binary_data"); err != nil {
				return nil, 0, 0, BadRequest(fmt.Sprintf("output %q: %v", o.Name, err))
			}
		}
		if shm != nil {
			if err := checkShmOutput(shm, cfg.Outputs[idx], req.Rows, classes, binSet && bin); err != nil {
				return nil, 0, 0, BadRequest(fmt.Sprintf("output %q: %v", o.Name, err))
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

// DecodeValues decodes the inputs' values into place.
func (req *InferRequest) DecodeValues(m *models.Model) error {
	for i := range req.wire {
		in := &req.wire[i]
		idx := specIndex(m.Config.Inputs, in.Name)
		t := &req.Inputs[idx]
		var err error
		if t.Data, t.Strings, err = decodeValues(in, m.Config.Inputs[idx]); err != nil {
			return BadRequest(fmt.Sprintf("input %q: %v", in.Name, err))
		}
	}
	return nil
}

// decodeValues decodes one checked input's values: its binary data, its
// typed contents or its JSON data.
func decodeValues(in *WireInput, spec models.TensorSpec) (data []byte, strs []string, err error) {
	elems, _, hasBin := in.declared()
	if spec.Datatype == models.BYTES {
		strs, err := decodeStrings(in, int(elems), hasBin)
		return nil, strs, err
	}
	n := elems
	switch {
	case in.shm != nil:
		data = in.Bin // the request's own copy, checked to be the shape's size
	case hasBin:
		// checkInput held it to the shape's size (an HTTP body's share, or
		// gRPC's raw contents); cloned, not zeroed first.
		data = slices.Clone(in.Bin)
	case in.Contents != nil:
		// Counted before anything is allocated for them.
		c, err := in.Contents.Count(spec.Datatype)
		if err != nil {
			return nil, nil, err
		}
		if n = int64(c); n == elems {
			data = make([]byte, int(elems)*spec.Datatype.Size())
			if err := in.Contents.Put(spec.Datatype, data); err != nil {
				return nil, nil, err
			}
		}
	default:
		data = make([]byte, int(elems)*spec.Datatype.Size())
		c, err := decodeJSONData(in.Data, spec.Datatype, data, len(in.Shape))
		if err != nil {
			return nil, nil, err
		}
		n = int64(c)
	}
	if n != elems {
		return nil, nil, fmt.Errorf("shape %v needs %d values, %s has %d", in.Shape, elems, in.dataTerm(), n)
	}
	if err := checkFinite(data, spec.Datatype); err != nil {
		return nil, nil, err
	}
	return data, nil, nil
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

// JSONErrorMessage explains a JSON decoding error with its byte offset, and
// recognises NaN and Infinity, which Python's json module writes by default
// but JSON does not allow.
func JSONErrorMessage(body []byte, err error) string {
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
