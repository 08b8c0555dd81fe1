package server

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A priority level the model does not have is its default level, as in
// Triton, however large; only what is not a non-negative integer is
// refused.
func TestPriorityOutOfRangeIsTheDefault(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	body := func(prio string) []byte {
		return []byte(`{"parameters":{"priority":` + prio + `},"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`)
	}
	for _, prio := range []string{"0", "1", "9", "4294967296", "18446744073709551615"} {
		w := do(t, s, "POST", "/v2/models/summax/infer", body(prio))
		assert.Equal(t, 200, w.Code, "priority %s: %s", prio, w.Body.String())
	}
	for _, prio := range []string{"-1", "1.5", `"1"`, "18446744073709551616"} {
		w := do(t, s, "POST", "/v2/models/summax/infer", body(prio))
		require.Equal(t, 400, w.Code, "priority %s", prio)
		assert.Contains(t, errorOf(t, w), "parameter priority must be a non-negative integer")
	}
}
