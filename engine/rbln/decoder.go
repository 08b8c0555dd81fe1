// Decoder language models on a worker: the model's weights and its paged
// KV cache resident on the device, and two kinds of compiled step per
// bucket, as the device wants them: decode (batch x 1 token) and prefill
// (batch x prompt-chunk length). A row of a step is one sequence: its
// tokens' ids, positions and cache slots, then its block table, how many
// of its tokens are real, and its sampling parameters, packed into the
// bucket's one input buffer (one host-to-device copy); the graph writes
// the tokens' keys and values into the cache by slot, attends over the
// cache through the block table, and samples each row's next token
// in-graph; the one device-to-host copy is the sampled token per row,
// with its log-probability and the most likely tokens'.

package rbln

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/models"
)

// The decoder step's row layout, in int32 words, after the row's 3*T
// token words (ids, positions, slots): the fields below, then the block
// table, then in a masked decode step the row's token mask (maskWords)
// and logit bias (samplingWords). The worker reads the same (decoder.py).
const (
	metaValid       = iota // real tokens in the row (0 for a padding row)
	metaSamples            // 1 when the row's last real token samples
	metaTemperature        // float32 bits
	metaTopP               // float32 bits
	metaTopK
	metaSeedLo
	metaSeedHi
	metaLogprobs // unused by the graph (it always computes them): kept for the host
	metaPosition // the sampled token's position: the draw's counter
	metaMasked   // 1 when the row's token mask applies (a masked step's rows without one sample freely)
	// Penalties (generation/penalty.go): the lane whose token counts the
	// row's tokens go to and its penalties read (the last, lanes, for a
	// row without them), 1 where the sequence starts from its first
	// token (its counts are zeroed first), its prompt's length (tokens
	// before it count as the prompt's), and the penalties, float32 bits.
	metaLane
	metaReset
	metaPromptLen
	metaRepetition
	metaFrequency
	metaPresence
	metaNext // a scoring prefill row's next prompt token, after its last: the last position's scored token
	metaFields
)

// maxScoringLogits bounds a scoring prefill step's logits (rows x
// tokens x vocabulary, float32): larger prefill buckets get no scoring
// twin, and a scored prompt runs in the smaller ones.
const maxScoringLogits = 1 << 28

// promptTop is how many most likely tokens a scoring prefill step
// returns at each position (decoder.py's PROMPT_TOP).
const promptTop = 5

// scoreWords is what a scoring prefill step of T tokens returns per row
// after the sampled token's: per position the next token's
// log-probability and the promptTop most likely tokens' ids and
// log-probabilities.
func scoreWords(T int) int { return T * (1 + 2*promptTop) }

// maskWords is how many int32 words a row's token mask takes in a masked
// decode step: a bit a token of the vocabulary, as
// [generation.Constraint]'s mask.
func maskWords(vocab int) int { return (vocab + 31) / 32 }

// samplingWords is what a masked decode step's row carries after its
// block table: the token mask, then the logit bias's token ids and
// values (generation.MaxLogitBias of each).
func samplingWords(vocab int) int { return maskWords(vocab) + 2*generation.MaxLogitBias }

// decoderTopLogprobs is how many most likely tokens each step returns.
const decoderTopLogprobs = 20

// decoderSpec is a decoder's load message part.
type decoderSpec struct {
	Vocab         int       `json:"vocab"`
	Hidden        int       `json:"hidden"`
	Layers        int       `json:"layers"`
	Heads         int       `json:"heads"`
	KVHeads       int       `json:"kv_heads"`
	HeadDim       int       `json:"head_dim"`
	Intermediate  int       `json:"intermediate"`
	RMSNormEps    float64   `json:"rms_norm_eps"`
	InvFreq       []float64 `json:"inv_freq"` // RoPE's, rope_scaling applied
	QKVBias       bool      `json:"qkv_bias"`
	OBias         bool      `json:"o_bias"`
	Tied          bool      `json:"tied"`
	SlidingWindow int       `json:"sliding_window"`
	Blocks        int       `json:"blocks"` // the cache's, and one more the padding writes to
	BlockSize     int       `json:"block_size"`
	TableWidth    int       `json:"table_width"`
	TopLogprobs   int       `json:"top_logprobs"`
	Lanes         int       `json:"lanes"` // max_num_seqs: the token counts' rows (penalties)
}

// decoderStepConfig is cfg as the step's staging sees it: the tokens
// [batch, 3, T] and the rows' fields and block tables [batch, n] in, the
// sampled rows out, all int32.
func decoderStepConfig(cfg *models.Config) *models.Config {
	width := geometryOf(cfg.Generation).TableWidth()
	c := *cfg
	c.Inputs = []models.TensorSpec{
		{Name: "tokens", Datatype: models.INT32, Shape: []int{-1, 3, -1}},
		{Name: "rows", Datatype: models.INT32, Shape: []int{-1, metaFields + width}},
	}
	c.Outputs = []models.TensorSpec{{Name: "sampled", Datatype: models.INT32, Shape: []int{-1, 2 + 2*decoderTopLogprobs}}}
	return &c
}

// maskedStepConfig is the staging of step's masked bucket s (step is the
// model with decoderStepConfig's configuration): a masked decode step's
// rows carry their token mask and logit bias after the block table; a
// scoring prefill step returns every position's scores after the
// sampled row.
func maskedStepConfig(step *models.Model, s bucketing.Shape) *models.Config {
	c := *step.Config
	if s.Seq > 1 {
		c.Outputs = slices.Clone(c.Outputs)
		c.Outputs[0].Shape = []int{-1, c.Outputs[0].Shape[1] + scoreWords(s.Seq)}
		return &c
	}
	c.Inputs = slices.Clone(c.Inputs)
	rows := &c.Inputs[1]
	rows.Shape = []int{-1, rows.Shape[1] + samplingWords(step.Decoder.Config.Vocab)}
	return &c
}

// LoadDecoder implements [engine.DecoderEngine].
func (e *Engine) LoadDecoder(ctx context.Context, m *models.Model) (engine.Decoder, error) {
	cfg := m.Config
	if m.Decoder == nil || cfg.Generation == nil {
		return nil, fmt.Errorf("rbln: model %s is not a decoder language model", m.Name)
	}
	if cfg.Instances.PerDevice > 1 || len(cfg.Instances.Devices) > 1 || cfg.Instances.All {
		return nil, fmt.Errorf("rbln: model %s: a decoder model runs as one replica on one device; name one device in instances", m.Name)
	}
	workers, err := e.workersFor(m)
	if err != nil {
		return nil, err
	}
	// Decode buckets by batch and context partition, prefill ones by
	// batch and chunk length (over the whole context), for structured
	// output each decode bucket's masked twin, and for the prompt's
	// log-probabilities each prefill bucket's scoring twin.
	var decodes, prefills, masked, scoring []bucketing.Shape
	for _, b := range cfg.Buckets.Batch {
		for _, c := range cfg.Buckets.Context {
			decodes = append(decodes, bucketing.Shape{Batch: b, Seq: 1, Ctx: c})
		}
		for _, t := range cfg.Buckets.Seq {
			prefills = append(prefills, bucketing.Shape{Batch: b, Seq: t})
		}
	}
	if cfg.Generation.Structured() {
		for _, s := range decodes {
			s.Mask = true
			masked = append(masked, s)
		}
	}
	if cfg.Generation.ScoresPrompts() {
		// A scoring step holds every position's logits: the prefill
		// buckets small enough for that get a twin.
		for _, s := range prefills {
			if int64(s.Batch)*int64(s.Seq)*int64(m.Decoder.Config.Vocab) <= maxScoringLogits {
				s.Mask = true
				scoring = append(scoring, s)
			}
		}
		if len(scoring) < len(prefills) {
			workers[0].logger.Warn("decoder prefill buckets too large to score the prompt in", "model", m.Name,
				"scoring", len(scoring), "prefill", len(prefills), "most_logits", maxScoringLogits)
		}
	}
	step := *m
	step.Config = decoderStepConfig(cfg)
	p, err := newProgram(ctx, workers[0], &step, slices.Concat(decodes, prefills, masked, scoring))
	if err != nil {
		return nil, err
	}
	d := &decoder{p: p, cfg: m.Decoder.Config, gen: *cfg.Generation, geo: geometryOf(cfg.Generation),
		decodes: len(decodes), prefills: len(prefills), masked: len(masked),
		traffic: bucketing.NewContextTraffic(slices.Max(cfg.Buckets.Batch), slices.Max(cfg.Buckets.Context), cfg.Generation.BlockSize, 0),
		warmups: make([]engine.Explain, len(p.shapes))}
	for i := range p.shapes {
		if err := d.warm(ctx, i); err != nil {
			p.Close()
			return nil, err
		}
	}
	d.life = p.lives.Load()
	d.logCompiles(ctx)
	return d, nil
}

// logCompiles logs what building each bucket's program took, the first
// run's time (torch.compile is lazy: a device compile is minutes), and
// the sum: the figures stepserve_program_compile_seconds exports.
func (d *decoder) logCompiles(ctx context.Context) {
	total, built := 0.0, 0
	for _, r := range d.Programs(ctx) {
		if r.CompileSeconds == nil {
			continue
		}
		total += *r.CompileSeconds
		built++
		d.p.w.logger.Info("decoder program built", "model", d.p.model.Name, "kind", r.Kind, "bucket", r.Bucket,
			"compiler", r.Compiler, "seconds", *r.CompileSeconds)
	}
	if built > 0 {
		d.p.w.logger.Info("decoder programs built", "model", d.p.model.Name, "programs", built, "seconds", total)
	}
}

// geometryOf is the KV cache's geometry g describes.
func geometryOf(g *models.GenerationOptions) generation.Geometry {
	return generation.Geometry{Blocks: g.KVCacheBlocks, BlockSize: g.BlockSize, MaxModelLen: g.MaxModelLen}
}

// decoderSpecOf is the load message's description of m.
func decoderSpecOf(m *models.Model) *decoderSpec {
	c, g := m.Decoder.Config, geometryOf(m.Config.Generation)
	return &decoderSpec{Vocab: c.Vocab, Hidden: c.Hidden, Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim,
		Intermediate: c.Intermediate, RMSNormEps: c.RMSNormEps, InvFreq: c.InvFreq(), QKVBias: c.QKVBias, OBias: c.OBias,
		Tied: c.TiedEmbeddings, SlidingWindow: c.SlidingWindow, Blocks: g.Blocks, BlockSize: g.BlockSize,
		TableWidth: g.TableWidth(), TopLogprobs: decoderTopLogprobs, Lanes: m.Config.Generation.MaxNumSeqs}
}

// decoder is a decoder model on one worker.
type decoder struct {
	p   *program
	cfg *models.DecoderConfig
	gen models.GenerationOptions
	geo generation.Geometry // the KV cache's: a row's block table is TableWidth entries
	// The buckets are decodes decode ones, then prefills prefill ones,
	// then masked masked twins of the decode ones (none without
	// structured output), then the prefill ones' scoring twins (none
	// without prompt_logprobs).
	decodes, prefills, masked int
	// life is the program's worker life the KV cache was filled in: a
	// worker that restarted lost it.
	life uint64
	// traffic records the decode steps (rows, longest context) for the
	// advisor.
	traffic *bucketing.Traffic
	// warmups are the buckets' second warm-up runs' reports.
	warmups []engine.Explain

	observe func(bucket, rows int, padding float64, took time.Duration, x engine.Explain)

	out  []generation.Sampled
	top  [][decoderTopLogprobs]generation.TopLogprob
	rows []piece
	held []int // the works whose last token samples in a decode row after their chunk
}

// piece is a row of a device step: tokens [start, end) of a work.
type piece struct {
	w          int // the work's index in the step
	start, end int
	samples    bool
	scores     bool // it scores prompt tokens (in a scoring prefill step)
}

// ranges of the buckets by kind: [lo, hi) in d.p.shapes.
func (d *decoder) decodeRange() (int, int)  { return 0, d.decodes }
func (d *decoder) prefillRange() (int, int) { return d.decodes, d.decodes + d.prefills }
func (d *decoder) maskedRange() (int, int) {
	return d.decodes + d.prefills, d.decodes + d.prefills + d.masked
}
func (d *decoder) scoringRange() (int, int) {
	return d.decodes + d.prefills + d.masked, len(d.p.shapes)
}

// scores reports whether w's tokens [start, end) score prompt tokens.
func scores(w generation.Work, start int) bool {
	scoring, _ := w.Seq.ScoresPrompt()
	return scoring && start < len(w.Seq.Prompt)-1
}

// errCacheLost ends the sequences of a step that found the worker
// restarted: their keys and values went with it.
var errCacheLost = errors.New("the worker restarted and its KV cache was lost")

// Step implements [generation.Model]: the step's work as device steps,
// decodes in a decode bucket and prompt chunks in prefill buckets, rows
// of a work longer than the largest bucket split over several steps. A
// constrained sequence samples in a masked decode bucket: a prompt chunk
// of one runs without its last token, which then runs as a decode row
// after the chunk, so that no prefill bucket needs a masked twin.
func (d *decoder) Step(ctx context.Context, step *generation.Step) ([]generation.Sampled, error) {
	if life := d.p.lives.Load(); life != d.life {
		d.life = life
		return nil, fmt.Errorf("rbln: model %s: %w: %w", d.p.model.Name, engine.ErrUnavailable, errCacheLost)
	}
	d.held = d.held[:0]
	for i, w := range step.Work {
		if lo, hi := d.scoringRange(); lo == hi && scores(w, w.Start) {
			return nil, fmt.Errorf("rbln: model %s: a sequence asks its prompt's log-probabilities, and generation.prompt_logprobs is false: no scoring prefill step was compiled", d.p.model.Name)
		}
		if !masked(w) {
			continue
		}
		if lo, hi := d.maskedRange(); lo == hi {
			return nil, fmt.Errorf("rbln: model %s: a constrained or penalized sequence (structured output, penalties, logit bias), and generation.structured_output is false: no masked decode step was compiled", d.p.model.Name)
		}
		if w.End-w.Start > 1 {
			d.held = append(d.held, i)
		}
	}
	n := len(step.Work)
	if len(d.out) < n {
		d.out = make([]generation.Sampled, n)
		d.top = make([][decoderTopLogprobs]generation.TopLogprob, n)
	}
	clear(d.out[:n])
	most := 1
	lo, hi := d.prefillRange()
	for _, s := range d.p.shapes[lo:hi] {
		most = max(most, s.Seq)
	}
	// Round r runs every work's r-th piece of at most most tokens.
	for r := 0; ; r++ {
		d.rows = d.rows[:0]
		for i, w := range step.Work {
			last := w.End
			if w.End-w.Start > 1 && masked(w) {
				last-- // held for a masked decode row below
			}
			start := w.Start + r*most
			if start >= last {
				continue
			}
			end := min(start+most, last)
			d.rows = append(d.rows, piece{w: i, start: start, end: end, samples: end == w.End && w.Samples(), scores: scores(w, start)})
		}
		if len(d.rows) == 0 {
			break
		}
		if err := d.runRows(ctx, step); err != nil {
			return nil, err
		}
	}
	if len(d.held) > 0 {
		d.rows = d.rows[:0]
		for _, i := range d.held {
			end := step.Work[i].End
			d.rows = append(d.rows, piece{w: i, start: end - 1, end: end, samples: true})
		}
		if err := d.runRows(ctx, step); err != nil {
			return nil, err
		}
	}
	if life := d.p.lives.Load(); life != d.life {
		d.life = life
		return nil, fmt.Errorf("rbln: model %s: %w: %w", d.p.model.Name, engine.ErrUnavailable, errCacheLost)
	}
	return d.out[:n], nil
}

// masked reports whether w samples under a token mask or penalties: in
// a masked decode bucket.
func masked(w generation.Work) bool {
	return w.Samples() && (w.Seq.Mask() != nil || w.Seq.Sampling.Penalties.Active())
}

// twinRow reports whether decode row pc of w runs in a masked twin: it
// samples under a mask, or its sequence is penalized (its tokens are
// counted, and its counts reset, only by the twins and prefill steps).
func twinRow(w generation.Work, pc piece) bool {
	return pc.samples && masked(w) || w.Seq.Sampling.Penalties.Active()
}

// Penalizes reports whether the decoder has masked decode steps, where
// penalties and logit bias are applied: a sequence may ask for them.
func (d *decoder) Penalizes() bool { return d.masked > 0 }

// ScoresPrompts reports whether the decoder has scoring prefill steps:
// a sequence may ask its prompt's log-probabilities.
func (d *decoder) ScoresPrompts() bool { lo, hi := d.scoringRange(); return lo < hi }

// CountsTokens implements [generation.WholePrompter]: a penalized
// sequence's tokens are counted on the worker as its steps compute them.
func (d *decoder) CountsTokens() bool { return true }

// decodeRow reports whether pc runs in a decode bucket: one token, and
// no prompt token to score (which only a prefill step's scoring twin
// returns).
func decodeRow(pc piece) bool { return pc.end-pc.start == 1 && !pc.scores }

// runRows runs d.rows in as few device steps as their buckets allow:
// decodes first, shortest context first, then prompt chunks (rows sorted
// in place, no slice made per step).
func (d *decoder) runRows(ctx context.Context, step *generation.Step) error {
	kind := func(pc piece) int {
		if decodeRow(pc) {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(d.rows, func(a, b piece) int {
		if c := cmp.Compare(kind(a), kind(b)); c != 0 || kind(a) == 1 {
			return c
		}
		return cmp.Compare(a.end, b.end)
	})
	split := 0
	for split < len(d.rows) && decodeRow(d.rows[split]) {
		split++
	}
	for _, group := range [2][]piece{d.rows[:split], d.rows[split:]} {
		for len(group) > 0 {
			bucket, taken, err := d.bucket(step, group)
			if err != nil {
				return err
			}
			if _, err := d.run(ctx, step, bucket, group[:taken]); err != nil {
				return err
			}
			group = group[taken:]
		}
	}
	return nil
}

// mostRows is the largest batch of the buckets [lo, hi) whose rows hold
// tokens tokens; 0 for none.
func (d *decoder) mostRows(lo, hi, tokens int) int {
	most := 0
	for _, s := range d.p.shapes[lo:hi] {
		if s.Seq >= tokens {
			most = max(most, s.Batch)
		}
	}
	return most
}

// bucket chooses the bucket for the first rows of group: the decode or
// prefill bucket of the fewest rows and tokens that hold them, or the
// largest, taking as many rows as it holds. Decode rows come sorted by
// their context, shortest first: the bucket is the least context
// partition that holds the longest of the rows it takes, so that a short
// conversation reads a few hundred key positions, not max_model_len's.
// Decode rows of which one samples under a mask take the masked twin.
func (d *decoder) bucket(step *generation.Step, group []piece) (bucket, taken int, err error) {
	tokens := 0
	for _, pc := range group {
		tokens = max(tokens, pc.end-pc.start)
	}
	decode := decodeRow(group[0]) // runRows groups rows by kind
	lo, hi := d.decodeRange()
	if !decode {
		lo, hi = d.prefillRange()
	}
	most := d.mostRows(lo, hi, tokens)
	if most == 0 {
		return 0, 0, fmt.Errorf("rbln: model %s: no bucket holds a row of %d tokens", d.p.model.Name, tokens)
	}
	taken = min(len(group), most)
	switch {
	case decode && slices.ContainsFunc(group[:taken], func(pc piece) bool { return twinRow(step.Work[pc.w], pc) }):
		lo, hi = d.maskedRange() // every decode bucket has its twin there
	case !decode && slices.ContainsFunc(group[:taken], func(pc piece) bool { return pc.scores }):
		// The prefill buckets' scoring twins, as many as fit (maxScoringLogits).
		lo, hi = d.scoringRange()
		if most = d.mostRows(lo, hi, tokens); most == 0 {
			return 0, 0, fmt.Errorf("rbln: model %s: no scoring prefill bucket holds a row of %d tokens", d.p.model.Name, tokens)
		}
		taken = min(len(group), most)
	}
	ctx := 0 // the least partition that holds the rows taken
	if decode {
		need, read := 0, 0
		for _, pc := range group[:taken] {
			need = max(need, pc.end)
			read += pc.end
		}
		for _, s := range d.p.shapes[lo:hi] {
			if s.Ctx >= need && (ctx == 0 || s.Ctx < ctx) {
				ctx = s.Ctx
			}
		}
		if ctx == 0 {
			return 0, 0, fmt.Errorf("rbln: model %s: no context partition holds a sequence of %d tokens", d.p.model.Name, need)
		}
		// For the advisor: the step's rows and the key positions they
		// need, of the ones its partition reads.
		d.traffic.Record(taken, need, read, time.Now())
	}
	best, bestCost := -1, 0
	for i := lo; i < hi; i++ {
		s := d.p.shapes[i]
		if s.Seq < tokens || s.Ctx != ctx || s.Batch < taken {
			continue
		}
		if best < 0 || s.Batch*s.Seq < bestCost {
			best, bestCost = i, s.Batch*s.Seq
		}
	}
	if best < 0 {
		return 0, 0, fmt.Errorf("rbln: model %s: no bucket of context %d holds %d rows of %d tokens", d.p.model.Name, ctx, taken, tokens)
	}
	return best, taken, nil
}

// run packs rows into bucket's staging, steps it, and reads the sampled
// rows back; it returns the step's explain report.
func (d *decoder) run(ctx context.Context, step *generation.Step, bucket int, rows []piece) (engine.Explain, error) {
	s := d.p.shapes[bucket]
	in, out := d.p.Staging(bucket)
	clear(in)
	T, width := s.Seq, d.geo.TableWidth()
	trashSlot := d.geo.TrashSlot() // where a padding token writes
	tokens := in[:s.Batch*3*T*4]
	meta := in[s.Batch*3*T*4:]
	rowWords, words := metaFields+width, 0
	sampling := s.Mask && s.Seq == 1 // a masked decode step: its rows carry the sampling words
	if sampling {
		words = maskWords(d.cfg.Vocab)
		rowWords += samplingWords(d.cfg.Vocab)
	}
	lanes := int32(d.gen.MaxNumSeqs) // the last lane: rows without penalties
	put := func(b []byte, i int, v int32) { binary.LittleEndian.PutUint32(b[4*i:], uint32(v)) }
	for r := range s.Batch {
		base := r * 3 * T
		mb := r * rowWords
		if r >= len(rows) {
			// A padding row: no real token; its writes go to the trash block.
			for t := range T {
				put(tokens, base+2*T+t, trashSlot)
			}
			for j := range width {
				put(meta, mb+metaFields+j, d.geo.Trash())
			}
			put(meta, mb+metaLane, lanes)
			continue
		}
		pc := rows[r]
		w := step.Work[pc.w]
		table := w.Seq.BlockTable()
		for t := range T {
			pos := pc.start + t
			if pos >= pc.end {
				put(tokens, base+2*T+t, trashSlot)
				continue
			}
			put(tokens, base+t, w.Seq.Token(pos))
			put(tokens, base+T+t, int32(pos))
			put(tokens, base+2*T+t, d.geo.Slot(table, pos))
		}
		sp := w.Seq.Sampling
		put(meta, mb+metaValid, int32(pc.end-pc.start))
		if pc.samples {
			put(meta, mb+metaSamples, 1)
		}
		put(meta, mb+metaTemperature, int32(math.Float32bits(sp.Temperature)))
		put(meta, mb+metaTopP, int32(math.Float32bits(sp.TopP)))
		put(meta, mb+metaTopK, int32(min(sp.TopK, math.MaxInt32)))
		put(meta, mb+metaSeedLo, int32(uint32(sp.Seed)))
		put(meta, mb+metaSeedHi, int32(uint32(sp.Seed>>32)))
		put(meta, mb+metaLogprobs, int32(sp.Logprobs))
		put(meta, mb+metaPosition, int32(pc.end))
		for j := range width {
			put(meta, mb+metaFields+j, d.geo.TableEntry(table, j))
		}
		if mask := w.Seq.Mask(); sampling && pc.samples && mask != nil {
			put(meta, mb+metaMasked, 1)
			for j, v := range mask[:min(len(mask), words)] { // tokens past the mask's are not allowed
				put(meta, mb+metaFields+width+j, int32(v))
			}
		}
		if pc.scores && pc.end < len(w.Seq.Prompt) {
			put(meta, mb+metaNext, w.Seq.Token(pc.end))
		}
		put(meta, mb+metaLane, lanes)
		put(meta, mb+metaRepetition, int32(math.Float32bits(1)))
		if pen := &sp.Penalties; pen.Active() {
			if pc.start == 0 {
				put(meta, mb+metaReset, 1)
			}
			put(meta, mb+metaLane, int32(w.Seq.Lane()))
			put(meta, mb+metaPromptLen, int32(len(w.Seq.Prompt)))
			put(meta, mb+metaRepetition, int32(math.Float32bits(pen.RepetitionOrOne())))
			put(meta, mb+metaFrequency, int32(math.Float32bits(pen.Frequency)))
			put(meta, mb+metaPresence, int32(math.Float32bits(pen.Presence)))
			if sampling && pc.samples {
				at := mb + metaFields + width + words
				for j, b := range pen.Bias[:min(len(pen.Bias), generation.MaxLogitBias)] {
					put(meta, at+j, b.Token)
					put(meta, at+generation.MaxLogitBias+j, int32(math.Float32bits(b.Bias)))
				}
			}
		}
	}
	began := time.Now()
	x, err := d.p.Step(ctx, bucket)
	if err != nil {
		return x, err
	}
	if d.observe != nil && len(rows) > 0 {
		real := 0
		for _, pc := range rows {
			real += pc.end - pc.start
		}
		d.observe(bucket, len(rows), 1-float64(real)/float64(s.Batch*s.Seq), time.Since(began), x)
	}
	outWords := 2 + 2*decoderTopLogprobs
	if s.Mask && s.Seq > 1 {
		outWords += scoreWords(s.Seq)
	}
	get := func(i int) int32 { return int32(binary.LittleEndian.Uint32(out[4*i:])) }
	for r, pc := range rows {
		if pc.scores && s.Mask && s.Seq > 1 {
			d.readScores(step.Work[pc.w], pc, get, r*outWords+2+2*decoderTopLogprobs)
		}
		if !pc.samples {
			continue
		}
		base := r * outWords
		tok := get(base)
		if tok < 0 || int(tok) >= d.cfg.Vocab {
			return x, fmt.Errorf("rbln: model %s: the step sampled token %d, outside the vocabulary", d.p.model.Name, tok)
		}
		sp := step.Work[pc.w].Seq.Sampling
		o := generation.Sampled{Token: tok, Logprob: math.Float32frombits(uint32(get(base + 1)))}
		if k := min(sp.Logprobs, decoderTopLogprobs); k > 0 {
			top := d.top[pc.w][:0]
			for j := range k {
				top = append(top, generation.TopLogprob{Token: get(base + 2 + j), Logprob: math.Float32frombits(uint32(get(base + 2 + decoderTopLogprobs + j)))})
			}
			o.Top = top
		}
		o.Prompt = d.out[pc.w].Prompt // what its pieces scored
		d.out[pc.w] = o
	}
	return x, nil
}

// readScores appends to w's result the prompt tokens pc scored, read
// from its row's scores at base: position t's logits score the token at
// start+t+1 while it is a prompt token.
func (d *decoder) readScores(w generation.Work, pc piece, get func(int) int32, base int) {
	_, top := w.Seq.ScoresPrompt()
	top = min(top, promptTop)
	o := &d.out[pc.w]
	per := 1 + 2*promptTop
	for t := range pc.end - pc.start {
		p := pc.start + t + 1
		if p >= len(w.Seq.Prompt) {
			break
		}
		at := base + t*per
		s := generation.PromptLogprob{Token: w.Seq.Token(p), Logprob: math.Float32frombits(uint32(get(at)))}
		for j := range top {
			s.Top = append(s.Top, generation.TopLogprob{Token: get(at + 1 + j), Logprob: math.Float32frombits(uint32(get(at + 1 + promptTop + j)))})
		}
		o.Prompt = append(o.Prompt, s)
	}
}

// warm compiles bucket and runs it twice on padding rows (no real token:
// every write goes to the trash block), so that no client's step builds a
// graph; the second run's report is kept for Warmups.
func (d *decoder) warm(ctx context.Context, bucket int) error {
	if err := d.p.Compile(ctx, bucket); err != nil {
		return err
	}
	for range 2 {
		x, err := d.run(ctx, &generation.Step{}, bucket, nil)
		if err != nil {
			return fmt.Errorf("rbln: model %s: warming bucket %s up: %w", d.p.model.Name, d.p.shapes[bucket].Label(), err)
		}
		d.warmups[bucket] = x
	}
	return nil
}

// Warmups implements [engine.StepObserver].
func (d *decoder) Warmups() []engine.Explain { return d.warmups }

// kind is bucket's kind: decode or prefill.
func (d *decoder) kind(bucket int) string {
	if d.p.shapes[bucket].Seq > 1 {
		return "prefill"
	}
	return "decode"
}

// AdviseContexts implements [engine.ContextAdvisor].
// The decode programs it counts include the masked twins: a decode
// bucket is two programs where the model serves structured output.
func (d *decoder) AdviseContexts(maxBuckets int) (bucketing.Advice, error) {
	b := d.p.model.Config.Buckets
	twins := 1
	if d.masked > 0 {
		twins = 2
	}
	if maxBuckets <= 0 {
		maxBuckets = len(b.Batch) * len(b.Context) * twins
	}
	a, err := bucketing.AdviseContexts(d.traffic.Snapshot(), b.Batch, b.Context, d.gen.BlockSize, max(maxBuckets/twins, 1))
	a.Programs *= twins
	a.CurrentPrograms *= twins
	return a, err
}

// Shapes implements [engine.StepObserver]: the decode buckets, the
// prefill ones, then the masked decode ones.
func (d *decoder) Shapes() []bucketing.Shape { return d.p.shapes }

// ObserveSteps implements [engine.StepObserver]. Set it before the first
// step.
func (d *decoder) ObserveSteps(f func(bucket, rows int, padding float64, took time.Duration, x engine.Explain)) {
	d.observe = f
}

// Close implements [engine.Decoder].
func (d *decoder) Close() error { return d.p.Close() }

// Programs implements [engine.ProgramReporter]: the program's reports,
// the decode buckets (masked or not) and the prefill ones named so.
func (d *decoder) Programs(ctx context.Context) []engine.ProgramReport {
	out := d.p.Programs(ctx)
	for i := range out {
		out[i].Kind = d.kind(i % len(d.p.shapes))
	}
	return out
}
