package batching

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The configured defaults: what the server's configuration gives when no
// batching key is set.
var configured = Policy{MaxQueueSize: 1024, PriorityLevels: 1}

func TestPolicyWithDefaults(t *testing.T) {
	assert.Equal(t, Policy{MaxQueueSize: 1024, PriorityLevels: 1, DefaultPriority: 1}, Policy{}.WithDefaults())
	assert.Equal(t, 3, Policy{PriorityLevels: 3}.WithDefaults().DefaultPriority, "the lowest level")
	p := Policy{MaxQueueDelay: time.Millisecond, MaxQueueSize: 8, PriorityLevels: 4, DefaultPriority: 2, DefaultTimeout: time.Second, MaxBatchElements: 9}
	assert.Equal(t, p, p.WithDefaults(), "set fields are kept")
	require.NoError(t, Policy{}.WithDefaults().Validate(), "the defaults are valid")
}

// Validate is where the rules live for both the server's configuration and
// model.yaml's batching keys, which models only parses (these cases were
// models' TestParseConfigErrors: negative delay, zero queue, default level
// out of range).
func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		name string
		set  func(p *Policy)
		want string // "" for valid
	}{
		{"configured defaults", func(*Policy) {}, ""},
		{"default level 0 is the lowest", func(p *Policy) { p.PriorityLevels, p.DefaultPriority = 3, 0 }, ""},
		{"default level in range", func(p *Policy) { p.PriorityLevels, p.DefaultPriority = 3, 3 }, ""},
		{"negative delay", func(p *Policy) { p.MaxQueueDelay = -time.Millisecond },
			`batching.max_queue_delay: "-1ms"; want a duration of 0 or more, e.g. 500us or 2ms`},
		{"negative timeout", func(p *Policy) { p.DefaultTimeout = -2 * time.Second },
			`batching.default_timeout: "-2s"; want a duration of 0 (no limit) or more, e.g. 5s`},
		{"zero queue", func(p *Policy) { p.MaxQueueSize = 0 },
			`batching.max_queue_size: "0"; want an integer of at least 1`},
		{"negative queue", func(p *Policy) { p.MaxQueueSize = -5 },
			`batching.max_queue_size: "-5"; want an integer of at least 1`},
		{"zero levels", func(p *Policy) { p.PriorityLevels = 0 },
			`batching.priority_levels: "0"; want an integer in 1..100`},
		{"too many levels", func(p *Policy) { p.PriorityLevels = 101 },
			`batching.priority_levels: "101"; want an integer in 1..100`},
		{"default level out of range", func(p *Policy) { p.PriorityLevels, p.DefaultPriority = 2, 3 },
			`batching.default_priority_level: "3"; want an integer in 1..2 (batching.priority_levels), or 0 for the lowest level`},
		{"negative default level", func(p *Policy) { p.DefaultPriority = -1 },
			`batching.default_priority_level: "-1"; want an integer in 1..1`},
		{"negative elements", func(p *Policy) { p.MaxBatchElements = -1 },
			`batching.max_batch_elements: "-1"; want an integer, 0 or more`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := configured
			tt.set(&p)
			err := p.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			var pe *PolicyError
			require.ErrorAs(t, err, &pe)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestPolicySet(t *testing.T) {
	var p Policy
	for key, text := range map[string]string{
		"batching.max_queue_delay":        "2ms",
		"batching.max_queue_size":         "8",
		"batching.priority_levels":        "3",
		"batching.default_priority_level": "2",
		"batching.default_timeout":        "5s",
		"batching.max_batch_elements":     "100",
	} {
		require.NoError(t, p.Set(key, text), key)
	}
	assert.Equal(t, Policy{MaxQueueDelay: 2 * time.Millisecond, MaxQueueSize: 8, PriorityLevels: 3,
		DefaultPriority: 2, DefaultTimeout: 5 * time.Second, MaxBatchElements: 100}, p)

	// Set reads the text; the range is Validate's.
	require.NoError(t, p.Set("batching.max_queue_size", "0"))
	assert.Error(t, p.Validate())

	err := p.Set("batching.priority_levels", "many")
	var pe *PolicyError
	require.ErrorAs(t, err, &pe)
	assert.EqualError(t, err, `batching.priority_levels: "many"; want an integer in 1..100`)
	assert.EqualError(t, p.Set("batching.max_queue_delay", "1 sec"), `batching.max_queue_delay: "1 sec"; want a duration of 0 or more, e.g. 500us or 2ms`)
	assert.ErrorContains(t, p.Set("batching.batch_size", "4"), `"batching.batch_size" is not a batching policy key`)
}
