package serving

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/stepserve/stepserve/steps"
)

// The failover engine's steps add to the model's batch sizes.
func TestMergeExecutions(t *testing.T) {
	a := []steps.Execution{{BatchSize: 1, Count: 2, Infer: time.Second}, {BatchSize: 4, Count: 1, Infer: time.Second}}
	b := []steps.Execution{{BatchSize: 2, Count: 1, Infer: time.Millisecond}, {BatchSize: 4, Count: 3, Input: 1, Infer: 3 * time.Second, Output: 2}, {BatchSize: 8, Count: 1}}
	assert.Equal(t, []steps.Execution{
		{BatchSize: 1, Count: 2, Infer: time.Second},
		{BatchSize: 2, Count: 1, Infer: time.Millisecond},
		{BatchSize: 4, Count: 4, Input: 1, Infer: 4 * time.Second, Output: 2},
		{BatchSize: 8, Count: 1},
	}, mergeExecutions(a, b))
	assert.Equal(t, b, mergeExecutions(nil, b))
}
