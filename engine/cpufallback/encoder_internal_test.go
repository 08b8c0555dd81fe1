package cpufallback

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
)

// Leaving padding out changes no embedding: random masks (prefixes, holes,
// empty rows, a padded first token under cls pooling) give what computing
// every token under the key mask gives.
func TestCompactionAnswersAsTheFullStep(t *testing.T) {
	m, err := models.Load("testdata/encoder")
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(7, 8))
	shape := bucketing.Shape{Batch: 4, Seq: 32}
	for _, pooling := range []string{"mean", "cls"} {
		m.Encoder.Config.Pooling = pooling
		layout := engine.NewLayout(m.Config, shape)
		for trial := range 20 {
			in := make([]byte, layout.InBytes)
			ids, mask, types := int64s(in[layout.Inputs[models.EncoderInputIDs].Offset:]), int64s(in[layout.Inputs[models.EncoderAttentionMask].Offset:]), int64s(in[layout.Inputs[models.EncoderTokenTypeIDs].Offset:])
			for b := range shape.Batch {
				n := rng.IntN(shape.Seq + 1)
				for s := range shape.Seq {
					t := b*shape.Seq + s
					ids[t] = int64(rng.IntN(m.Encoder.Config.VocabSize))
					types[t] = int64(rng.IntN(m.Encoder.Config.TypeVocabSize))
					switch {
					case trial%3 == 0: // holes anywhere
						mask[t] = int64(rng.IntN(2))
					case s < n: // a prefix
						mask[t] = 1
					}
				}
			}
			out := map[bool][]float32{}
			for _, full := range []bool{false, true} {
				p := newEncoderPlan(m.Encoder, newResidentWeights(m), layout)
				p.neverCompact = full
				o := make([]byte, layout.OutBytes)
				require.NoError(t, p.step(in, o))
				out[full] = append([]float32(nil), floats(o)...)
			}
			for b := range shape.Batch {
				row := mask[b*shape.Seq : (b+1)*shape.Seq]
				empty := true
				for _, v := range row {
					empty = empty && v == 0
				}
				if empty {
					continue // a padding row: its output is never read
				}
				H := m.Encoder.Config.Hidden
				for j := range H {
					got, want := out[false][b*H+j], out[true][b*H+j]
					require.InDelta(t, want, got, 2e-5, "%s pooling, trial %d, row %d (mask %v), dim %d", pooling, trial, b, row, j)
					require.False(t, math.IsNaN(float64(got)))
				}
			}
		}
	}
}

// A step split into groups of sequences that run side by side answers as
// the same step run whole, for every way the split can fall.
func TestGroupsAnswerAsOneStep(t *testing.T) {
	m, err := models.Load("testdata/encoder")
	require.NoError(t, err)
	defer SetThreads(0)
	rng := rand.New(rand.NewPCG(9, 10))
	shape := bucketing.Shape{Batch: 16, Seq: 64}
	layout := engine.NewLayout(m.Config, shape)
	in := make([]byte, layout.InBytes)
	ids, mask := int64s(in[layout.Inputs[models.EncoderInputIDs].Offset:]), int64s(in[layout.Inputs[models.EncoderAttentionMask].Offset:])
	for b := range shape.Batch {
		n := rng.IntN(shape.Seq + 1)
		for s := range n {
			ids[b*shape.Seq+s] = int64(rng.IntN(m.Encoder.Config.VocabSize))
			mask[b*shape.Seq+s] = 1
		}
	}
	run := func(threads int) ([]float32, int) {
		SetThreads(threads)
		p := newEncoderPlan(m.Encoder, newResidentWeights(m), layout)
		p.scores = scoreBuffers(8, shape.Seq) // room for 8 groups whatever the CPUs
		p.attn = make([]attnTask, 8)
		p.crews, p.gthreads = make([]*crew, 8), make([]int, 8)
		o := make([]byte, layout.OutBytes)
		require.NoError(t, p.step(in, o))
		return append([]float32(nil), floats(o)...), len(p.groups) - 1
	}
	whole, groups := run(1)
	require.Equal(t, 1, groups)
	for _, threads := range []int{2, 3, 8} {
		split, groups := run(threads)
		assert.Greater(t, groups, 1, "%d threads split the step", threads)
		assert.InDeltaSlice(t, whole, split, 1e-6, "%d threads (%d groups)", threads, groups)
	}
}

// A step with fewer sequences than threads splits each product's panels
// and each layer's heads among them: a one-sequence step answers as on one
// thread, and allocates nothing.
func TestOneSequenceUsesEveryThread(t *testing.T) {
	m, err := models.Load("testdata/encoder")
	require.NoError(t, err)
	defer SetThreads(0)
	defer func(w int) { minParallelWork = w }(minParallelWork)
	minParallelWork = 0 // the golden encoder's products are small
	rng := rand.New(rand.NewPCG(11, 12))
	shape := bucketing.Shape{Batch: 1, Seq: 64}
	layout := engine.NewLayout(m.Config, shape)
	in := make([]byte, layout.InBytes)
	ids, mask := int64s(in[layout.Inputs[models.EncoderInputIDs].Offset:]), int64s(in[layout.Inputs[models.EncoderAttentionMask].Offset:])
	for s := range 50 {
		ids[s] = int64(rng.IntN(m.Encoder.Config.VocabSize))
		mask[s] = 1
	}
	withCrewCPUs(t, 8) // a crew of up to 8 threads whatever the CPUs
	defer func(w int) { minCrewWork = w }(minCrewWork)
	minCrewWork = 0
	var last func() // one more step of the last plan run
	run := func(threads int) ([]float32, int) {
		SetThreads(threads)
		p := newEncoderPlan(m.Encoder, newResidentWeights(m), layout)
		p.scores = scoreBuffers(8, shape.Seq) // room for 8 threads whatever the CPUs
		o := make([]byte, layout.OutBytes)
		require.NoError(t, p.step(in, o))
		require.Zero(t, testing.AllocsPerRun(3, func() { require.NoError(t, p.step(in, o)) }), "%d threads", threads)
		last = func() { require.NoError(t, p.step(in, o)) }
		return append([]float32(nil), floats(o)...), p.threads
	}
	whole, n := run(1)
	require.Equal(t, 1, n)
	helped := crewHelped()
	for _, threads := range []int{2, 3, 8} {
		split, n := run(threads)
		assert.Equal(t, threads, n, "one group takes every thread")
		assert.InDeltaSlice(t, whole, split, 1e-6, "%d threads", threads)
	}
	if products != nil && products.isa != 0 {
		// The caller takes chunks first, and on a machine of few CPUs
		// busy with other tests the crew's threads may not be scheduled
		// before a step's chunks are gone: step on (a bounded number of
		// times) until they have taken some.
		for i := 0; i < 500 && crewHelped() == helped; i++ {
			last()
		}
		assert.Greater(t, crewHelped(), helped, "the crews' threads ran some of the chunks")
	}
}

// crewHelped counts the chunks every crew's threads have run.
func crewHelped() int {
	crews.mu.Lock()
	defer crews.mu.Unlock()
	n := 0
	for _, c := range crews.free {
		if c.nat != nil {
			n += c.nat.helped()
		}
	}
	return n
}
