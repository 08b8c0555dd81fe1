package wire

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestScanStringsCountsAsItGoes(t *testing.T) {
	cases := []struct {
		data string
		rank int
		n    int
		want []string
		err  string
	}{
		{data: `["a","b"]`, rank: 1, n: 2, want: []string{"a", "b"}},
		{data: ` [ ["a"] , ["\u00e9\n"] ] `, rank: 2, n: 2, want: []string{"a", "é\n"}},
		{data: `[]`, rank: 1, n: 0, want: []string{}},
		{data: `["a","b","c"]`, rank: 1, n: 2, err: "more strings than the shape holds"},
		{data: `[["a"]]`, rank: 1, n: 1, err: "data is nested deeper than its shape's 1 dimensions"},
		{data: `["a",42]`, rank: 1, n: 2, err: "element 1 is 42; want a string"},
		{data: `["a",{"b":1}]`, rank: 1, n: 2, err: `element 1 is {"b":1}; want a string`},
		{data: `"a"`, rank: 1, n: 1, err: "data must be an array of strings"},
	}
	for _, c := range cases {
		got, err := scanStrings([]byte(c.data), c.rank, make([]string, 0, c.n))
		if c.err != "" {
			assert.ErrorContains(t, err, c.err, c.data)
			continue
		}
		require.NoError(t, err, c.data)
		assert.Equal(t, c.want, got, c.data)
	}
}
