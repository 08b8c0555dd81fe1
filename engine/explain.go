package engine

import (
	"encoding/json"
	"strconv"
)

// Count is a counter read from an explain region, or [Unknown] where the
// engine could not measure it. An unmeasured counter is never reported as
// zero: zero would claim the step was clean in a way nobody checked.
type Count int64

// Unknown marks a counter the engine could not read.
const Unknown Count = -1

// Known reports whether the counter was measured.
func (c Count) Known() bool { return c >= 0 }

// MarshalJSON writes an unknown count as null.
func (c Count) MarshalJSON() ([]byte, error) {
	if !c.Known() {
		return []byte("null"), nil
	}
	return strconv.AppendInt(nil, int64(c), 10), nil
}

// UnmarshalJSON reads null, or any negative number, as Unknown.
func (c *Count) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*c = Unknown
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	*c = max(Count(n), Unknown)
	return nil
}

// Explain is the normalized report of one step, whatever the engine: what
// torch.rbln.explain() saw on an NPU, or what the CPU engine really did.
type Explain struct {
	// Measured is false when the engine could not observe the step at all
	// (torch.rbln.explain unavailable): the step is then neither clean nor
	// overhead, and every count is Unknown.
	Measured bool `json:"measured"`
	// Clean is the engine's own verdict: no hidden signal fired. The step
	// checker also marks a step not clean unless it made exactly one copy
	// each way.
	Clean   bool     `json:"clean"`
	Reasons []string `json:"reasons,omitempty"`

	CPUFallbacks    Count `json:"cpu_fallbacks"`
	Recompiles      Count `json:"recompiles"`
	HostBounces     Count `json:"host_bounces"`
	HostBounceBytes Count `json:"host_bounce_bytes"`
	H2D             Count `json:"h2d"`
	D2H             Count `json:"d2h"`
	WallNS          Count `json:"wall_ns"`
	// H2DNS and D2HNS are the time the runtime spent in those transfers.
	H2DNS Count `json:"h2d_ns"`
	D2HNS Count `json:"d2h_ns"`
	// V2V counts device-to-device copies through the runtime; V2VSlow those
	// of them that fell to a host path (torch-rbln's v2v_slow signal).
	V2V     Count `json:"v2v"`
	V2VSlow Count `json:"v2v_slow"`
	// DeviceNS is the time of the step's body where the engine can
	// measure it apart from the host's work around it: a worker's step
	// body (copy in, graph, copy out, inside the worker), the CPU engine's
	// compute. Unknown elsewhere, never zero for unmeasured.
	DeviceNS Count `json:"device_ns"`
	// Dispatch is what torch-rbln's dispatcher and runtime saw of the step
	// besides its signals; nil where the engine does not say.
	Dispatch *Dispatch `json:"dispatch,omitempty"`
	// HostOps counts the operators the compiler split out of the step's
	// compiled program to run on the host inside it (the RBLN Compiler's
	// inspect(), host_op_reason), which explain() cannot see: a property
	// of the bucket's program, read when it was built. HostOpReasons
	// names them with the compiler's reason (at most 32).
	HostOps       Count             `json:"host_ops"`
	HostOpReasons map[string]string `json:"host_op_reasons,omitempty"`

	// Which operator fell back or recompiled, and where data crossed the
	// host; nil where the engine has nothing to say.
	CPUFallbackByOp  map[string]int64 `json:"cpu_fallback_by_op,omitempty"`
	RecompileByOp    map[string]int64 `json:"recompile_by_op,omitempty"`
	HostBounceBySite map[string]int64 `json:"host_bounce_by_site,omitempty"`
	// CPUFallbackReasons says why operators fell back (torch-rbln's
	// cpu_fallback_reasons: dtype-not-fp16, nan/inf input, ...), by count.
	CPUFallbackReasons map[string]int64 `json:"cpu_fallback_reasons,omitempty"`
	// Notes are the engine's remedies for the signals that fired
	// (torch-rbln's verdict notes).
	Notes []string `json:"notes,omitempty"`

	// Report is the engine's human-readable report, kept for steps that are
	// not clean.
	Report string `json:"report,omitempty"`
}

// Dispatch is torch-rbln's dispatch and runtime detail of one step (its
// explain dump's dispatch.total, dispatch.warm_hit,
// dispatch.cpu_fallback_ns, runtime.total_ns and the v2v primitive's ns).
type Dispatch struct {
	// Total is the operators dispatched; WarmHits those a warm compiled
	// program served. A steady step's are equal.
	Total    Count `json:"total"`
	WarmHits Count `json:"warm_hits"`
	// CPUFallbackNS is the time spent in operators that fell back.
	CPUFallbackNS Count `json:"cpu_fallback_ns"`
	// RuntimeNS is the device runtime's own total time in the step.
	RuntimeNS Count `json:"runtime_ns"`
	// V2VNS is the time of device-to-device copies.
	V2VNS Count `json:"v2v_ns"`
}

// Unmeasured is the report of a step nobody observed: not measured, not
// clean, and every count Unknown.
func Unmeasured() Explain {
	return Explain{
		CPUFallbacks:    Unknown,
		Recompiles:      Unknown,
		HostBounces:     Unknown,
		HostBounceBytes: Unknown,
		H2D:             Unknown,
		D2H:             Unknown,
		WallNS:          Unknown,
		H2DNS:           Unknown,
		D2HNS:           Unknown,
		V2V:             Unknown,
		V2VSlow:         Unknown,
		DeviceNS:        Unknown,
		HostOps:         Unknown,
	}
}

// UnmarshalJSON reads a report in which an absent count is Unknown, as a
// null one is: a count the engine did not send was not measured, and must
// not read as zero.
func (x *Explain) UnmarshalJSON(b []byte) error {
	type fields Explain // the same fields, without this method
	f := fields(Unmeasured())
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*x = Explain(f)
	return nil
}

// ProgramReport is what building one bucket's step graph produced, and
// what running it has shown since: GET /v2/models/{model}/explain lists
// one per bucket (and kind, for a decoder's prefill and decode steps).
// Counts the engine could not see are null (Unknown), never 0.
type ProgramReport struct {
	Bucket string `json:"bucket"`
	// Kind is "step", or "prefill" or "decode" for a decoder's buckets.
	Kind string `json:"kind"`
	// Compiler built the program: "inductor" (torch on the host CPU),
	// "rbln" (the RBLN Compiler) or "none" (the body runs eagerly, or the
	// CPU engine's Go kernels).
	Compiler string `json:"compiler"`
	// Device is the worker's device that holds it (a replicated model has
	// one report per replica).
	Device string `json:"device,omitempty"`
	// Built: its first run has built it (torch.compile is lazy).
	Built bool `json:"built"`
	// Graphs the compiler captured for the bucket: 1 for a whole step,
	// more with graph breaks or recompiles.
	Graphs      Count        `json:"graphs"`
	GraphBreaks Count        `json:"graph_breaks"`
	Breaks      []GraphBreak `json:"breaks,omitempty"`
	// Recompiles are graphs captured after the first run (a guard that
	// stopped holding), with the compiler's reasons (the latest few).
	Recompiles       Count    `json:"recompiles"`
	RecompileReasons []string `json:"recompile_reasons,omitempty"`
	// CompileSeconds is the first run's time, which built the program;
	// CacheHit says whether the compiler's cache served it (null where
	// the compiler does not say).
	CompileSeconds *float64 `json:"compile_seconds"`
	CacheHit       *bool    `json:"cache_hit"`
	// HostOps counts the operators the compiler split out to the host
	// (the rbln engine's inspection; null elsewhere).
	HostOps Count `json:"host_ops"`
	// Audit is the step audit of the program's graphs against the step
	// structure; nil where no graph was audited.
	Audit *Audit `json:"audit"`
	// Error is the compiler's failure where the bucket is served eagerly
	// instead (strict warm-up off); Note says why it runs as it does.
	Error string `json:"error,omitempty"`
	Note  string `json:"note,omitempty"`
}

// GraphBreak is one place where a step's graph breaks: the step falls
// back to the host there on every run.
type GraphBreak struct {
	Reason string `json:"reason"`
	Line   string `json:"line"` // file.py:123
	Code   string `json:"code,omitempty"`
}

// Audit is what the step audit found in a program's captured graphs:
// findings by rule (the step structure's items), operator and line.
type Audit struct {
	Graphs int `json:"graphs"`
	// Total counts the distinct findings; ByRule the same by rule;
	// Findings lists them (at most 64: Truncated counts the rest).
	Total     int            `json:"total"`
	ByRule    map[string]int `json:"by_rule"`
	Findings  []Finding      `json:"findings"`
	Truncated int            `json:"truncated,omitempty"`
	// Widened lists the 64-bit integer indices an operator returns by its
	// definition (argmax, sort, topk): allowed, not findings, and named
	// so that what a step still holds in int64 is known (rule "widened").
	Widened []Finding `json:"widened,omitempty"`
	// Error says why a graph could not be traced to its operators (its
	// findings are then partial).
	Error string `json:"error,omitempty"`
}

// Finding is one place a step graph goes against the step structure.
type Finding struct {
	Rule string `json:"rule"` // created_in_step, float64, int64, mixed_float, input_layout, host_read, outputs
	// Item is the step structure's item the rule comes from.
	Item   int    `json:"item"`
	Op     string `json:"op"`
	Line   string `json:"line"`
	Code   string `json:"code,omitempty"`
	Dtype  string `json:"dtype,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Count is how many of the graph's nodes the finding stands for.
	Count int `json:"count"`
}

// AuditRules are the step audit's rules, in the order of the step
// structure's items.
var AuditRules = []string{"created_in_step", "float64", "int64", "mixed_float", "input_layout", "host_read", "outputs"}

// UnmarshalJSON reads a report whose absent counts are Unknown.
func (r *ProgramReport) UnmarshalJSON(b []byte) error {
	type fields ProgramReport
	f := fields{Graphs: Unknown, GraphBreaks: Unknown, Recompiles: Unknown, HostOps: Unknown}
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*r = ProgramReport(f)
	return nil
}
