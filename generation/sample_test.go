package generation

import (
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the draws' golden file from this package's Uniform")

// uniformGolden is shared with the worker's tests (test_sample.py): the
// same 1,000 (seed, position) pairs must draw the same float32 bits on
// every engine.
var uniformGolden = filepath.Join("..", "engine", "rbln", "worker", "testdata", "uniform32.json")

type uniformCase struct {
	Seed uint64 `json:"seed"`
	Pos  int    `json:"pos"`
	Bits uint32 `json:"bits"` // the draw's float32 bits
}

// uniformPairs are the pairs the golden file holds: the edges (seed 0, the
// largest seed, seeds that differ in one half, position 0 and the largest
// a sequence reaches), then pairs spread over both ranges.
func uniformPairs() []uniformCase {
	out := []uniformCase{{0, 0, 0}, {0, 1, 0}, {math.MaxUint64, 0, 0}, {math.MaxUint64, 1 << 20, 0},
		{1, 0, 0}, {1 << 32, 0, 0}, {0xffffffff, 7, 0}, {0xffffffff00000000, 7, 0}}
	z := uint64(0x0123456789abcdef)
	for len(out) < 1000 {
		z += 0x9e3779b97f4a7c15
		x := z
		x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
		x = (x ^ (x >> 27)) * 0x94d049bb133111eb
		x ^= x >> 31
		out = append(out, uniformCase{Seed: x, Pos: int(x>>40) % (1 << 20)})
	}
	return out
}

func TestUniformMatchesGolden(t *testing.T) {
	cases := uniformPairs()
	for i := range cases {
		cases[i].Bits = math.Float32bits(Uniform(cases[i].Seed, cases[i].Pos))
	}
	if *update {
		// One case a line.
		b := []byte("[\n")
		for i, c := range cases {
			line, err := json.Marshal(c)
			require.NoError(t, err)
			b = append(b, line...)
			if i < len(cases)-1 {
				b = append(b, ',')
			}
			b = append(b, '\n')
		}
		require.NoError(t, os.WriteFile(uniformGolden, append(b, "]\n"...), 0o644))
	}
	b, err := os.ReadFile(uniformGolden)
	require.NoError(t, err)
	var want []uniformCase
	require.NoError(t, json.Unmarshal(b, &want))
	require.Equal(t, want, cases, "Uniform drew other bits than the golden file the worker's tests read; an intended change rewrites it with go test ./generation -run Uniform -update")
}

func TestUniformIsUniform(t *testing.T) {
	// 64 bins over 64k draws of one seed, and of one position over many
	// seeds: each within 5 standard deviations of 1k.
	const n, bins = 1 << 16, 64
	for _, draw := range []func(i int) float32{
		func(i int) float32 { return Uniform(42, i) },
		func(i int) float32 { return Uniform(uint64(i)*0x100000001, 5) },
	} {
		var count [bins]int
		for i := range n {
			u := draw(i)
			require.True(t, u >= 0 && u < 1, "draw %v outside [0, 1)", u)
			count[int(u*bins)]++
		}
		sd := math.Sqrt(n / bins)
		for b, c := range count {
			assert.InDelta(t, n/bins, c, 5*sd, "bin %d", b)
		}
	}
}

func TestSeededDrawRepeats(t *testing.T) {
	logits := make([]float32, 100)
	for i := range logits {
		logits[i] = float32(i%7) * 0.3
	}
	sp := NewSampler(len(logits))
	s := Sampling{Temperature: 1, TopP: 0.9, TopK: 40, Seed: 7}
	a, b := sp.Sample(logits, nil, s, 3, nil), sp.Sample(logits, nil, s, 3, nil)
	assert.Equal(t, a.Token, b.Token)
	s.Seed = 8
	differ := false
	for pos := range 32 {
		s.Seed = 7
		x := sp.Sample(logits, nil, s, pos, nil).Token
		s.Seed = 8
		differ = differ || x != sp.Sample(logits, nil, s, pos, nil).Token
	}
	assert.True(t, differ, "two seeds drew the same 32 tokens")
}
