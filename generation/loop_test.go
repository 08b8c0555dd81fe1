package generation

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeModel is the stand-in decoder (model) as a Model: each step takes
// a millisecond of the bubble's clock, so that requests arrive between
// steps; gate, when set, holds steps until it is closed.
type fakeModel struct {
	mu     sync.Mutex
	steps  int
	most   int // the most sequences one step ran
	fail   error
	gate   chan struct{}
	tokens int
}

func (m *fakeModel) Step(ctx context.Context, step *Step) ([]Sampled, error) {
	m.mu.Lock()
	gate, fail := m.gate, m.fail
	m.steps++
	m.most = max(m.most, len(step.Work))
	m.tokens += step.Tokens()
	m.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	time.Sleep(time.Millisecond)
	if fail != nil {
		return nil, fail
	}
	out := make([]Sampled, len(step.Work))
	for i, w := range step.Work {
		if w.Samples() {
			out[i] = Sampled{Token: model(w.Seq)}
		}
	}
	return out, nil
}

// collect reads a stream to its end.
func collect(st *Stream) (tokens []int32, last Event) {
	for {
		ev, ok := st.Next(context.Background())
		if !ok {
			return tokens, Event{Err: errors.New("the stream ended without a last event")}
		}
		if ev.Last() {
			return tokens, ev
		}
		tokens = append(tokens, ev.Token)
	}
}

func newLoop(t *testing.T, o Options, m Model) *Loop {
	t.Helper()
	l, err := NewLoop(o, m)
	require.NoError(t, err)
	return l
}

// Requests that arrive at different times, on a loop whose steps run them
// together, each stream what they would alone, and end with their reason.
func TestLoopStreamsAsAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &fakeModel{}
		l := newLoop(t, Options{Blocks: 16, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 32, MaxBatchTokens: 8}, m)
		ctx, stop := context.WithCancel(context.Background())
		go l.Run(ctx)
		defer stop()

		type result struct {
			got  []int32
			last Event
		}
		var wg sync.WaitGroup
		results := make([]result, 10)
		reqs := make([]Request, 10)
		for i := range reqs {
			prompt := make([]int32, 1+i%7)
			for k := range prompt {
				prompt[k] = int32(3*i + k)
			}
			reqs[i] = Request{Prompt: prompt, MaxTokens: 2 + i%5}
			wg.Go(func() {
				time.Sleep(time.Duration(i) * time.Millisecond) // arrive between steps
				ch, err := l.Generate(context.Background(), reqs[i])
				require.NoError(t, err)
				results[i].got, results[i].last = collect(ch)
			})
		}
		wg.Wait()
		for i, r := range results {
			assert.Equal(t, alone(t, Sequence{Prompt: reqs[i].Prompt, MaxTokens: reqs[i].MaxTokens}), r.got, "request %d", i)
			assert.Equal(t, FinishLength, r.last.Finish)
		}
		assert.Greater(t, m.most, 1, "steps ran several sequences together")
		assert.Equal(t, 16, l.sched.Pool().Free())
	})
}

// A client that goes away stops its generation at the next step and its
// blocks come back; the others run on.
func TestLoopCancelFreesBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &fakeModel{}
		l := newLoop(t, Options{Blocks: 16, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 64, MaxBatchTokens: 16}, m)
		ctx, stop := context.WithCancel(context.Background())
		go l.Run(ctx)
		defer stop()

		cctx, cancel := context.WithCancel(context.Background())
		gone, err := l.Generate(cctx, Request{Prompt: []int32{1, 2, 3}, MaxTokens: 40})
		require.NoError(t, err)
		stays, err := l.Generate(context.Background(), Request{Prompt: []int32{4, 5}, MaxTokens: 6})
		require.NoError(t, err)
		_, ok := gone.Next(context.Background()) // a first token
		require.True(t, ok)
		cancel()
		_, last := collect(gone)
		assert.Equal(t, FinishCancelled, last.Finish)
		got, last := collect(stays)
		assert.Equal(t, FinishLength, last.Finish)
		_, more := stays.Next(context.Background())
		assert.False(t, more, "nothing after the last event")
		assert.Equal(t, alone(t, Sequence{Prompt: []int32{4, 5}, MaxTokens: 6}), got)
		synctest.Wait()
		assert.Equal(t, 16, l.sched.Pool().Free(), "the cancelled sequence's blocks are back")
	})
}

// Refusals come before anything runs; a failed step ends its sequences
// with the error; a stopped loop ends what is left with ErrStopped.
func TestLoopErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &fakeModel{gate: make(chan struct{})}
		l := newLoop(t, Options{Blocks: 8, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 16, MaxBatchTokens: 16}, m)
		ctx, stop := context.WithCancel(context.Background())
		go l.Run(ctx)

		_, err := l.Generate(context.Background(), Request{Prompt: make([]int32, 10), MaxTokens: 10})
		assert.ErrorIs(t, err, ErrTooLong)

		ch, err := l.Generate(context.Background(), Request{Prompt: []int32{1}, MaxTokens: 3})
		require.NoError(t, err)
		m.mu.Lock()
		m.fail = errors.New("device on fire")
		m.mu.Unlock()
		close(m.gate)
		_, last := collect(ch)
		assert.ErrorContains(t, last.Err, "device on fire")

		m.mu.Lock()
		m.fail, m.gate = nil, make(chan struct{}) // the next step waits
		m.mu.Unlock()
		ch, err = l.Generate(context.Background(), Request{Prompt: []int32{2}, MaxTokens: 3})
		require.NoError(t, err)
		synctest.Wait()
		stop()
		_, last = collect(ch)
		assert.ErrorIs(t, last.Err, ErrStopped)
		_, err = l.Generate(context.Background(), Request{Prompt: []int32{3}, MaxTokens: 1})
		assert.ErrorIs(t, err, ErrStopped)
	})
}

// A generation an end-of-sequence token ends says which, on its last
// event, with that token's log-probability (TGI lists it; best_of counts
// it), and it is not output.
func TestLoopReportsTheEndToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLoop(t, Options{Blocks: 16, BlockSize: 4, MaxNumSeqs: 2, MaxModelLen: 32, MaxBatchTokens: 8}, &fakeModel{})
		ctx, stop := context.WithCancel(context.Background())
		go l.Run(ctx)
		defer stop()
		seq := Sequence{Prompt: []int32{1, 2, 3}, MaxTokens: 8}
		first := alone(t, seq)[0]
		st, err := l.Generate(context.Background(), Request{Prompt: seq.Prompt, MaxTokens: 8, EOS: []int32{first}})
		require.NoError(t, err)
		got, last := collect(st)
		assert.Empty(t, got)
		assert.Equal(t, FinishStop, last.Finish)
		assert.True(t, last.EOS)
		assert.Equal(t, first, last.Token)
		// Ended by max_tokens: no end token.
		st, err = l.Generate(context.Background(), Request{Prompt: seq.Prompt, MaxTokens: 2})
		require.NoError(t, err)
		_, last = collect(st)
		assert.Equal(t, FinishLength, last.Finish)
		assert.False(t, last.EOS)
	})
}
