package triton

import (
	"strconv"
	"strings"
	"time"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
)

// Triton's model configuration extension: GET
// /v2/models/{model}[/versions/{version}]/config answers the JSON form of
// model_config.proto's ModelConfig, as Triton's HTTP endpoint does (field
// names as the proto spells them, enums by name, 64-bit integers as JSON
// numbers), so that perf_analyzer, model_analyzer and tritonclient's
// get_model_config read it. The gRPC ModelConfig answer is the same
// value (tritonConfig). Only fields stepserve can state truly are set:
// what it does not have (sequence batching, ensembles, optimization
// profiles, ...) is left out, which the proto reads as unset.

// ModelConfig is Triton's ModelConfig.
type ModelConfig struct {
	Name     string `json:"name"`
	Platform string `json:"platform"`
	Backend  string `json:"backend"`
	// VersionPolicy: stepserve serves one version of a model.
	VersionPolicy versionPolicy `json:"version_policy"`
	// MaxBatchSize is the largest batch bucket: the most rows one step
	// runs. (A request with more rows is run a part per step.)
	MaxBatchSize    int32            `json:"max_batch_size"`
	Input           []modelInput     `json:"input"`
	Output          []modelOutput    `json:"output"`
	DynamicBatching *DynamicBatching `json:"dynamic_batching,omitempty"`
	InstanceGroup   []InstanceGroup  `json:"instance_group"`
	// Parameters are stepserve's own settings, under "stepserve." keys
	// (stepserveParameters).
	Parameters             map[string]modelParameter `json:"parameters"`
	ModelTransactionPolicy transactionPolicy         `json:"model_transaction_policy"`
	ResponseCache          responseCache             `json:"response_cache"`
}

type versionPolicy struct {
	Latest *latestVersions `json:"latest,omitempty"`
}

type latestVersions struct {
	NumVersions uint32 `json:"num_versions"`
}

// modelInput is Triton's ModelInput.
type modelInput struct {
	Name     string `json:"name"`
	DataType string `json:"data_type"`
	// Format is FORMAT_NONE, or an image input's FORMAT_NCHW or
	// FORMAT_NHWC (model.yaml's format), which Triton's image clients
	// read to lay out what they send.
	Format string `json:"format"`
	// Dims are the shape after the batch dimension, -1 for the
	// sequence.
	Dims          []int64 `json:"dims"`
	IsShapeTensor bool    `json:"is_shape_tensor"`
	// Optional inputs may be left out of a request (an encoder's
	// token_type_ids).
	Optional bool `json:"optional"`
}

// modelOutput is Triton's ModelOutput.
type modelOutput struct {
	Name          string  `json:"name"`
	DataType      string  `json:"data_type"`
	Dims          []int64 `json:"dims"`
	LabelFilename string  `json:"label_filename,omitempty"`
	IsShapeTensor bool    `json:"is_shape_tensor"`
}

// DynamicBatching is Triton's ModelDynamicBatching.
type DynamicBatching struct {
	// PreferredBatchSize are the batch buckets: the step sizes compiled.
	PreferredBatchSize        []int32     `json:"preferred_batch_size"`
	MaxQueueDelayMicroseconds uint64      `json:"max_queue_delay_microseconds"`
	PreserveOrdering          bool        `json:"preserve_ordering"`
	PriorityLevels            uint64      `json:"priority_levels"`
	DefaultPriorityLevel      uint64      `json:"default_priority_level"`
	DefaultQueuePolicy        QueuePolicy `json:"default_queue_policy"`
}

// QueuePolicy is Triton's ModelQueuePolicy.
type QueuePolicy struct {
	// TimeoutAction is REJECT: a request still queued at its timeout is
	// answered then (504).
	TimeoutAction              string `json:"timeout_action"`
	DefaultTimeoutMicroseconds uint64 `json:"default_timeout_microseconds"`
	// AllowTimeoutOverride: a request's timeout parameter may lower the
	// default.
	AllowTimeoutOverride bool   `json:"allow_timeout_override"`
	MaxQueueSize         uint32 `json:"max_queue_size"`
}

// InstanceGroup is Triton's ModelInstanceGroup: the replicas on one
// device.
type InstanceGroup struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"`
	Count int32  `json:"count"`
	// Passive: the failover engine's replica, which serves only while
	// none of the model's own replicas is healthy.
	Passive bool `json:"passive"`
}

// modelParameter is Triton's ModelParameter.
type modelParameter struct {
	StringValue string `json:"string_value"`
}

type transactionPolicy struct {
	Decoupled bool `json:"decoupled"`
}

type responseCache struct {
	Enable bool `json:"enable"`
}

// tritonDatatype is a protocol datatype as model_config.proto's DataType
// names it: TYPE_ and the name, TYPE_STRING for BYTES.
func tritonDatatype(d models.Datatype) string {
	if d == models.BYTES {
		return "TYPE_STRING"
	}
	return "TYPE_" + string(d)
}

// instanceKind is the ModelInstanceGroup kind of an engine's replicas: the
// host's CPU for the Go engine and the torch engine's workers; KIND_MODEL
// (placed by the server on the engine's own devices, named in the group)
// for the rbln engine's NPUs and any other.
func instanceKind(engine string) string {
	switch engine {
	case "cpu", "torch":
		return "KIND_CPU"
	}
	return "KIND_MODEL"
}

// TritonConfig is the model's configuration as Triton's ModelConfig.
func TritonConfig(m *serving.Model) ModelConfig {
	mm := m.Model()
	cfg := mm.Config
	pol := m.Backend().Policy()
	c := ModelConfig{
		Name:          mm.Name,
		Platform:      mm.Platform(),
		Backend:       "stepserve",
		VersionPolicy: versionPolicy{Latest: &latestVersions{NumVersions: 1}},
		Input:         make([]modelInput, 0, len(cfg.Inputs)),
		Output:        make([]modelOutput, 0, len(cfg.Outputs)),
		DynamicBatching: &DynamicBatching{
			PreferredBatchSize:        make([]int32, 0, len(cfg.Buckets.Batch)),
			MaxQueueDelayMicroseconds: micros(pol.MaxQueueDelay),
			PriorityLevels:            uint64(pol.PriorityLevels),
			DefaultPriorityLevel:      uint64(pol.DefaultPriority),
			DefaultQueuePolicy: QueuePolicy{
				TimeoutAction:              "REJECT",
				DefaultTimeoutMicroseconds: micros(pol.DefaultTimeout),
				AllowTimeoutOverride:       true,
				MaxQueueSize:               uint32(pol.MaxQueueSize),
			},
		},
		Parameters: stepserveParameters(m),
	}
	if cfg.Architecture == "torch" {
		c.Backend = "pytorch" // the user's module runs in PyTorch, as pytorch_libtorch's do
	}
	for _, b := range cfg.Buckets.Batch {
		c.DynamicBatching.PreferredBatchSize = append(c.DynamicBatching.PreferredBatchSize, int32(b))
		c.MaxBatchSize = max(c.MaxBatchSize, int32(b))
	}
	for _, in := range cfg.Inputs {
		format := models.FormatNone
		if in.Format != "" {
			format = in.Format
		}
		c.Input = append(c.Input, modelInput{Name: in.Name, DataType: tritonDatatype(in.Datatype), Format: "FORMAT_" + format, Dims: dims(in),
			Optional: cfg.OptionalInput(in.Name)})
	}
	for _, out := range cfg.Outputs {
		c.Output = append(c.Output, modelOutput{Name: out.Name, DataType: tritonDatatype(out.Datatype), Dims: dims(out),
			LabelFilename: out.Labels})
	}
	c.InstanceGroup = instanceGroups(mm.Name, m.Engine(), m.Backend().Devices(), false)
	if fb, device := m.Backend().Failover(); fb != "" {
		c.InstanceGroup = append(c.InstanceGroup, instanceGroups(mm.Name, fb, []string{device}, true)...)
	}
	return c
}

// dims is a tensor's shape after the batch dimension.
func dims(s models.TensorSpec) []int64 {
	out := make([]int64, 0, len(s.Shape)-1)
	for _, d := range s.Shape[1:] {
		out = append(out, int64(d))
	}
	return out
}

func micros(d time.Duration) uint64 { return uint64(max(d, 0) / time.Microsecond) }

// instanceGroups groups an engine's replicas by device, in the order the
// devices first appear: one group per device, named after the model and
// the device, its count the replicas there.
func instanceGroups(model, engine string, devices []string, passive bool) []InstanceGroup {
	var out []InstanceGroup
	index := map[string]int{}
	for _, d := range devices {
		if i, ok := index[d]; ok {
			out[i].Count++
			continue
		}
		index[d] = len(out)
		name := model + "_" + deviceLabel(engine, d)
		if passive {
			name = model + "_failover_" + deviceLabel(engine, d)
		}
		out = append(out, InstanceGroup{Name: name, Kind: instanceKind(engine), Count: 1, Passive: passive})
	}
	return out
}

// deviceLabel names a device in an instance group's name: the device as
// the engine names it when that is a word (cpu, cpu0), the engine and the
// device when it is a number (rbln0), the engine alone when it has none.
func deviceLabel(engine, device string) string {
	if device == "" {
		return engine
	}
	if c := device[0]; c >= '0' && c <= '9' {
		return engine + device
	}
	return device
}

// stepserveParameters are the settings stepserve serves the model with
// that ModelConfig has no field for, as string parameters:
//
//	stepserve.engine            the engine (cpu, torch, rbln)
//	stepserve.failover_engine   the engine that serves while no replica is healthy (when any)
//	stepserve.devices           the devices of the replicas, comma-separated, one per replica
//	stepserve.architecture      mlp, encoder or torch
//	stepserve.buckets.batch     the batch buckets, comma-separated
//	stepserve.buckets.seq       the sequence buckets, comma-separated (sequence models)
//	stepserve.device_dtype      model.yaml's device_dtype: what the rbln engine computes in
//	stepserve.warmup            eager or lazy
//	stepserve.instances.min_ready  the healthy replicas the model needs to be ready
//	stepserve.max_batch_elements   the most input elements a batch takes (when bounded)
func stepserveParameters(m *serving.Model) map[string]modelParameter {
	cfg := m.Model().Config
	p := map[string]modelParameter{}
	set := func(k, v string) { p["stepserve."+k] = modelParameter{StringValue: v} }
	set("engine", m.Engine())
	if fb, _ := m.Backend().Failover(); fb != "" {
		set("failover_engine", fb)
	}
	set("devices", strings.Join(m.Backend().Devices(), ","))
	set("architecture", cfg.Architecture)
	set("buckets.batch", joinInts(cfg.Buckets.Batch))
	if len(cfg.Buckets.Seq) > 0 {
		set("buckets.seq", joinInts(cfg.Buckets.Seq))
	}
	set("device_dtype", cfg.DeviceDtype)
	if d := m.ComputeDtype(); d != "" {
		set("compute_dtype", d) // what the engine computes in: float32 on the host CPU whatever device_dtype says
	}
	set("warmup", cfg.Warmup)
	set("instances.min_ready", strconv.Itoa(cfg.Instances.MinReadyCount()))
	if n := m.Backend().Policy().MaxBatchElements; n > 0 {
		set("max_batch_elements", strconv.Itoa(n))
	}
	return p
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
