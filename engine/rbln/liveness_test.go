package rbln

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestLivenessVerdict(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const stall, compile = 10 * time.Second, 30 * time.Minute
	for _, tc := range []struct {
		name string
		h    health
		now  time.Duration // after t0
		want string        // "" for alive
	}{
		{"answering", health{heard: t0}, time.Second, ""},
		{"a ping out, within the stall", health{heard: t0, pinged: t0.Add(time.Second)}, 9 * time.Second, ""},
		{"a ping out, past the stall", health{heard: t0, pinged: t0.Add(time.Second)}, 12 * time.Second, "stopped answering pings within 10s"},
		{"a ping out, but a result heard since", health{heard: t0.Add(5 * time.Second), pinged: t0}, 12 * time.Second, ""},
		{"building, long past the stall", health{heard: t0, pinged: t0, building: "compile of m.1 bucket 0", buildingSince: t0}, 20 * time.Minute, ""},
		{"building past the compile deadline", health{heard: t0, building: "compile of m.1 bucket 0", buildingSince: t0}, 31 * time.Minute,
			"compile of m.1 bucket 0 ran 31m0s, past the compile deadline (rbln.compile_timeout 30m0s)"},
		{"built, the late pong not yet read", health{heard: t0.Add(20 * time.Minute), pinged: t0}, 20*time.Minute + time.Second, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.h.verdict(t0.Add(tc.now), stall, compile)
			if tc.want == "" {
				assert.NoError(t, err)
			} else {
				assert.EqualError(t, err, tc.want)
			}
		})
	}
}
