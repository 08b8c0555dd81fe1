package npugroup

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for in, want := range map[string][]string{
		"":                  nil,
		"0":                 {"0"},
		" 0 , 1 ":           {"0", "1"},
		"[0,1],[2,3]":       {"0,1", "2,3"},
		"[ 0 , 1 ] , 4":     {"0,1", "4"},
		"2,[3,4,5,6]":       {"2", "3,4,5,6"},
		"[7]":               {"7"},
		"00,[01,2]":         {"0", "1,2"},
		"0,,1":              {"0", "1"},
		"[0,1],[2,3],[4,5]": {"0,1", "2,3", "4,5"},
	} {
		got, err := Parse(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for in, want := range map[string]string{
		"[0,1":     "has no closing ]",
		"[0,0]":    "NPU 0 twice",
		"[]":       `"" is not an NPU index`,
		"[0,-1]":   `"-1" is not an NPU index`,
		"gpu0":     `device "gpu0" is not an NPU index`,
		"[0,1][2]": "want a comma between entries",
		"0]":       `device "0]" is not an NPU index`,
	} {
		_, err := Parse(in)
		assert.ErrorContains(t, err, want, in)
	}
}

func TestEntry(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want string
	}{{1, "1"}, {"2", "2"}, {[]any{0, 1}, "0,1"}, {"[3,4]", "3,4"}, {"5,6", "5,6"}} {
		got, err := Entry(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
	_, err := Entry("[0],[1]")
	assert.ErrorContains(t, err, "names 2 devices")
	_, err = Entry([]any{0, "x"})
	assert.ErrorContains(t, err, `"x" is not an NPU index`)
}

func TestDistinct(t *testing.T) {
	assert.NoError(t, Distinct([]string{"0,1", "2,3", "4"}))
	assert.ErrorContains(t, Distinct([]string{"0,1", "1,2"}), "NPU 1 is in two devices (0,1 and 1,2)")
	assert.ErrorContains(t, Distinct([]string{"0", "0"}), "device 0 is listed twice")
}
