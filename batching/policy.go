package batching

import (
	"fmt"
	"strconv"
	"time"
)

// Policy is a model's batching policy, with Triton's names: the server's
// configuration gives every model's defaults (its batching.* keys), and a
// model's model.yaml overrides them key by key. This package is the one
// place its rules live: [Policy.Validate] checks them for both.
type Policy struct {
	// MaxQueueDelay is how long the oldest queued request may wait for a
	// fuller batch.
	MaxQueueDelay time.Duration
	// MaxQueueSize bounds the queued requests; 0 means 1024.
	MaxQueueSize int
	// PriorityLevels is the number of levels, 1 the highest; 0 means 1.
	PriorityLevels int
	// DefaultPriority is the level of a request that names none; 0 means
	// the lowest level, whatever PriorityLevels is.
	DefaultPriority int
	// DefaultTimeout bounds how long a request may wait in the queue; 0
	// means no bound. A request may only lower it.
	DefaultTimeout time.Duration
	// MaxBatchElements stops a batch from taking more requests once their
	// elements would pass it (a single larger request still runs alone);
	// 0 means no bound beyond the largest bucket's rows.
	MaxBatchElements int
	// MaxBatchTokens closes a batch before its padded tokens (the rows of
	// the batch bucket it would run in times the seq bucket of its longest
	// request, as [Options.Padded] counts them) would pass it, so that one
	// long sequence does not pad many short ones to its length: the
	// request that does not fit starts the next batch, and a single
	// request larger than the budget runs alone. 0 means no bound; models
	// without sequence buckets ignore it.
	MaxBatchTokens int
}

// The policy's keys, as a user writes them in the server's configuration
// and in model.yaml's batching section.
const (
	keyMaxQueueDelay    = "batching.max_queue_delay"
	keyMaxQueueSize     = "batching.max_queue_size"
	keyPriorityLevels   = "batching.priority_levels"
	keyDefaultPriority  = "batching.default_priority_level"
	keyDefaultTimeout   = "batching.default_timeout"
	keyMaxBatchElements = "batching.max_batch_elements"
	keyMaxBatchTokens   = "batching.max_batch_tokens"
)

// MaxPriorityLevels is the most priority levels a policy may have: it
// keeps the per-level queues few.
const MaxPriorityLevels = 100

// WithDefaults returns p with its zero fields given their defaults: a queue
// of 1024, one priority level, and the lowest level for requests that name
// none.
func (p Policy) WithDefaults() Policy {
	if p.MaxQueueSize == 0 {
		p.MaxQueueSize = 1024
	}
	if p.PriorityLevels == 0 {
		p.PriorityLevels = 1
	}
	if p.DefaultPriority == 0 {
		p.DefaultPriority = p.PriorityLevels
	}
	return p
}

// Validate checks p as it stands: a zero MaxQueueSize or PriorityLevels is
// an error here (a user who wrote 0 meant something), so call it on a
// policy merged from configured values, before [Policy.WithDefaults]. A
// DefaultPriority of 0 is valid: it means the lowest level. The error is a
// [*PolicyError].
func (p Policy) Validate() error {
	for _, c := range []struct {
		key   string
		bad   bool
		value any
	}{
		{keyMaxQueueDelay, p.MaxQueueDelay < 0, p.MaxQueueDelay},
		{keyMaxBatchElements, p.MaxBatchElements < 0, p.MaxBatchElements},
		{keyMaxBatchTokens, p.MaxBatchTokens < 0, p.MaxBatchTokens},
		{keyMaxQueueSize, p.MaxQueueSize < 1, p.MaxQueueSize},
		{keyDefaultTimeout, p.DefaultTimeout < 0, p.DefaultTimeout},
		{keyPriorityLevels, p.PriorityLevels < 1 || p.PriorityLevels > MaxPriorityLevels, p.PriorityLevels},
		{keyDefaultPriority, p.DefaultPriority < 0 || p.DefaultPriority > p.PriorityLevels, p.DefaultPriority},
	} {
		if c.bad {
			return &PolicyError{Key: c.key, Value: fmt.Sprint(c.value), Want: p.accepts(c.key)}
		}
	}
	return nil
}

// Set parses one key of the policy from text, as the server's configuration
// gives it; key is as a user writes it (batching.max_queue_size). It checks
// only that the text is a number or a duration: the ranges are Validate's.
// The error is a [*PolicyError].
func (p *Policy) Set(key, text string) error {
	var err error
	switch key {
	case keyMaxQueueDelay:
		p.MaxQueueDelay, err = time.ParseDuration(text)
	case keyDefaultTimeout:
		p.DefaultTimeout, err = time.ParseDuration(text)
	case keyMaxQueueSize:
		p.MaxQueueSize, err = strconv.Atoi(text)
	case keyPriorityLevels:
		p.PriorityLevels, err = strconv.Atoi(text)
	case keyDefaultPriority:
		p.DefaultPriority, err = strconv.Atoi(text)
	case keyMaxBatchElements:
		p.MaxBatchElements, err = strconv.Atoi(text)
	case keyMaxBatchTokens:
		p.MaxBatchTokens, err = strconv.Atoi(text)
	default:
		return fmt.Errorf("batching: %q is not a batching policy key", key)
	}
	if err != nil {
		return &PolicyError{Key: key, Value: text, Want: p.accepts(key)}
	}
	return nil
}

// accepts says what key accepts, in the words of an error message.
func (p Policy) accepts(key string) string {
	switch key {
	case keyMaxQueueDelay:
		return "a duration of 0 or more, e.g. 500us or 2ms"
	case keyDefaultTimeout:
		return "a duration of 0 (no limit) or more, e.g. 5s"
	case keyMaxQueueSize:
		return "an integer of at least 1"
	case keyPriorityLevels:
		return fmt.Sprintf("an integer in 1..%d", MaxPriorityLevels)
	case keyDefaultPriority:
		return fmt.Sprintf("an integer in 1..%d (%s), or 0 for the lowest level", max(p.PriorityLevels, 1), keyPriorityLevels)
	case keyMaxBatchElements:
		return "an integer, 0 or more"
	case keyMaxBatchTokens:
		return "an integer, 0 (no limit) or more, e.g. 8192"
	}
	return "nothing: it is not a batching policy key"
}

// PolicyError is a policy key whose value is not accepted. Its message names
// the key as a user writes it, the value, and what is accepted:
//
//	batching.max_queue_size: "0"; want an integer of at least 1
type PolicyError struct {
	Key   string // batching.max_queue_size
	Value string
	Want  string
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("%s: %q; want %s", e.Key, e.Value, e.Want)
}
