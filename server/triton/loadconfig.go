// The repository API's load parameters (Triton's model repository
// extension): "config", a model configuration in Triton's JSON form whose
// scheduling keys stepserve applies over model.yaml, and "file:..." model
// files, which it does not take. Nothing sent is ignored: a key stepserve
// cannot apply is refused, named. The config is read as Triton reads it,
// by protobuf's JSON rules for model_config.proto's ModelConfig
// (inferencepb.ModelConfig): 64-bit integers as numbers or strings, enums
// by name or number, fields by their proto or lowerCamelCase names.

package triton

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	pb "github.com/stepserve/stepserve/server/inferencepb"
	"github.com/stepserve/stepserve/serving"
)

// maxLoadBody bounds a load request's body.
const maxLoadBody = 1 << 20

// LoadOverride reads a load request's body: nil when it has none (or no
// parameters), the override its config asks for otherwise. Its errors
// begin as Triton's do ("failed to load 'name', ...").
func LoadOverride(r *http.Request, name string) (serving.Override, error) {
	override, err := loadOverride(r, name)
	if err != nil {
		return nil, core.LoadFailed(name, err)
	}
	return override, nil
}

func loadOverride(r *http.Request, name string) (serving.Override, error) {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxLoadBody))
	if err != nil {
		return nil, &apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("load request body over %d bytes", maxLoadBody)}
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	var body struct {
		Parameters map[string]json.RawMessage `json:"parameters"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return nil, apierr.BadRequest(fmt.Sprintf("load request: want {\"parameters\": {...}}: %s", clip.Clip(err.Error(), 200)))
	}
	if _, err := dec.Token(); err != io.EOF {
		// The checks below read the whole body: what follows the object
		// would hide it from them.
		return nil, apierr.BadRequest("load request: want one JSON object {\"parameters\": {...}}; something follows it")
	}
	if k, ok := duplicateKey(bytes.TrimSpace(b)); ok {
		return nil, apierr.BadRequest(fmt.Sprintf("load request: %q is given twice", clip.Clip(k, 64)))
	}
	if k, ok := otherKey(bytes.TrimSpace(b), "parameters"); ok {
		// encoding/json matches keys regardless of case: "Parameters"
		// would be read as parameters, and merged with them.
		return nil, apierr.BadRequest(fmt.Sprintf("load request: want {\"parameters\": {...}}; %q is not a key of it", clip.Clip(k, 64)))
	}
	var raw struct {
		Parameters json.RawMessage `json:"parameters"`
	}
	if json.Unmarshal(b, &raw) == nil {
		if k, ok := duplicateKey(raw.Parameters); ok {
			return nil, apierr.BadRequest(fmt.Sprintf("load parameter %q is given twice", clip.Clip(k, 64)))
		}
	}
	var override serving.Override
	for _, k := range sortedKeys(body.Parameters) {
		v := body.Parameters[k]
		switch {
		case k == "config":
			var text string
			if err := json.Unmarshal(v, &text); err != nil {
				return nil, apierr.BadRequest(`load parameter "config" must be a string holding the model configuration as JSON`)
			}
			if override, err = configOverride(text, name); err != nil {
				return nil, err
			}
		case strings.HasPrefix(k, "file:"):
			return nil, apierr.BadRequest(fmt.Sprintf("load parameter %q: model files sent with the load are not supported; "+
				"put them in the model repository", clip.Clip(k, 64)))
		default:
			return nil, apierr.BadRequest(fmt.Sprintf("load parameter %q is not supported; want config", clip.Clip(k, 64)))
		}
	}
	return override, nil
}

// sortedKeys lists a decoded object's keys in order, so that the first
// refusal is the same whatever the map's order.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// ConfigOverride is the change a Triton model configuration (JSON) makes
// to model name's model.yaml: name must match; max_batch_size and
// dynamic_batching.preferred_batch_size set the batch buckets;
// dynamic_batching's queue keys set the batching policy; one
// instance_group sets instances (count: per_device, gpus: devices).
// Any other key is refused, named. Its errors begin as Triton's do
// ("failed to load 'name', ...").
func ConfigOverride(text, name string) (serving.Override, error) {
	override, err := configOverride(text, name)
	if err != nil {
		return nil, core.LoadFailed(name, err)
	}
	return override, nil
}

func configOverride(text, name string) (serving.Override, error) {
	cfg, set, err := readConfig(text)
	if err != nil {
		return nil, err
	}
	if set["name"] && cfg.GetName() != name {
		return nil, configError("name", "must be %q, the model being loaded", name)
	}
	var (
		maxBatch   int
		preferred  []int
		policy     models.Batching
		inst       *models.Instances
		setBatches bool
	)
	if set["max_batch_size"] {
		if maxBatch = int(cfg.GetMaxBatchSize()); maxBatch < 1 {
			return nil, configError("max_batch_size", "want a positive integer; got %d", maxBatch)
		}
		setBatches = true
	}
	db := cfg.GetDynamicBatching()
	if set["dynamic_batching.preferred_batch_size"] {
		for _, b := range db.GetPreferredBatchSize() {
			if b < 1 {
				return nil, configError("dynamic_batching.preferred_batch_size", "want batch sizes of 1 or more; got %d", b)
			}
			preferred = append(preferred, int(b))
		}
		if len(preferred) == 0 {
			return nil, configError("dynamic_batching.preferred_batch_size", "want a list of batch sizes")
		}
		setBatches = true
	}
	// Each key set, and only those, changes model.yaml's policy: proto3
	// reads a zero sent as a field left out.
	for _, f := range []struct {
		key  string
		n    uint64
		into **int
	}{
		{"dynamic_batching.priority_levels", db.GetPriorityLevels(), &policy.PriorityLevels},
		{"dynamic_batching.default_priority_level", db.GetDefaultPriorityLevel(), &policy.DefaultPriorityLevel},
		{"dynamic_batching.default_queue_policy.max_queue_size", uint64(db.GetDefaultQueuePolicy().GetMaxQueueSize()), &policy.MaxQueueSize},
	} {
		if !set[f.key] {
			continue
		}
		if f.n > math.MaxInt32 {
			return nil, configError(f.key, "want at most %d; got %d", math.MaxInt32, f.n)
		}
		n := int(f.n)
		*f.into = &n
	}
	for _, f := range []struct {
		key    string
		micros uint64
		into   **time.Duration
	}{
		{"dynamic_batching.max_queue_delay_microseconds", db.GetMaxQueueDelayMicroseconds(), &policy.MaxQueueDelay},
		{"dynamic_batching.default_queue_policy.default_timeout_microseconds", db.GetDefaultQueuePolicy().GetDefaultTimeoutMicroseconds(), &policy.DefaultTimeout},
	} {
		if !set[f.key] {
			continue
		}
		if f.micros > uint64(math.MaxInt64/time.Microsecond) {
			return nil, configError(f.key, "want at most %d microseconds; got %d", math.MaxInt64/time.Microsecond, f.micros)
		}
		d := time.Duration(f.micros) * time.Microsecond
		*f.into = &d
	}
	if set["instance_group"] {
		groups := cfg.GetInstanceGroup()
		if len(groups) != 1 {
			return nil, configError("instance_group", "give one group (stepserve places every replica of a model the same way); got %d", len(groups))
		}
		g := groups[0]
		inst = &models.Instances{}
		if set["instance_group[0].count"] {
			if g.GetCount() < 1 {
				return nil, configError("instance_group[0].count", "want at least 1; got %d", g.GetCount())
			}
			inst.PerDevice = int(g.GetCount())
		}
		for _, d := range g.GetGpus() {
			if d < 0 {
				return nil, configError("instance_group[0].gpus", "want device numbers of 0 or more; got %d", d)
			}
			inst.Devices = append(inst.Devices, strconv.Itoa(int(d)))
		}
	}
	return func(c *models.Config) error {
		if setBatches {
			batches := preferred
			if batches == nil {
				for _, b := range c.Buckets.Batch {
					if b < maxBatch {
						batches = append(batches, b)
					}
				}
			}
			batches = slices.Clone(batches)
			if maxBatch > 0 {
				if m := slices.Max(batches); m > maxBatch {
					return fmt.Errorf("%w: load config: dynamic_batching.preferred_batch_size %d exceeds max_batch_size %d", models.ErrConfig, m, maxBatch)
				}
				if !slices.Contains(batches, maxBatch) {
					batches = append(batches, maxBatch)
				}
			}
			slices.Sort(batches)
			c.Buckets.Batch = slices.Compact(batches)
		}
		if policy.MaxQueueDelay != nil {
			c.Batching.MaxQueueDelay = policy.MaxQueueDelay
		}
		if policy.MaxQueueSize != nil {
			c.Batching.MaxQueueSize = policy.MaxQueueSize
		}
		if policy.PriorityLevels != nil {
			c.Batching.PriorityLevels = policy.PriorityLevels
		}
		if policy.DefaultPriorityLevel != nil {
			c.Batching.DefaultPriorityLevel = policy.DefaultPriorityLevel
		}
		if policy.DefaultTimeout != nil {
			c.Batching.DefaultTimeout = policy.DefaultTimeout
		}
		if inst != nil {
			if len(inst.Devices) == 0 {
				inst.Devices, inst.All = c.Instances.Devices, c.Instances.All
			}
			c.Instances = *inst
		}
		return nil
	}, nil
}

// readConfig reads a load's config: the fields stepserve applies, and the
// paths of those it gives.
func readConfig(text string) (*pb.ModelConfig, map[string]bool, error) {
	var top map[string]json.RawMessage
	err := json.Unmarshal([]byte(text), &top)
	if err == nil && top == nil {
		err = errors.New("it is null")
	}
	if err != nil {
		return nil, nil, apierr.BadRequest(fmt.Sprintf("load parameter config is not a JSON object: %s", clip.Clip(err.Error(), 200)))
	}
	if k, ok := duplicateKey([]byte(text)); ok {
		return nil, nil, configError(clip.Clip(k, 64), "given twice")
	}
	var cfg pb.ModelConfig
	set := map[string]bool{}
	if err := readLoadable(top, cfg.ProtoReflect(), "", set); err != nil {
		return nil, nil, err
	}
	return &cfg, set, nil
}

// loadable lists, per message of Triton's model configuration, the fields
// a load's config may set: those stepserve applies over model.yaml. Any
// other field, one Triton has or a typo, is refused by name.
var loadable = map[protoreflect.FullName][]protoreflect.Name{
	fullName(&pb.ModelConfig{}):          {"name", "max_batch_size", "dynamic_batching", "instance_group"},
	fullName(&pb.ModelDynamicBatching{}): {"preferred_batch_size", "max_queue_delay_microseconds", "priority_levels", "default_priority_level", "default_queue_policy"},
	fullName(&pb.ModelQueuePolicy{}):     {"default_timeout_microseconds", "max_queue_size"},
	fullName(&pb.ModelInstanceGroup{}):   {"name", "kind", "count", "gpus"},
}

func fullName(m proto.Message) protoreflect.FullName { return m.ProtoReflect().Descriptor().FullName() }

// readLoadable reads obj, a JSON object, into m by protobuf's JSON rules,
// a field at a time so that a refusal names the field (at path) and what
// it takes. It records in set the path of every field the object gives
// ("dynamic_batching.max_queue_delay_microseconds"; null gives none, as in
// protobuf's JSON), since proto3 cannot tell a zero sent from a field left
// out.
func readLoadable(obj map[string]json.RawMessage, m protoreflect.Message, path string, set map[string]bool) error {
	md := m.Descriptor()
	allowed := loadable[md.FullName()]
	for _, k := range sortedKeys(obj) {
		// As protobuf's JSON: the lowerCamelCase name or the proto's.
		fd := md.Fields().ByJSONName(k)
		if fd == nil {
			fd = md.Fields().ByTextName(k)
		}
		if fd == nil || !slices.Contains(allowed, fd.Name()) {
			if path == "" {
				return configError(clip.Clip(k, 64), "cannot be changed at load (it is model.yaml's); stepserve applies %s", names(allowed))
			}
			return configError(path+"."+clip.Clip(k, 64), "cannot be set at load; stepserve takes %s", names(allowed))
		}
		key := string(fd.Name())
		if path != "" {
			key = path + "." + key
		}
		v := obj[k]
		if string(bytes.TrimSpace(v)) == "null" {
			continue
		}
		if set[key] {
			return configError(key, "given twice (as %s and %s)", fd.Name(), fd.JSONName())
		}
		set[key] = true
		switch {
		case fd.Message() != nil && fd.IsList():
			var items []json.RawMessage
			if err := json.Unmarshal(v, &items); err != nil {
				return configError(key, "want a list of objects; got %s", clip.Clip(string(v), 64))
			}
			list := m.Mutable(fd).List()
			for i, item := range items {
				at := fmt.Sprintf("%s[%d]", key, i)
				obj, err := object(item, at)
				if err != nil {
					return err
				}
				e := list.NewElement()
				if err := readLoadable(obj, e.Message(), at, set); err != nil {
					return err
				}
				list.Append(e)
			}
		case fd.Message() != nil:
			obj, err := object(v, key)
			if err != nil {
				return err
			}
			if err := readLoadable(obj, m.Mutable(fd).Message(), key, set); err != nil {
				return err
			}
		default:
			// A scalar, an enum or a list of them: protojson reads it in a
			// message of its own.
			field, err := json.Marshal(map[string]json.RawMessage{string(fd.Name()): v})
			one := m.Type().New()
			if err == nil {
				err = protojson.Unmarshal(field, one.Interface())
			}
			if err != nil || !knownEnums(fd, one.Get(fd)) {
				return configError(key, "want %s; got %s", expected(fd), clip.Clip(string(v), 64))
			}
			if one.Has(fd) { // an empty list is no list
				m.Set(fd, one.Get(fd))
			}
		}
	}
	return nil
}

// object decodes raw, the value at key, as a JSON object.
func object(raw json.RawMessage, key string) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, configError(key, "want an object; got %s", clip.Clip(string(raw), 64))
	}
	if k, ok := duplicateKey(raw); ok {
		return nil, configError(key+"."+clip.Clip(k, 64), "given twice")
	}
	return obj, nil
}

// otherKey is a key of the JSON object raw other than want, spelled
// exactly.
func otherKey(raw []byte, want string) (string, bool) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return "", false
	}
	for _, k := range sortedKeys(obj) {
		if k != want {
			return k, true
		}
	}
	return "", false
}

// duplicateKey is a key the JSON object raw gives twice, which a Go map
// would keep only the last of: protobuf's JSON refuses it, and so does
// stepserve, rather than apply one of two values silently.
func duplicateKey(raw []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", false
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return "", false
		}
		k, _ := t.(string)
		if seen[k] {
			return k, true
		}
		seen[k] = true
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return "", false
		}
	}
	return "", false
}

func configError(key, format string, args ...any) error {
	return apierr.BadRequest(fmt.Sprintf("load config: %s: ", key) + fmt.Sprintf(format, args...))
}

// knownEnums reports whether v, fd's value, names only values its enum
// has: protobuf's JSON takes any number for an open enum.
func knownEnums(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
	if fd.Enum() == nil {
		return true
	}
	values := fd.Enum().Values()
	if !fd.IsList() {
		return values.ByNumber(v.Enum()) != nil
	}
	for i := range v.List().Len() {
		if values.ByNumber(v.List().Get(i).Enum()) == nil {
			return false
		}
	}
	return true
}

// expected says what protobuf's JSON takes for fd.
func expected(fd protoreflect.FieldDescriptor) string {
	var one string
	switch k := fd.Kind(); k {
	case protoreflect.EnumKind:
		values := fd.Enum().Values()
		var enums []string
		for i := range values.Len() {
			enums = append(enums, string(values.Get(i).Name()))
		}
		one = "one of " + strings.Join(enums, ", ") + " (or its number)"
	case protoreflect.BoolKind:
		one = "true or false"
	case protoreflect.StringKind:
		one = "a string"
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		one = "a 32-bit integer (a number, or a string holding one)"
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		one = "a 64-bit integer (a number, or a string holding one)"
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		one = "a non-negative 32-bit integer (a number, or a string holding one)"
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		one = "a non-negative 64-bit integer (a number, or a string holding one)"
	default:
		one = "a " + k.String()
	}
	if fd.IsList() {
		return "a list, each " + one
	}
	return one
}

// names lists fields as a sentence does: "a, b and c".
func names(fields []protoreflect.Name) string {
	s := make([]string, len(fields))
	for i, f := range fields {
		s[i] = string(f)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
