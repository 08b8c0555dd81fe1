// The control protocol: the typed messages the supervisor and its worker
// exchange, and their framing (a 4-byte big-endian length, then a JSON
// object; a load's staging memory travels beside it as a descriptor). The
// Python side is worker/stepserve_worker/protocol.py, and the field names
// are those worker.py and nets.py read and write.
//
// The worker answers ping, memory, cancel and shutdown at once, on its main
// thread; load, compile, step and unload run one at a time, in the order
// sent, on its device thread. Before a device request that builds a graph
// (load, compile, a bucket's first step) the worker sends "building": it
// may then hold the interpreter for minutes and answer nothing.

package rbln

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/internal/clip"
)

// protocolVersion is the control protocol both sides must speak; the
// worker announces its own in its hello.
const protocolVersion = 3

// maxFrame bounds a control message; a longer length prefix means a corrupt
// stream.
const maxFrame = 16 << 20

// ErrProtocol is wrapped by errors about a malformed message from a worker.
var ErrProtocol = errors.New("rbln: worker protocol error")

// header opens every message: its kind, and the id that pairs a request
// with its result (or a ping with its pong).
type header struct {
	Type string `json:"type"`
	ID   uint64 `json:"id"`
}

// address is promoted to every request, which embeds header.
func (h *header) address(kind string, id uint64) { h.Type, h.ID = kind, id }

// A request is one kind of message the supervisor sends. On the wire its
// fields sit beside the header's type and id, which [conn.call] fills in.
type request interface {
	kind() string
	address(kind string, id uint64)
}

// pingRequest asks for a pong; the worker answers it at once, unless a
// graph it builds holds the interpreter, so an unanswered ping means a hung
// worker only while it builds nothing.
type pingRequest struct{ header }

// loadRequest describes a model to the worker: the hyper-parameters, the
// weights file it reads itself, the dtype it must compute in, and where
// every bucket's buffers lie in the staging memory sent with it.
type loadRequest struct {
	header
	Model string `json:"model"` // the program's key: the name and a load number
	// Name and Version are the model's own, which name its compiled
	// programs' cache directory across loads and restarts.
	Name    string `json:"name"`
	Version string `json:"version"`
	Slot    uint32 `json:"slot"` // the program's number on the step doorbell
	Weights string `json:"weights"`
	// WeightFiles are sharded weights' files, in order (Weights is the
	// first); absent for one file.
	WeightFiles []string `json:"weight_files,omitempty"`
	// SkipTensors are the weights' tensors the model does not use
	// (models.Model.Skipped): the worker does not read them.
	SkipTensors     []string `json:"skip_tensors,omitempty"`
	Architecture    string   `json:"architecture"`
	DeviceDtype     string   `json:"device_dtype"`
	ComputeDtype    string   `json:"compute_dtype"` // of floats in staging; the worker computes in it or refuses
	CompileCacheDir string   `json:"compile_cache_dir"`
	// TorchCompile and StrictWarmup are Options'.
	TorchCompile string `json:"torch_compile,omitempty"`
	StrictWarmup bool   `json:"strict_warmup"`
	// TPFailover: a bucket whose program fails across an RSD group is
	// compiled again with num_devices=1 (models.Config.TPFailover).
	TPFailover bool         `json:"tp_failover,omitempty"`
	Buckets    []bucketSpec `json:"buckets"`
	MLP        *mlpSpec     `json:"mlp,omitempty"`
	Encoder    *encoderSpec `json:"encoder,omitempty"`
	Torch      *torchSpec   `json:"torch,omitempty"`
	Decoder    *decoderSpec `json:"decoder,omitempty"`

	staging *os.File // sent with the message, as its descriptor 0
}

// bucketSpec is one bucket's shape and its buffers: a descriptor sent with
// the load (an index into them), an offset in it and a length, and the
// graph boundary each holds: [batch, row] elements of a dtype, the first
// cols of each row data and the rest zeros (see boundary).
type bucketSpec struct {
	Batch     int    `json:"batch"`
	Seq       int    `json:"seq"`
	Ctx       int    `json:"ctx,omitempty"`  // a decode step's context partition
	Mask      bool   `json:"mask,omitempty"` // a decode step whose rows carry token masks
	InFD      int    `json:"in_fd"`
	InOffset  int    `json:"in_offset"`
	InBytes   int    `json:"in_bytes"`
	InDtype   string `json:"in_dtype"`
	InCols    int    `json:"in_cols"`
	InRow     int    `json:"in_row"`
	OutFD     int    `json:"out_fd"`
	OutOffset int    `json:"out_offset"`
	OutBytes  int    `json:"out_bytes"`
	OutDtype  string `json:"out_dtype"`
	OutCols   int    `json:"out_cols"`
	OutRow    int    `json:"out_row"`
	// Lanes are the bucket's other staging lanes (the first is the
	// offsets above): the same layout, elsewhere in the memory sent.
	Lanes []laneSpec `json:"lanes,omitempty"`
}

// laneSpec is where one more lane's buffers of a bucket lie.
type laneSpec struct {
	InOffset  int `json:"in_offset"`
	OutOffset int `json:"out_offset"`
}

type mlpSpec struct {
	Sizes            []int  `json:"sizes"`
	Activation       string `json:"activation"`
	OutputActivation string `json:"output_activation"`
}

// torchSpec is an architecture torch model: the user's module file,
// factory and its config, the weights (optional), and the signature.
type torchSpec struct {
	Module  string         `json:"module"`
	Name    string         `json:"name"` // the module's path in the repository, for messages
	Factory string         `json:"factory"`
	Config  map[string]any `json:"config"`
	Weights string         `json:"weights,omitempty"`
	Inputs  []tensorSpec   `json:"inputs"`
	Outputs []tensorSpec   `json:"outputs"`
}

// tensorSpec is one input or output of a torch model: its shape after the
// batch, -1 for the variable dimension.
type tensorSpec struct {
	Name     string `json:"name"`
	Datatype string `json:"datatype"`
	Shape    []int  `json:"shape"`
}

type encoderSpec struct {
	VocabSize     int     `json:"vocab_size"`
	Hidden        int     `json:"hidden"`
	Layers        int     `json:"layers"`
	Heads         int     `json:"heads"`
	Intermediate  int     `json:"intermediate"`
	MaxPosition   int     `json:"max_position"`
	TypeVocabSize int     `json:"type_vocab_size"`
	LayerNormEps  float64 `json:"layer_norm_eps"`
	Pooling       string  `json:"pooling"`
	Normalize     bool    `json:"normalize"`
	// The family keys (protocol 3 extended: a worker reads each with the
	// BERT default when it is absent, so a message without them is a BERT
	// embedding model as before).
	Family     string `json:"family"`
	HiddenAct  string `json:"hidden_act"`
	PadTokenID int    `json:"pad_token_id"`
	Head       string `json:"head"`
	NumLabels  int    `json:"num_labels,omitempty"`
}

// compileRequest builds one bucket's graph and binds its input buffer.
type compileRequest struct {
	header
	Model  string `json:"model"`
	Bucket int    `json:"bucket"`
}

// stepRequest runs one bucket's graph on its staging buffers.
type stepRequest struct {
	header
	Model  string `json:"model"`
	Bucket int    `json:"bucket"`
	Lane   int    `json:"lane,omitempty"` // the staging lane; 0 when absent
	// Profile runs the step inside torch.profiler (trace level PROFILE),
	// whose events come back in the reply.
	Profile bool `json:"profile,omitempty"`
}

// unloadRequest frees a model's device memory and staging mappings.
type unloadRequest struct {
	header
	Model string `json:"model"`
}

// memoryRequest asks for the device memory per chiplet.
type memoryRequest struct{ header }

// cancelRequest tells the worker that the caller of a device request gave
// up: if it has not started, the worker skips it (and answers that it did).
// It has no answer of its own.
type cancelRequest struct {
	header
	Target uint64 `json:"target"`
}

// shutdownRequest asks the worker to exit once its current device request
// is done. It has no answer.
type shutdownRequest struct{ header }

func (*pingRequest) kind() string    { return "ping" }
func (*loadRequest) kind() string    { return "load" }
func (*compileRequest) kind() string { return "compile" }
func (*stepRequest) kind() string    { return "step" }
func (*unloadRequest) kind() string  { return "unload" }
func (*memoryRequest) kind() string  { return "memory" }

func (*cancelRequest) kind() string   { return "cancel" }
func (*shutdownRequest) kind() string { return "shutdown" }

// files are the descriptors that travel with a request.
func (r *loadRequest) files() []*os.File { return []*os.File{r.staging} }

// queued reports whether the worker runs req on its device thread, in
// order, where a cancel can still skip it. An unload is never skipped: the
// model's memory must go.
func queued(req request) bool {
	switch req.(type) {
	case *loadRequest, *compileRequest, *stepRequest:
		return true
	}
	return false
}

// describe names a request in error messages.
func describe(req request) string {
	switch r := req.(type) {
	case *loadRequest:
		return fmt.Sprintf("load of %s", r.Model)
	case *compileRequest:
		return fmt.Sprintf("compile of %s bucket %d", r.Model, r.Bucket)
	case *stepRequest:
		return fmt.Sprintf("step of %s bucket %d", r.Model, r.Bucket)
	}
	return req.kind()
}

// message is what the worker sends: its hello, a pong, the result of a
// request, or word that it is building a graph for one. body keeps the whole frame, from which the caller decodes the
// fields of the reply it expects.
type message struct {
	header
	OK    bool   `json:"ok"`    // results only
	Error string `json:"error"` // results that are not OK
	body  []byte
}

// hello is the worker's greeting, its first message.
type hello struct {
	Protocol int      `json:"protocol"`
	PID      int      `json:"pid"`
	Torch    string   `json:"torch"`
	Device   string   `json:"device"`
	Notes    []string `json:"notes"`

	// Where the worker computes (the --device it was given: rbln or cpu),
	// and, on rbln, why it cannot (empty when it can) and what torch.rbln
	// says of the devices (nil or empty when unknown).
	DeviceKind          string `json:"device_kind"`
	Unusable            string `json:"unusable"`
	DeviceCount         *int   `json:"device_count"`
	PhysicalDeviceCount *int   `json:"physical_device_count"`
	DeviceSummary       string `json:"device_summary"`
	// Doorbell says the worker took the binary step path's descriptors.
	Doorbell bool `json:"doorbell"`
}

// loadReply says where and how the worker placed a model.
type loadReply struct {
	Device   string `json:"device"`
	Compiled bool   `json:"compiled"`
	Compiler string `json:"compiler"` // inductor, rbln or none
	// CompileNote says why no compiler builds the steps, where none does.
	CompileNote  string   `json:"compile_note"`
	ComputeDtype string   `json:"compute_dtype"`
	Notes        []string `json:"notes"`
	// Staging is every bucket's staging as the worker mapped it.
	Staging []stagingView `json:"staging"`
}

// stagingView is one bucket's input and output staging as the worker's
// tensors over it are.
type stagingView struct {
	In  tensorView `json:"in"`
	Out tensorView `json:"out"`
}

type tensorView struct {
	Dtype        string `json:"dtype"`
	Shape        []int  `json:"shape"`
	ElementBytes int    `json:"element_bytes"`
}

// compileReply reports a bucket's build; nothing has run on it yet.
type compileReply struct {
	CompileSeconds float64 `json:"compile_seconds"`
}

// stepReply reports one step.
type stepReply struct {
	Explain engine.Explain `json:"explain"`
	// BodyNS is the time of the step's body in the worker; 0 when it did
	// not say (a first step, whose body builds the graph).
	BodyNS  int64         `json:"body_ns"`
	Profile *profileReply `json:"profile"`
	// HostOps is what inspecting the bucket's program found, on the step
	// that built it; nil on the others.
	HostOps *hostOpsReply `json:"host_ops"`
}

// hostOpsReply is the worker's inspection of one bucket's compiled
// program (programs.py): Count is nil where it could not inspect it, and
// Reason says why.
type hostOpsReply struct {
	Count     *int64            `json:"count"`
	Ops       map[string]string `json:"ops"`
	Reason    string            `json:"reason"`
	Artifacts int               `json:"artifacts"`
}

// profileReply is a profiled step's torch.profiler trace: its Chrome
// events (the worker bounds them), how many it left out, the activities
// it profiled and the name prefix of its range around the step body.
type profileReply struct {
	Events       json.RawMessage `json:"events"`
	Dropped      int             `json:"dropped"`
	Activities   []string        `json:"activities"`
	Anchor       string          `json:"anchor"`
	DeviceEvents int             `json:"device_events"`
}

// memoryReply is the device memory per chiplet; empty where the worker
// cannot read it. Cached is true for the worker's last reading, which it
// gives while a device request runs.
type memoryReply struct {
	Chiplets []chipletMemory `json:"chiplets"`
	Cached   bool            `json:"cached"`
	// AgeSeconds is how old the reading is (0: read now); nil from a
	// worker that does not say, negative when it has none.
	AgeSeconds *float64 `json:"age_seconds"`
}

type chipletMemory struct {
	NPU     string  `json:"npu"`
	Chiplet string  `json:"chiplet"`
	Kind    string  `json:"kind"` // allocated, reserved, active, cached (and each _peak), or the event counts num_ooms and num_alloc_retries
	Bytes   float64 `json:"bytes"`
}

// writeFrame writes one length-prefixed JSON message.
func writeFrame(w io.Writer, v any) error {
	frame, err := encodeFrame(v)
	if err != nil {
		return err
	}
	_, err = w.Write(frame)
	return err
}

// encodeFrame is one length-prefixed JSON message.
func encodeFrame(v any) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(body) > maxFrame {
		return nil, fmt.Errorf("%w: message of %d bytes exceeds the %d-byte frame limit", ErrProtocol, len(body), maxFrame)
	}
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
	return append(frame, body...), nil
}

// readFrame reads one message. A short read is io.ErrUnexpectedEOF or
// io.EOF; bad content is ErrProtocol.
func readFrame(r io.Reader) (*message, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxFrame {
		return nil, fmt.Errorf("%w: frame length %d exceeds the %d-byte limit", ErrProtocol, n, maxFrame)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return decodeMessage(body)
}

func decodeMessage(body []byte) (*message, error) {
	var m message
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: %v (frame %q)", ErrProtocol, err, clip.Clip(body, 64))
	}
	switch m.Type {
	case "hello", "result", "pong", "building":
	default:
		return nil, fmt.Errorf("%w: unknown message type %q", ErrProtocol, m.Type)
	}
	m.body = body
	return &m, nil
}

// decode reads from m the fields of the reply the caller expects; what
// names that reply in the error.
func (m *message) decode(what string, reply any) error {
	if err := json.Unmarshal(m.body, reply); err != nil {
		return fmt.Errorf("%w: %s: %v (frame %q)", ErrProtocol, what, err, clip.Clip(m.body, 64))
	}
	return nil
}
