package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
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
		return elems, len(in.Bin), true // copied out of its region (ReadSharedMemory)
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

// SharedMemory reports whether a tensor of the request lies in shared
// memory: its regions are then held while it runs.
func (req *InferRequest) SharedMemory() bool { return req.shm }

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
	// written to ([Call.Infer]), when its parameters name one: the
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
			return nil, Footprint{}, apierr.BadRequest(fmt.Sprintf("Inference-Header-Content-Length %d exceeds the %d-byte body", headerLen, len(body)))
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
			return nil, Footprint{}, apierr.BadRequest(JSONErrorMessage(header, err))
		}
	}
	req, decoded, seq, err := CheckRequest(&wr, binaryPart, len(body), m, maxElements)
	if err != nil {
		return nil, Footprint{}, err
	}
	return req, FootprintOf(m, req, decoded, seq), nil
}

// DecodeValues decodes the inputs' values into place.
func (req *InferRequest) DecodeValues(m *models.Model) error {
	for i := range req.wire {
		in := &req.wire[i]
		idx := specIndex(m.Config.Inputs, in.Name)
		t := &req.Inputs[idx]
		var err error
		if t.Data, t.Strings, err = decodeValues(in, m.Config.Inputs[idx]); err != nil {
			return apierr.BadRequest(fmt.Sprintf("input %q: %v", in.Name, err))
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
