// The repository API's load parameters (Triton's model repository
// extension): "config", a model configuration in Triton's JSON form whose
// scheduling keys stepserve applies over model.yaml, and "file:..." model
// files, which it does not take. Nothing sent is ignored: a key stepserve
// cannot apply is refused, named.

package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
)

// maxLoadBody bounds a load request's body.
const maxLoadBody = 1 << 20

// LoadOverride reads a load request's body: nil when it has none (or no
// parameters), the override its config asks for otherwise.
func LoadOverride(r *http.Request, name string) (serving.Override, error) {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxLoadBody))
	if err != nil {
		return nil, &Error{http.StatusRequestEntityTooLarge, fmt.Sprintf("load request body over %d bytes", maxLoadBody)}
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
		return nil, BadRequest(fmt.Sprintf("load request: want {\"parameters\": {...}}: %s", clip.Clip(err.Error(), 200)))
	}
	var override serving.Override
	for _, k := range sortedKeys(body.Parameters) {
		v := body.Parameters[k]
		switch {
		case k == "config":
			var text string
			if err := json.Unmarshal(v, &text); err != nil {
				return nil, BadRequest(`load parameter "config" must be a string holding the model configuration as JSON`)
			}
			if override, err = ConfigOverride(text, name); err != nil {
				return nil, err
			}
		case strings.HasPrefix(k, "file:"):
			return nil, BadRequest(fmt.Sprintf("load parameter %q: model files sent with the load are not supported; "+
				"put them in the model repository", clip.Clip(k, 64)))
		default:
			return nil, BadRequest(fmt.Sprintf("load parameter %q is not supported; want config", clip.Clip(k, 64)))
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
// Any other key is refused, named.
func ConfigOverride(text, name string) (serving.Override, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &cfg); err != nil {
		return nil, BadRequest(fmt.Sprintf("load parameter config is not a JSON object: %s", clip.Clip(err.Error(), 200)))
	}
	bad := func(key, format string, args ...any) error {
		return BadRequest(fmt.Sprintf("load config: %s: ", key) + fmt.Sprintf(format, args...))
	}
	var (
		maxBatch   int
		preferred  []int
		policy     models.Batching
		inst       *models.Instances
		setBatches bool
	)
	for _, k := range sortedKeys(cfg) {
		v := cfg[k]
		switch k {
		case "name":
			var n string
			if json.Unmarshal(v, &n) != nil || n != name {
				return nil, bad("name", "must be %q, the model being loaded", name)
			}
		case "max_batch_size":
			if err := json.Unmarshal(v, &maxBatch); err != nil || maxBatch < 1 {
				return nil, bad("max_batch_size", "want a positive integer")
			}
			setBatches = true
		case "dynamic_batching":
			var db map[string]json.RawMessage
			if err := json.Unmarshal(v, &db); err != nil {
				return nil, bad("dynamic_batching", "want an object")
			}
			for _, dk := range sortedKeys(db) {
				dv := db[dk]
				key := "dynamic_batching." + dk
				switch dk {
				case "preferred_batch_size":
					if err := json.Unmarshal(dv, &preferred); err != nil || len(preferred) == 0 {
						return nil, bad(key, "want a list of batch sizes")
					}
					setBatches = true
				case "max_queue_delay_microseconds":
					d, err := jsonMicros(dv)
					if err != nil {
						return nil, bad(key, "%v", err)
					}
					policy.MaxQueueDelay = &d
				case "priority_levels", "default_priority_level":
					n, err := integer(dv)
					if err != nil {
						return nil, bad(key, "%v", err)
					}
					if dk == "priority_levels" {
						policy.PriorityLevels = &n
					} else {
						policy.DefaultPriorityLevel = &n
					}
				case "default_queue_policy":
					var qp map[string]json.RawMessage
					if err := json.Unmarshal(dv, &qp); err != nil {
						return nil, bad(key, "want an object")
					}
					for _, qk := range sortedKeys(qp) {
						qkey := key + "." + qk
						switch qk {
						case "default_timeout_microseconds":
							d, err := jsonMicros(qp[qk])
							if err != nil {
								return nil, bad(qkey, "%v", err)
							}
							policy.DefaultTimeout = &d
						case "max_queue_size":
							n, err := integer(qp[qk])
							if err != nil {
								return nil, bad(qkey, "%v", err)
							}
							policy.MaxQueueSize = &n
						default:
							return nil, bad(qkey, "cannot be set at load; stepserve takes default_timeout_microseconds and max_queue_size")
						}
					}
				default:
					return nil, bad(key, "cannot be set at load; stepserve takes preferred_batch_size, max_queue_delay_microseconds, "+
						"priority_levels, default_priority_level and default_queue_policy")
				}
			}
		case "instance_group":
			var groups []struct {
				Count *int   `json:"count"`
				Kind  string `json:"kind"`
				GPUs  []int  `json:"gpus"`
				Name  string `json:"name"`
			}
			dec := json.NewDecoder(bytes.NewReader(v))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&groups); err != nil {
				return nil, bad("instance_group", "want a list of {count, kind, gpus}: %s", clip.Clip(err.Error(), 120))
			}
			if len(groups) != 1 {
				return nil, bad("instance_group", "give one group (stepserve places every replica of a model the same way); got %d", len(groups))
			}
			g := groups[0]
			inst = &models.Instances{}
			if g.Count != nil {
				if *g.Count < 1 {
					return nil, bad("instance_group[0].count", "want at least 1")
				}
				inst.PerDevice = *g.Count
			}
			for _, d := range g.GPUs {
				inst.Devices = append(inst.Devices, strconv.Itoa(d))
			}
		default:
			return nil, bad(k, "cannot be changed at load (it is model.yaml's); stepserve applies name, max_batch_size, "+
				"dynamic_batching and instance_group")
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

// jsonMicros reads a count of microseconds (Triton's JSON writes 64-bit
// integers as strings or numbers).
func jsonMicros(v json.RawMessage) (time.Duration, error) {
	n, err := integer(v)
	if err != nil {
		return 0, err
	}
	return time.Duration(n) * time.Microsecond, nil
}

func integer(v json.RawMessage) (int, error) {
	s := strings.Trim(string(bytes.TrimSpace(v)), `"`)
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, errors.New("want a non-negative integer")
	}
	return n, nil
}
