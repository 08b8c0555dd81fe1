package engine

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExplainUnknownIsNeverZero(t *testing.T) {
	for _, tc := range []struct {
		name string
		json string
		want Explain
	}{
		{"absent counts are unknown", `{"measured":true,"clean":true,"h2d":1}`,
			func() Explain { x := Unmeasured(); x.Measured, x.Clean, x.H2D = true, true, 1; return x }()},
		{"null counts are unknown", `{"measured":true,"h2d":null,"d2h":null,"wall_ns":null}`,
			func() Explain { x := Unmeasured(); x.Measured = true; return x }()},
		{"negative counts are unknown", `{"measured":true,"h2d":-7,"d2h":-1}`,
			func() Explain { x := Unmeasured(); x.Measured = true; return x }()},
		{"zero is zero", `{"measured":true,"clean":true,"cpu_fallbacks":0,"recompiles":0,"host_bounces":0,"host_bounce_bytes":0,"h2d":0,"d2h":0,"wall_ns":0,"h2d_ns":0,"d2h_ns":0,"v2v":0,"v2v_slow":0,"device_ns":0,"host_ops":0}`,
			Explain{Measured: true, Clean: true}},
		{"device time and host ops left out are unknown", `{"measured":true,"clean":true,"cpu_fallbacks":0,"recompiles":0,"host_bounces":0,"host_bounce_bytes":0,"h2d":0,"d2h":0,"wall_ns":0,"h2d_ns":0,"d2h_ns":0,"v2v":0,"v2v_slow":0}`,
			Explain{Measured: true, Clean: true, DeviceNS: Unknown, HostOps: Unknown}},
		{"an empty report measured nothing", `{}`, Unmeasured()},
		{"a null report measured nothing", `null`, Unmeasured()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var x Explain
			require.NoError(t, json.Unmarshal([]byte(tc.json), &x))
			assert.Equal(t, tc.want, x)
		})
	}
}

func TestExplainRoundTrip(t *testing.T) {
	in := Unmeasured()
	in.Measured, in.H2D, in.CPUFallbacks = true, 1, 0
	in.CPUFallbackByOp = map[string]int64{"aten::nonzero": 2}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"d2h":null`, "unknown is written as null, not 0")
	var out Explain
	require.NoError(t, json.Unmarshal(b, &out))
	assert.Equal(t, in, out)
}

func TestCountRefusesNonIntegers(t *testing.T) {
	var x Explain
	assert.Error(t, json.Unmarshal([]byte(`{"h2d":"1"}`), &x))
	assert.Error(t, json.Unmarshal([]byte(`{"h2d":1.5}`), &x))
}
