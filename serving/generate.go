package serving

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// ErrNotGenerative is a generation asked of a model that is not a
// language model, or an inference asked of one that is: a 400 that names
// the API to use.
var ErrNotGenerative = errors.New("the model is not served by this API")

// Bounds on a generation request, whichever API it came by.
const (
	// MaxStops bounds the stop strings (OpenAI takes 4; Triton's
	// generate more).
	MaxStops    = 16
	maxStopLen  = 256
	MaxLogprobs = 20
	// promptBytesPerToken bounds a prompt's bytes before it is tokenized:
	// more than this many bytes per token of max_model_len is refused
	// without tokenizing (natural text is under 10).
	promptBytesPerToken = 32
)

// GenerateRequest is a generation asked of a decoder model, whichever API
// it came by: a prompt, or chat messages the model's template renders.
// Nil fields take the model's defaults (generation_config.json, then
// model.yaml's generation keys).
type GenerateRequest struct {
	Prompt string
	// PromptIDs is a prompt given as token ids (OpenAI's completions take
	// them), used as they are.
	PromptIDs []int32
	Messages  []models.ChatMessage
	// Tools are the tools the messages' template renders (OpenAI's tool
	// definitions as decoded JSON); nil for none.
	Tools []any
	// MaxTokens bounds the tokens generated; nil is the model's default,
	// cut to what max_model_len leaves after the prompt.
	MaxTokens   *int
	Temperature *float64
	TopP        *float64
	TopK        *int
	Seed        *int64
	Stop        []string // never part of the text; the first one met ends it
	// Logprobs asks for each token's log-probability (0) and its
	// Logprobs most likely alternatives (up to MaxLogprobs); -1 for none.
	Logprobs  int
	IgnoreEOS bool
	// MinTokens is how many tokens are generated before an
	// end-of-sequence token may end the generation (vLLM's min_tokens);
	// such tokens before it are generated, and left out of the text as
	// special tokens are.
	MinTokens int
	// RepetitionPenalty (vLLM's and TGI's; 1 is none), FrequencyPenalty
	// and PresencePenalty (OpenAI's; 0 is none) discourage the tokens a
	// sequence has seen; nil is none.
	RepetitionPenalty, FrequencyPenalty, PresencePenalty *float64
	// LogitBias is added to its tokens' logits (OpenAI's logit_bias:
	// -100 to 100, at most generation.MaxLogitBias tokens).
	LogitBias map[int32]float64
	// StopTokenIDs end the generation as an end-of-sequence token does
	// (vLLM's stop_token_ids), not part of the output.
	StopTokenIDs []int32
	// ScorePrompt asks for the prompt tokens' log-probabilities (echo
	// with logprobs, TGI's decoder_input_details), with Logprobs most
	// likely tokens at each place: the first event's TextEvent.Prompt.
	ScorePrompt bool
	// After, when set, is a generation of the same request's prompt
	// started before (n choices): this one starts once that one's prompt
	// is computed, and shares its cached blocks.
	After *TextStream
	// Truncate keeps the prompt's last Truncate tokens (TGI's truncate);
	// 0 keeps them all.
	Truncate int
	Priority int // lower runs first
	// Constraint, when set, is the structured output the generation must
	// match (constrain.go).
	Constraint *Constraint
	// NoSpeculation keeps the generation out of the model's speculative
	// decoding (generation.speculative): its text is the same either
	// way, only its steps differ.
	NoSpeculation bool
}

// TokenInfo is one generated token, for the APIs that return them.
type TokenInfo struct {
	ID      int32
	Text    string // the token decoded on its own
	Bytes   []byte // its raw bytes (part of a character, for some)
	Special bool   // a special token of the tokenizer's (its text is left out of the output)
	Logprob float32
	Top     []TopToken
}

// TopToken is one of the most likely tokens at a position.
type TopToken struct {
	ID      int32
	Text    string
	Bytes   []byte
	Logprob float32
}

// TextEvent is a piece of a generation's text: the text its tokens
// completed (never a split UTF-8 character, never a stop string or what
// may begin one), and, last, why it ended (Finish "stop" or "length") or
// the error that ended it.
type TextEvent struct {
	Text   string
	Tokens []TokenInfo // the tokens since the last event (with logprobs when asked)
	Finish string
	// Stop is the stop string that ended the generation, on its last
	// event; "" for any other end.
	Stop string
	Err  error
	// Prompt, on the first event of a generation that asked
	// (ScorePrompt), are the prompt's tokens, each with its
	// log-probability given those before it (NaN for the first).
	Prompt []TokenInfo
	// EOS, on the last event of a generation an end-of-sequence token
	// ended, is that token (not part of the text or the tokens).
	EOS *TokenInfo
}

// generator is a decoder model's loop on its engine.
type generator struct {
	loop    *generation.Loop
	dec     engine.Decoder
	stop    context.CancelFunc
	done    chan struct{}
	tok     *models.HFTokenizer
	eos     []int32
	opts    models.GenerationOptions
	chat    *models.ChatTemplate
	metrics *genSeries
	vocab   int           // the model's embedding rows: token ids below it
	live    atomic.Int64  // generations not yet closed
	retired atomic.Bool   // draining: its loop no longer reports the gauges
	idle    chan struct{} // signalled when live drops to zero
	// grammars are its compiled constraints (constrain.go).
	grammars grammars
}

// newDecoderModel loads a decoder model on its engine and starts its
// loop.
func (l *loader) newDecoderModel(ctx context.Context, m *models.Model) (*Model, error) {
	name := l.enginesFor(m.Config)[0]
	eng, err := l.engines.get(name)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", m.Name, err)
	}
	de, ok := eng.(engine.DecoderEngine)
	if !ok {
		return nil, fmt.Errorf("model %s: %w: engine %s does not run decoder language models yet; set engine: cpu in its model.yaml", m.Name, ErrEngineUnavailable, name)
	}
	hf, ok := m.Tokenizer.(*models.HFTokenizer)
	if !ok {
		return nil, fmt.Errorf("model %s: a decoder language model needs a tokenizer.json", m.Name)
	}
	dec, err := de.LoadDecoder(ctx, m)
	if err != nil {
		return nil, loadError(m.Name, name, err)
	}
	if r, ok := dec.(engine.WeightReleaser); ok {
		// The engine holds the weights in its own layout: the model's
		// float32 copies would double the memory a model takes.
		r.ReleaseWeights(m)
	}
	if so, ok := dec.(engine.StepObserver); ok {
		if err := l.judgeWarmups(m.Name, name, so); err != nil {
			dec.Close()
			return nil, err
		}
		// The device steps' explain reports, on the step series every
		// model's steps are counted on (and alerted on).
		rec := l.opts.StepMetrics.Recorder(m.Name, eng.Name(), "", so.Shapes())
		so.ObserveSteps(func(bucket, rows int, padding float64, took time.Duration, x engine.Explain) {
			rec.Observe(bucket, rows, padding, took, x)
		})
	}
	g := m.Config.Generation
	loop, err := generation.NewLoop(g.Loop(), dec)
	if err != nil {
		dec.Close()
		return nil, fmt.Errorf("model %s: %w", m.Name, err)
	}
	gen := &generator{loop: loop, dec: dec, done: make(chan struct{}), tok: hf, opts: *g, chat: m.Decoder.Chat, vocab: m.Decoder.Config.Vocab,
		metrics: l.metrics.generation(m.Name, g.BlockSize, g.KVCacheBlocks), idle: make(chan struct{}, 1)}
	if gc := m.Decoder.Generation; gc != nil {
		for _, id := range gc.EOS {
			gen.eos = append(gen.eos, int32(id))
		}
	}
	loop.Observe = func(step *generation.Step, took time.Duration, st generation.State) {
		if !gen.retired.Load() { // a reload's new version owns the series now
			gen.metrics.observe(step, took, st)
		}
	}
	var run context.Context
	run, gen.stop = context.WithCancel(context.Background())
	go func() {
		defer close(gen.done)
		loop.Run(run)
	}()
	sm := &Model{model: m, backend: backend{engine: name, gen: gen}, set: l.set, loaded: time.Now(),
		logger: l.logger.With("model", m.Name, "engine", name)}
	if why := m.Decoder.Chat.Refused(); why != "" {
		sm.logger.Warn("chat template refused: the model serves without chat", "reason", why)
	}
	return sm, nil
}

// judgeWarmups reads a decoder's warm-up as a Runner's is read
// (steps.Runner.Warmup): a bucket whose second run was measured and is
// not clean (its program runs operators on the host, a fallback, a
// recompile) refuses the model under the engine's strict warm-up, naming
// the kind and bucket; otherwise it is logged and served.
func (l *loader) judgeWarmups(model, engineName string, so engine.StepObserver) error {
	shapes := so.Shapes()
	for i, x := range so.Warmups() {
		if v := steps.Check(&x); v.Clean || v.Unmeasured {
			continue
		}
		kind := "prefill"
		if shapes[i].Seq == 1 {
			kind = "decode"
		}
		err := fmt.Errorf("model %s: warm-up of %s bucket %s is not clean on its second run: %s", model, kind, shapes[i].Label(), strings.Join(x.Reasons, "; "))
		if l.engines.strictWarmup(engineName) {
			return err
		}
		l.logger.Warn("decoder warm-up not clean", "model", model, "err", err)
	}
	return nil
}

// Generative reports whether the model is a language model, served by
// Generate.
func (m *Model) Generative() bool { return m.gen != nil }

// ChatTemplate reports whether the model has a chat template (not one
// refused at load).
func (m *Model) ChatTemplate() bool {
	return m.gen != nil && m.gen.chat != nil && m.gen.chat.Refused() == ""
}

// ChatTemplateRefused says why the model's chat template was refused at
// load (it exceeded its evaluation budget on a probe conversation), or
// "" when it was not.
func (m *Model) ChatTemplateRefused() string {
	if m.gen == nil {
		return ""
	}
	return m.gen.chat.Refused()
}

// Decode is the text of token ids by the model's tokenizer, special
// tokens kept (a prompt given as ids, echoed back).
func (m *Model) Decode(ids []int32) string {
	if m.gen == nil {
		return ""
	}
	wide := make([]int64, len(ids))
	for i, id := range ids {
		wide[i] = int64(id)
	}
	return m.gen.tok.Tokenizers().Decode(wide, false)
}

// EndToken is the model's first end-of-sequence token, for the APIs
// that name the token a generation ended on (its log-probability is not
// known: NaN); false for a model with none.
func (m *Model) EndToken() (TokenInfo, bool) {
	if m.gen == nil || len(m.gen.eos) == 0 {
		return TokenInfo{}, false
	}
	id := int64(m.gen.eos[0])
	tok := m.gen.tok.Tokenizers()
	return TokenInfo{ID: int32(id), Text: tok.Decode([]int64{id}, false), Bytes: tok.TokenBytes(id), Special: tok.Special(id),
		Logprob: float32(math.NaN())}, true
}

// GenerationOptions are a language model's generation bounds.
func (m *Model) GenerationOptions() models.GenerationOptions {
	if m.gen == nil {
		return models.GenerationOptions{}
	}
	return m.gen.opts
}

func badGenerate(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadParameter, fmt.Sprintf(format, args...))
}

// Generate starts a generation. Everything it can refuse (the prompt
// too long, a parameter out of range, messages the template refuses) is
// refused here, wrapping ErrBadParameter, before any KV cache block is
// taken. The stream must be closed.
func (m *Model) Generate(ctx context.Context, r *GenerateRequest) (*TextStream, error) {
	g := m.gen
	if g == nil {
		return nil, fmt.Errorf("model %s is not a language model; it serves inference (/v2/models/%s/infer) (%w)", m.model.Name, m.model.Name, ErrNotGenerative)
	}
	if m.closed.Load() {
		return nil, ErrDraining
	}
	if r.Priority < 0 {
		return nil, badGenerate("priority %d; want 0 (the default: first) or more (later)", r.Priority)
	}

	sampling, err := g.sampling(r)
	if err != nil {
		return nil, err
	}
	if r.ScorePrompt && !g.opts.ScoresPrompts() {
		return nil, badGenerate("model %s does not serve the prompt's log-probabilities (echo with logprobs, decoder_input_details): its model.yaml sets generation.prompt_logprobs false", m.model.Name)
	}
	if ps, ok := g.dec.(interface{ ScoresPrompts() bool }); ok && r.ScorePrompt && !ps.ScoresPrompts() {
		return nil, badGenerate("model %s does not serve the prompt's log-probabilities (echo with logprobs, decoder_input_details) on the %s engine: its prefill buckets are too large for a scoring step's logits; add a smaller buckets.seq or buckets.batch", m.model.Name, m.engine)
	}
	if pz, ok := g.dec.(interface{ Penalizes() bool }); ok && sampling.Penalties.Active() && !pz.Penalizes() {
		return nil, badGenerate("penalties and logit_bias run in the masked decode steps on the %s engine, which model %s's generation.structured_output false leaves out", m.engine, m.model.Name)
	}
	for i, s := range r.Stop {
		if s == "" || len(s) > maxStopLen {
			return nil, badGenerate("stop[%d] is %d bytes; want 1 to %d", i, len(s), maxStopLen)
		}
	}
	if len(r.Stop) > MaxStops {
		return nil, badGenerate("%d stop strings; want at most %d", len(r.Stop), MaxStops)
	}
	prompt, err := g.prompt(ctx, r)
	if err != nil {
		return nil, err
	}
	switch {
	case r.Truncate < 0:
		return nil, badGenerate("truncate %d; want 0 (keep the whole prompt) or the prompt tokens to keep", r.Truncate)
	case r.Truncate > 0 && len(prompt) > r.Truncate:
		prompt = prompt[len(prompt)-r.Truncate:]
	}
	most := g.opts.MaxModelLen
	room := most - len(prompt)
	if room < 1 {
		return nil, badGenerate("the prompt is %d tokens, which leaves no room for output under the model's max_model_len %d", len(prompt), most)
	}
	maxTokens := min(g.opts.MaxTokens, room)
	if r.MaxTokens != nil {
		maxTokens = *r.MaxTokens
		switch {
		case maxTokens < 1:
			return nil, badGenerate("max_tokens %d; want at least 1", maxTokens)
		case maxTokens > room:
			return nil, badGenerate("max_tokens %d with a prompt of %d tokens is more than max_model_len %d holds; want at most %d", maxTokens, len(prompt), most, room)
		}
	}
	var eos []int32
	if !r.IgnoreEOS {
		eos = g.eos
	}
	if len(r.StopTokenIDs) > MaxStops {
		return nil, badGenerate("%d stop_token_ids; want at most %d", len(r.StopTokenIDs), MaxStops)
	}
	for i, id := range r.StopTokenIDs {
		if id < 0 || int(id) >= g.vocab {
			return nil, badGenerate("stop_token_ids[%d] is token id %d, outside the model's vocabulary (0 to %d)", i, id, g.vocab-1)
		}
	}
	if len(r.StopTokenIDs) > 0 {
		eos = append(slices.Clip(eos), r.StopTokenIDs...)
	}
	if r.MinTokens < 0 || r.MinTokens > maxTokens {
		return nil, badGenerate("min_tokens %d; want 0 to max_tokens (%d)", r.MinTokens, maxTokens)
	}
	var constraint generation.Constraint
	if r.Constraint != nil {
		if !g.opts.Structured() {
			return nil, fmt.Errorf("%w: model %s does not serve structured output (a JSON schema, JSON object, regex, choices or a required tool call): its model.yaml sets generation.structured_output false",
				ErrBadParameter, m.model.Name)
		}
		if constraint, err = g.constraint(r.Constraint); err != nil {
			return nil, err
		}
	}
	// A place among the model's generations is taken before the loop
	// sees it (a step may hold the loop a while), and given back if the
	// loop does not take it.
	if live := g.live.Add(1); live > int64(g.opts.MaxNumSeqs+g.opts.MaxQueueSize) {
		g.release()
		return nil, fmt.Errorf("%w: model %s holds %d generations: max_num_seqs %d running and generation.max_queue_size %d waiting",
			ErrQueueFull, m.model.Name, live-1, g.opts.MaxNumSeqs, g.opts.MaxQueueSize)
	}
	// The place is the loop's work: it is given back when the loop ends
	// the generation, not when its client has read it all (a client
	// that does not read holds its stream's events, charged to the
	// in-flight budget by its door, and never the model's places).
	var once sync.Once
	release := func() { once.Do(g.release) }
	gctx, cancel := context.WithCancel(ctx)
	start := time.Now()
	var after *generation.Stream
	if r.After != nil {
		after = r.After.st
	}
	st, err := g.loop.Generate(gctx, generation.Request{Prompt: prompt, MaxTokens: maxTokens, Priority: r.Priority, EOS: eos,
		MinTokens: r.MinTokens, Sampling: sampling, Constraint: constraint, Ended: release, After: after,
		ScorePrompt: r.ScorePrompt, PromptTop: max(r.Logprobs, 0), NoDraft: r.NoSpeculation})
	if err != nil {
		release()
		cancel()
		switch {
		case errors.Is(err, generation.ErrTooLong):
			return nil, fmt.Errorf("%w: %w", ErrBadParameter, err)
		case errors.Is(err, generation.ErrStopped):
			return nil, ErrDraining
		}
		return nil, err
	}
	g.metrics.admitted(len(prompt))
	ts := &TextStream{g: g, st: st, cancel: cancel, release: release, stops: r.Stop, start: start, logprobs: r.Logprobs >= 0, prompt: prompt, scored: r.ScorePrompt,
		dec: g.tok.Tokenizers().NewStream(true), PromptTokens: len(prompt), maxTokens: maxTokens, top: max(r.Logprobs, 0)}
	return ts, nil
}

// sampling checks r's sampling parameters and fills the model's defaults.
func (g *generator) sampling(r *GenerateRequest) (generation.Sampling, error) {
	s := generation.Sampling{Logprobs: r.Logprobs}
	temp, topP, topK := 1.0, 1.0, 0
	// generation_config.json's defaults are not read here: OpenAI's
	// defaults (temperature 1, top_p 1) are what clients expect of these
	// APIs, and what vLLM answers by default.
	if r.Temperature != nil {
		temp = *r.Temperature
	}
	if r.TopP != nil {
		topP = *r.TopP
	}
	if r.TopK != nil {
		topK = *r.TopK
	}
	switch {
	case math.IsNaN(temp) || temp < 0 || temp > 100:
		return s, badGenerate("temperature %g; want 0 (greedy) to 100", temp)
	case math.IsNaN(topP) || topP <= 0 || topP > 1:
		return s, badGenerate("top_p %g; want 0 < top_p <= 1", topP)
	case topK < -1:
		return s, badGenerate("top_k %d; want -1 or 0 (every token) or a positive count", topK)
	case r.Logprobs < -1 || r.Logprobs > MaxLogprobs:
		return s, badGenerate("top_logprobs %d; want 0 to %d", r.Logprobs, MaxLogprobs)
	}
	pen, err := g.penalties(r)
	if err != nil {
		return s, err
	}
	s.Penalties = pen
	s.Temperature, s.TopP, s.TopK = float32(temp), float32(topP), max(topK, 0)
	if s.TopP == 0 { // a top_p below float32's least: the most likely token
		s.TopP = math.SmallestNonzeroFloat32
	}
	if r.Seed != nil {
		s.Seed = uint64(*r.Seed)
	} else {
		s.Seed = rand.Uint64()
	}
	return s, nil
}

// penalties checks r's penalties and logit bias.
func (g *generator) penalties(r *GenerateRequest) (generation.Penalties, error) {
	var p generation.Penalties
	if v := r.RepetitionPenalty; v != nil {
		if math.IsNaN(*v) || *v <= 0 || *v > 10 {
			return p, badGenerate("repetition_penalty %g; want above 0 up to 10 (1 is none)", *v)
		}
		p.Repetition = float32(*v)
	}
	for _, f := range []struct {
		name string
		v    *float64
		to   *float32
	}{{"frequency_penalty", r.FrequencyPenalty, &p.Frequency}, {"presence_penalty", r.PresencePenalty, &p.Presence}} {
		if f.v == nil {
			continue
		}
		if math.IsNaN(*f.v) || *f.v < -2 || *f.v > 2 {
			return p, badGenerate("%s %g; want -2 to 2 (0 is none)", f.name, *f.v)
		}
		*f.to = float32(*f.v)
	}
	if len(r.LogitBias) > generation.MaxLogitBias {
		return p, badGenerate("logit_bias has %d tokens; want at most %d", len(r.LogitBias), generation.MaxLogitBias)
	}
	for tok, b := range r.LogitBias {
		switch {
		case tok < 0 || int(tok) >= g.vocab:
			return p, badGenerate("logit_bias token %d is outside the model's vocabulary (0 to %d)", tok, g.vocab-1)
		case math.IsNaN(b) || b < -100 || b > 100:
			return p, badGenerate("logit_bias %g for token %d; want -100 to 100", b, tok)
		}
		p.Bias = append(p.Bias, generation.LogitBias{Token: tok, Bias: float32(b)})
	}
	slices.SortFunc(p.Bias, func(a, b generation.LogitBias) int { return cmp.Compare(a.Token, b.Token) })
	return p, nil
}

// prompt is r's prompt's token ids: the text as the tokenizer frames it
// (a Llama's BOS), or the messages rendered by the chat template and
// tokenized as they are (the template writes the special tokens).
func (g *generator) prompt(ctx context.Context, r *GenerateRequest) ([]int32, error) {
	if r.PromptIDs != nil {
		if r.Prompt != "" || r.Messages != nil {
			return nil, badGenerate("give a prompt as text, as token ids or as messages: one of them")
		}
		if len(r.PromptIDs) == 0 {
			return nil, badGenerate("the prompt is empty; want at least one token")
		}
		if len(r.PromptIDs) > g.opts.MaxModelLen {
			return nil, badGenerate("the prompt is %d tokens, which leaves no room for output under the model's max_model_len %d", len(r.PromptIDs), g.opts.MaxModelLen)
		}
		for i, id := range r.PromptIDs {
			if id < 0 || int(id) >= g.vocab {
				return nil, badGenerate("prompt[%d] is token id %d, outside the model's vocabulary (0 to %d)", i, id, g.vocab-1)
			}
		}
		return r.PromptIDs, nil
	}
	text, special := r.Prompt, true
	if r.Messages != nil {
		if r.Prompt != "" {
			return nil, badGenerate("give a prompt or messages, not both")
		}
		if g.chat == nil {
			return nil, badGenerate("the model has no chat template (its tokenizer_config.json has no chat_template); send a prompt to the completions API instead")
		}
		if why := g.chat.Refused(); why != "" {
			return nil, badGenerate("the model's chat template was refused at load (%s): the model serves no chat; send a prompt to the completions API instead", why)
		}
		for i, msg := range r.Messages {
			if len(msg.Content) > g.opts.MaxModelLen*promptBytesPerToken {
				return nil, badGenerate("messages[%d] is %d bytes, more than max_model_len %d tokens can hold", i, len(msg.Content), g.opts.MaxModelLen)
			}
		}
		var err error
		if text, err = g.chat.RenderTools(ctx, r.Messages, r.Tools, true); err != nil {
			// A template past its budget is the model's fault (a 500),
			// an ended request its own.
			if errors.Is(err, models.ErrChatTemplateBudget) || ctx.Err() != nil {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %w", ErrBadParameter, err)
		}
		special = false
	}
	if len(text) > g.opts.MaxModelLen*promptBytesPerToken {
		return nil, badGenerate("the prompt is %d bytes, more than max_model_len %d tokens can hold", len(text), g.opts.MaxModelLen)
	}
	ids, err := g.tok.EncodeIDs(text, special)
	if err != nil {
		return nil, fmt.Errorf("%w: the prompt: %w", ErrBadParameter, err)
	}
	if len(ids) == 0 {
		return nil, badGenerate("the prompt is empty; want at least one token")
	}
	return ids, nil
}

// release gives a generation's place back.
func (g *generator) release() {
	if g.live.Add(-1) == 0 {
		select {
		case g.idle <- struct{}{}:
		default:
		}
	}
}

// Generations counts the model's generations: running, waiting, or being
// admitted (0 for a model that is not a language model).
func (m *Model) Generations() int {
	if m.gen == nil {
		return 0
	}
	return int(m.gen.live.Load())
}

// drain waits until no generation is open, or ctx ends.
func (g *generator) drain(ctx context.Context) error {
	g.retired.Store(true)
	for g.live.Load() > 0 {
		select {
		case <-g.idle:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// close stops the loop (the generations still running end with an
// error) and frees the weights and the KV cache.
func (g *generator) close() error {
	g.stop()
	<-g.done
	return g.dec.Close()
}

// warmup runs one token through the model, so that the first request
// does not pay for what a first step costs.
func (g *generator) warmup(ctx context.Context) error {
	st, err := g.loop.Generate(ctx, generation.Request{Prompt: []int32{0}, MaxTokens: 1, Sampling: generation.Sampling{Logprobs: -1}})
	if err != nil {
		return err
	}
	for {
		ev, ok := st.Next(ctx)
		if ev.Err != nil {
			return fmt.Errorf("warm-up generation: %s", clip.Clip(ev.Err.Error(), 500))
		}
		if !ok || ev.Last() {
			return nil
		}
	}
}
