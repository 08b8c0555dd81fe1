package cpufallback

import (
	"context"
	"fmt"
	"math"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/models"
)

// A decoder step on the CPU engine follows the device's structure: the
// weights (packed for the product kernels, once) and the paged KV cache
// (allocated once, Blocks x BlockSize tokens) are resident; a step takes
// the scheduler's work (token ids, positions, block tables: what the
// device's one H2D carries), writes every new token's keys and values
// into the cache by slot, attends over the cache, and samples each
// sequence's next token in the step: only the sampled tokens (and
// log-probabilities when asked) come out. Buffers are sized at load for
// max_batch_tokens tokens and max_num_seqs sampled rows, so that a step
// allocates nothing.

// maxTopLogprobs bounds Sampling.Logprobs (OpenAI's top_logprobs: 20).
const maxTopLogprobs = 20

// LoadDecoder implements [engine.DecoderEngine].
func (Engine) LoadDecoder(ctx context.Context, m *models.Model) (engine.Decoder, error) {
	if kernelsErr != nil {
		return nil, kernelsErr
	}
	if err := checkDtype(m.Name, m.Config); err != nil {
		return nil, err
	}
	if m.Decoder == nil || m.Config.Generation == nil {
		return nil, fmt.Errorf("cpufallback: model %s is not a decoder language model", m.Name)
	}
	if m.Config.Instances.PerDevice > 1 || m.Config.Instances.MinReady > 1 {
		return nil, fmt.Errorf("cpufallback: model %s: a decoder model runs as one replica on the CPU engine (it takes every core a step can use); remove instances", m.Name)
	}
	return newDecoderPlan(m), nil
}

// ReleaseWeights implements [engine.WeightReleaser]: the products'
// weights are packed in the plan, so the model's float32 copies of them go
// (and the embedding table too where Q8_0 rows replace it); the norms,
// biases and a float32 embedding table the plan reads stay.
func (p *decoderPlan) ReleaseWeights(m *models.Model) {
	d := m.Decoder
	if p.embedQ8 != nil {
		p.embed = nil
	}
	kept := map[*float32]bool{}
	keep := func(s []float32) {
		if len(s) > 0 {
			kept[&s[0]] = true
		}
	}
	keep(p.embed)
	keep(p.norm)
	for _, l := range p.layers {
		for _, s := range [][]float32{l.inNorm, l.postNorm, l.qb, l.kb, l.vb, l.ob} {
			keep(s)
		}
	}
	for i := range d.Layers {
		l := &d.Layers[i]
		for _, lin := range []*models.Linear{&l.Q, &l.K, &l.V, &l.O, &l.Gate, &l.Up, &l.Down} {
			lin.Weight = nil
		}
	}
	d.Head.Weight = nil
	if p.embed == nil {
		d.Embed = nil
	}
	for _, t := range m.Weights.Tensors {
		if len(t.Data) > 0 && !kept[&t.Data[0]] {
			t.Data = nil
		}
	}
}

type decoderLayer struct {
	inNorm, postNorm []float32
	q, k, v, o       *weight
	qb, kb, vb, ob   []float32
	gate, up, down   *weight
}

// decoderPlan is a decoder model resident on the CPU engine.
type decoderPlan struct {
	cfg         *models.DecoderConfig
	eps         float32
	embed, norm []float32
	// embedQ8, for Q8_0 and Q4_0 weights, replaces embed: the table in
	// Q8_0 (the head's own weight when tied), rows dequantized as tokens
	// look them up, as llama.cpp reads a Q8_0 token_embd.
	embedQ8 *quantWeight
	head    *weight
	layers  []decoderLayer
	geo     generation.Geometry // the KV cache's blocks, and their slots
	kvWidth int
	// kv is the KV cache: block b, layer l, keys (0) or values (1), the
	// block's token t: kv[((b*layers+l)*2+kind)*BlockSize*kvWidth + t*kvWidth:]
	// (cacheRow). It has no trash block: a step has no padding.
	kv       []float32
	cos, sin []float32 // [maxModelLen][headDim/2] RoPE's tables

	// The step's buffers, for up to maxTokens tokens.
	maxTokens              int
	x, xn, q, k, v, att, o []float32
	gate, up               []float32
	pos, slot              []int32
	// The step's tokens by work: which work each token is of; the
	// tokens of decodes (drafts included) and the works of more (prompt
	// chunks), whose attention runs as products.
	tokWork        []int32
	workStart      []int // each work's first token's index in the step
	singles, multi []int32
	// Per thread, for a chunk's attention: the sequence's keys and
	// values gathered from the cache, and the chunk's scores.
	keys, values, scores [][]float32
	chunkAttn            chunkAttn
	// Per chunk of the decodes' attention: a group's scores.
	decScores  [][]float32
	rows       []int // the token row of each sampled place: a work's last token, or each of a drafted work's
	hs, logits []float32
	out        []generation.Sampled                    // by work
	next       []generation.Sampled                    // by row: a drafted work's Sampled.Next
	top        [][maxTopLogprobs]generation.TopLogprob // by row
	sampler    generation.Sampler
	attn       attnStep
	macs       int // a token's multiply-adds in the products
}

// crewTokens is the most tokens a step holds a crew for.
const crewTokens = 4

func newDecoderPlan(m *models.Model) *decoderPlan {
	d, c, g := m.Decoder, m.Decoder.Config, m.Config.Generation
	f := weightFormat(m.Config)
	res := func(l *models.Linear) *weight { return resident(l, f) }
	// The output head (and the embeddings) stay 8-bit under Q4_0, as
	// llama.cpp's Q4_0 files keep theirs in 6 or 8 bits: a token's
	// logits are read off it directly.
	hf := f
	if f == formatQ4 {
		hf = formatQ8
	}
	p := &decoderPlan{cfg: c, eps: float32(c.RMSNormEps), embed: d.Embed, norm: d.Norm, head: resident(d.Head, hf),
		geo:     generation.Geometry{Blocks: g.KVCacheBlocks, BlockSize: g.BlockSize, MaxModelLen: g.MaxModelLen},
		kvWidth: c.KVHeads * c.HeadDim, maxTokens: g.MaxBatchTokens}
	for i := range d.Layers {
		l := &d.Layers[i]
		p.layers = append(p.layers, decoderLayer{inNorm: l.InputNorm, postNorm: l.PostNorm,
			q: res(&l.Q), k: res(&l.K), v: res(&l.V), o: res(&l.O), qb: l.Q.Bias, kb: l.K.Bias, vb: l.V.Bias, ob: l.O.Bias,
			gate: res(&l.Gate), up: res(&l.Up), down: res(&l.Down)})
	}
	if f == formatQ8 || f == formatQ4 {
		p.embedQ8 = p.head.q8
		if len(d.Head.Weight) == 0 || len(d.Embed) == 0 || &d.Head.Weight[0] != &d.Embed[0] {
			p.embedQ8 = newQ8Weight(c.Vocab, c.Hidden, d.Embed)
		}
	}
	p.kv = make([]float32, p.geo.Slots()*c.Layers*2*p.kvWidth)
	half := c.HeadDim / 2
	p.cos, p.sin = make([]float32, g.MaxModelLen*half), make([]float32, g.MaxModelLen*half)
	inv := c.InvFreq()
	for pos := range g.MaxModelLen {
		for i, f := range inv {
			s, co := math.Sincos(float64(pos) * f)
			p.cos[pos*half+i], p.sin[pos*half+i] = float32(co), float32(s)
		}
	}
	T, H, Q, I := p.maxTokens, c.Hidden, c.Heads*c.HeadDim, c.Intermediate
	p.x, p.xn, p.o = make([]float32, T*H), make([]float32, T*H), make([]float32, T*H)
	p.q, p.att = make([]float32, T*Q), make([]float32, T*Q)
	p.k, p.v = make([]float32, T*p.kvWidth), make([]float32, T*p.kvWidth)
	p.gate, p.up = make([]float32, T*I), make([]float32, T*I)
	p.pos, p.slot, p.tokWork = make([]int32, T), make([]int32, T), make([]int32, T)
	p.singles, p.multi = make([]int32, 0, T), make([]int32, 0, T)
	for range stepThreads() {
		p.keys = append(p.keys, make([]float32, g.MaxModelLen*c.HeadDim))
		p.values = append(p.values, make([]float32, g.MaxModelLen*c.HeadDim))
		p.scores = append(p.scores, make([]float32, T*g.MaxModelLen))
	}
	p.chunkAttn.p = p
	p.macs = p.head.in * p.head.out
	for _, l := range p.layers {
		for _, w := range []*weight{l.q, l.k, l.v, l.o, l.gate, l.up, l.down} {
			p.macs += w.in * w.out
		}
	}
	for range 4 * stepThreads() {
		p.decScores = append(p.decScores, make([]float32, (c.Heads/c.KVHeads)*g.MaxModelLen))
	}
	p.sampler = generation.NewSampler(c.Vocab)
	// The sampled rows: a sequence's one, or its draft's too (sized now:
	// a step never allocates them mid-serving).
	rows := g.MaxNumSeqs
	if sp := g.Speculative; sp != nil {
		rows = min(g.MaxBatchTokens, g.MaxNumSeqs*(1+sp.NumSpeculativeTokens))
	}
	p.growRows(g.MaxNumSeqs, rows)
	p.attn.p = p
	return p
}

// growRows sizes the step's results for works works and the sampled
// rows' buffers for n rows.
func (p *decoderPlan) growRows(works, n int) {
	if len(p.out) < works {
		p.out = make([]generation.Sampled, works)
	}
	if len(p.rows) >= n {
		return
	}
	p.rows = make([]int, n)
	p.hs = make([]float32, n*p.cfg.Hidden)
	p.logits = make([]float32, n*p.cfg.Vocab)
	p.next = make([]generation.Sampled, n)
	p.top = make([][maxTopLogprobs]generation.TopLogprob, n)
}

// VerifiesDrafts implements [generation.Drafter]: a drafted work's
// tokens sample at every place, as a one-token decode's does.
func (p *decoderPlan) VerifiesDrafts() bool { return true }

// Close implements [engine.Decoder]: the cache and weights go with the
// plan.
func (p *decoderPlan) Close() error {
	p.kv, p.layers = nil, nil
	return nil
}

// Step implements [generation.Model].
func (p *decoderPlan) Step(ctx context.Context, step *generation.Step) ([]generation.Sampled, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.kv == nil {
		return nil, fmt.Errorf("cpufallback: the decoder was closed: %w", engine.ErrUnavailable)
	}
	c := p.cfg
	H := c.Hidden
	T := step.Tokens()
	if T > p.maxTokens {
		return nil, fmt.Errorf("cpufallback: a step of %d tokens is over the %d the decoder was loaded for (generation.max_batch_tokens)", T, p.maxTokens)
	}
	sampledRows := 0
	for _, w := range step.Work {
		if w.Samples() {
			sampledRows += 1 + len(w.Draft)
		}
	}
	p.growRows(len(step.Work), sampledRows)
	// The step's input: each token's id (embedded here), position and
	// cache slot; the rows that sample: a work's last token, or every
	// token of a drafted one.
	t, rows := 0, 0
	p.singles, p.multi = p.singles[:0], p.multi[:0]
	p.workStart = p.workStart[:0]
	for wi, w := range step.Work {
		p.workStart = append(p.workStart, t)
		table := w.Seq.BlockTable()
		// A decode's tokens, its draft's included, each attend as a
		// decode does (over the cache, read in place); a prompt chunk's
		// as products.
		single := w.End-w.Start == 1 || len(w.Draft) > 0
		if !single {
			p.multi = append(p.multi, int32(wi))
		}
		for pos := w.Start; pos < w.End; pos++ {
			if single {
				p.singles = append(p.singles, int32(t))
			}
			p.tokWork[t] = int32(wi)
			id := w.Token(pos)
			if id < 0 || int(id) >= c.Vocab {
				return nil, fmt.Errorf("cpufallback: token id %d is outside the vocabulary (0..%d)", id, c.Vocab-1)
			}
			if p.embedQ8 != nil {
				p.embedQ8.dequantizeRow(int(id), p.x[t*H:(t+1)*H])
			} else {
				copy(p.x[t*H:(t+1)*H], p.embed[int(id)*H:(int(id)+1)*H])
			}
			p.pos[t] = int32(pos)
			p.slot[t] = p.geo.Slot(table, pos)
			t++
		}
		if w.Samples() {
			for r := t - 1 - len(w.Draft); r < t; r++ {
				p.rows[rows] = r
				rows++
			}
		}
	}
	// A step of a few tokens holds a crew (spinning threads) for its
	// products: a decode step's 150 products are 50-200 microseconds each,
	// and a goroutine hand-off per product cost a tenth of the step. Its
	// attention, a few heads, then runs on this thread; a larger step's
	// many heads split on the team.
	threads := stepThreads()
	var cr *crew
	if T <= crewTokens {
		cr, threads = beginCrewFor(threads, T*p.macs)
		defer cr.end()
	}
	for l := range p.layers {
		p.layer(l, T, step, threads, cr)
	}
	// The sampled rows' final norm and logits: only they go through the
	// output projection.
	for r := range rows {
		rmsNorm(p.hs[r*H:(r+1)*H], p.x[p.rows[r]*H:(p.rows[r]+1)*H], p.norm, p.eps)
	}
	if rows > 0 {
		linearPar(cr, threads, rows, p.hs, p.head, p.logits, nil, actNone)
	}
	r := 0
	for i, w := range step.Work {
		if !w.Samples() {
			p.out[i] = generation.Sampled{}
			continue
		}
		logits := p.logits[r*c.Vocab : (r+1)*c.Vocab]
		if pen := &w.Seq.Sampling.Penalties; pen.Active() {
			p.sampler.Penalize(logits, pen, w.Seq.Prompt, w.Seq.Output)
		}
		// Each place draws at its own position: a draft's place as plain
		// decoding would, once the tokens before it are the sequence's.
		at := w.Seq.Len()
		p.out[i] = p.sampler.Sample(logits, w.Seq.Mask(), w.Seq.Sampling, at, p.top[r][:0])
		r++
		if len(w.Draft) > 0 {
			next := p.next[r : r+len(w.Draft)]
			for j := range next {
				next[j] = p.sampler.Sample(p.logits[r*c.Vocab:(r+1)*c.Vocab], nil, w.Seq.Sampling, at+1+j, p.top[r][:0])
				r++
			}
			p.out[i].Next = next
		}
	}
	for i, w := range step.Work {
		if from, to := w.Scores(); from < to {
			p.out[i].Prompt = p.scorePrompt(cr, threads, w, p.workStart[i], from, to)
		}
	}
	return p.out[:len(step.Work)], nil
}

// scorePrompt scores w's prompt tokens at positions [from, to) from the
// hidden states of the tokens before them (w's tokens start at step
// index t0): their final norm and logits in batches of the sampled
// rows' buffers, each token's log-probability and most likely tokens.
func (p *decoderPlan) scorePrompt(cr *crew, threads int, w generation.Work, t0, from, to int) []generation.PromptLogprob {
	c := p.cfg
	H, V := c.Hidden, c.Vocab
	_, top := w.Seq.ScoresPrompt()
	out := make([]generation.PromptLogprob, 0, to-from)
	batch := len(p.logits) / V
	for at := from; at < to; at += batch {
		n := min(batch, to-at)
		for r := range n {
			t := t0 + (at + r - 1 - w.Start) // the token before the scored one
			rmsNorm(p.hs[r*H:(r+1)*H], p.x[t*H:(t+1)*H], p.norm, p.eps)
		}
		linearPar(cr, threads, n, p.hs, p.head, p.logits, nil, actNone)
		for r := range n {
			s := generation.Score(p.logits[r*V:(r+1)*V], w.Seq.Token(at+r), top, make([]generation.TopLogprob, 0, top))
			out = append(out, s)
		}
	}
	return out
}

// layer runs transformer block l on the step's T tokens in p.x.
func (p *decoderPlan) layer(l, T int, step *generation.Step, threads int, cr *crew) {
	c, L := p.cfg, &p.layers[l]
	H, Q, KV, I := c.Hidden, c.Heads*c.HeadDim, p.kvWidth, c.Intermediate
	for t := range T {
		rmsNorm(p.xn[t*H:(t+1)*H], p.x[t*H:(t+1)*H], L.inNorm, p.eps)
	}
	linearParN(cr, threads, T, p.xn, 3, [3]*weight{L.q, L.k, L.v}, [3][]float32{p.q, p.k, p.v}, [3][]float32{L.qb, L.kb, L.vb}, actNone)
	// RoPE, then the new keys and values into the cache by slot.
	half := c.HeadDim / 2
	for t := range T {
		cos := p.cos[int(p.pos[t])*half : int(p.pos[t]+1)*half]
		sin := p.sin[int(p.pos[t])*half : int(p.pos[t]+1)*half]
		for h := range c.Heads {
			rope(p.q[t*Q+h*c.HeadDim:t*Q+(h+1)*c.HeadDim], cos, sin)
		}
		for h := range c.KVHeads {
			rope(p.k[t*KV+h*c.HeadDim:t*KV+(h+1)*c.HeadDim], cos, sin)
		}
		kd, vd := p.cacheRow(int(p.slot[t]), l)
		copy(kd, p.k[t*KV:(t+1)*KV])
		copy(vd, p.v[t*KV:(t+1)*KV])
	}
	// Decodes: one token each, over its sequence's cache, a key/value
	// head's group of query heads at a time.
	if items := len(p.singles) * c.KVHeads; items > 0 {
		p.attn.layer, p.attn.step = l, step
		chunks := min(items, threads*4, len(p.decScores))
		p.attn.per = (items + chunks - 1) / chunks
		attnThreads := threads
		if cr != nil {
			attnThreads = 1
		}
		parallelRun(&p.attn, (items+p.attn.per-1)/p.attn.per, attnThreads)
	}
	// Prompt chunks: a key/value head's scores for every token of the
	// chunk as one product, its softmax, and the values as another.
	if items := len(p.multi) * c.KVHeads; items > 0 {
		a := &p.chunkAttn
		a.layer, a.step, a.items = l, step, items
		a.chunks = min(items, threads, len(p.keys))
		if cr != nil {
			a.chunks = 1 // the crew's threads spin on the other CPUs
		}
		parallelRun(a, a.chunks, a.chunks)
	}
	linearPar(cr, threads, T, p.att, L.o, p.o, L.ob, actNone)
	for i, v := range p.o[:T*H] {
		p.x[i] += v
	}
	for t := range T {
		rmsNorm(p.xn[t*H:(t+1)*H], p.x[t*H:(t+1)*H], L.postNorm, p.eps)
	}
	linearParN(cr, threads, T, p.xn, 2, [3]*weight{L.gate, L.up}, [3][]float32{p.gate, p.up}, [3][]float32{}, actNone)
	siluMul(p.gate[:T*I], p.up[:T*I])
	linearPar(cr, threads, T, p.gate, L.down, p.o, nil, actNone)
	for i, v := range p.o[:T*H] {
		p.x[i] += v
	}
}

// cacheRow is the key and value rows of layer l at cache slot s.
func (p *decoderPlan) cacheRow(s, l int) (k, v []float32) {
	bs := p.geo.BlockSize
	b, off := p.geo.Locate(s)
	base := ((b*len(p.layers)+l)*2)*bs*p.kvWidth + off*p.kvWidth
	k = p.kv[base : base+p.kvWidth]
	base += bs * p.kvWidth
	return k, p.kv[base : base+p.kvWidth]
}

// rmsNorm writes x / rms(x) * w to dst (LlamaRMSNorm, in float32 with a
// float64 sum).
func rmsNorm(dst, x, w []float32, eps float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := float32(1 / math.Sqrt(ss/float64(len(x))+float64(eps)))
	for i, v := range x {
		dst[i] = w[i] * (v * inv)
	}
}

// rope rotates one head's vector by its position's angles, as
// transformers' rotate_half does: dimension i pairs with i + half.
func rope(x, cos, sin []float32) {
	half := len(cos)
	a, b := x[:half], x[half:2*half]
	for i := range half {
		x1, x2 := a[i], b[i]
		a[i] = x1*cos[i] - x2*sin[i]
		b[i] = x2*cos[i] + x1*sin[i]
	}
}

// attnStep is a layer's causal attention over the cache for the step's
// one-token works, split by (token, head) items.
type attnStep struct {
	p     *decoderPlan
	layer int
	step  *generation.Step
	per   int
}

func (a *attnStep) run(chunk int) {
	p, c := a.p, a.p.cfg
	Q, hd := c.Heads*c.HeadDim, c.HeadDim
	group := c.Heads / c.KVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))
	lo, hi := chunk*a.per, min((chunk+1)*a.per, len(p.singles)*c.KVHeads)
	for item := lo; item < hi; item++ {
		t, g := int(p.singles[item/c.KVHeads]), item%c.KVHeads
		w := a.step.Work[p.tokWork[t]]
		table := w.Seq.BlockTable()
		pos := int(p.pos[t])
		from := 0
		if c.SlidingWindow > 0 {
			from = max(0, pos-c.SlidingWindow+1)
		}
		if decodeAttention != nil && hd%8 == 0 {
			bs, kvw := p.geo.BlockSize, p.kvWidth
			decodeAttention(decodeAttn{group: group, hd: hd, from: from, to: pos + 1, kv: p.kv,
				base: a.layer*2*bs*kvw + g*hd, blockStride: len(p.layers) * 2 * bs * kvw, bs: bs, rowStride: kvw, valOff: bs * kvw,
				table: table, scale: scale, q: p.q[t*Q+g*group*hd : t*Q+(g+1)*group*hd],
				out: p.att[t*Q+g*group*hd : t*Q+(g+1)*group*hd], scores: p.decScores[chunk]})
			continue
		}
		for h := g * group; h < (g+1)*group; h++ {
			a.head(t, h, g*hd, pos, from, table, scale)
		}
	}
}

// head is one query head's attention for decode token t in Go: an online
// softmax over the sequence's cache.
func (a *attnStep) head(t, h, kvOff, pos, from int, table []int32, scale float32) {
	p, c := a.p, a.p.cfg
	Q, hd := c.Heads*c.HeadDim, c.HeadDim
	q := p.q[t*Q+h*hd : t*Q+(h+1)*hd]
	out := p.att[t*Q+h*hd : t*Q+(h+1)*hd]
	clear(out)
	// Online softmax: a running maximum, sum and weighted values.
	m, sum := float32(math.Inf(-1)), float32(0)
	for j := from; j <= pos; j++ {
		kr, vr := p.cacheRow(int(p.geo.Slot(table, j)), a.layer)
		k, v := kr[kvOff:kvOff+hd], vr[kvOff:kvOff+hd]
		score := dot32(q, k) * scale
		if score > m {
			f := exp32(m - score)
			sum *= f
			for i := range out {
				out[i] *= f
			}
			m = score
		}
		e := exp32(score - m)
		sum += e
		for i, x := range v {
			out[i] += e * x
		}
	}
	inv := 1 / sum
	for i := range out {
		out[i] *= inv
	}
}

// chunkAttn is a layer's causal attention for the step's works of more
// than one token (prompt chunks), split by (work, key/value head) items,
// each as products: the sequence's keys and values so far gathered from
// the cache, then for each query head of the group the chunk's scores
// against every key, the causal softmax, and the weighted values.
type chunkAttn struct {
	p             *decoderPlan
	layer         int
	step          *generation.Step
	items, chunks int
}

func (a *chunkAttn) run(chunk int) {
	p, c := a.p, a.p.cfg
	Q, hd := c.Heads*c.HeadDim, c.HeadDim
	group := c.Heads / c.KVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))
	keys, values, scores := p.keys[chunk], p.values[chunk], p.scores[chunk]
	per := (a.items + a.chunks - 1) / a.chunks
	for item := chunk * per; item < min((chunk+1)*per, a.items); item++ {
		wi, g := int(p.multi[item/c.KVHeads]), item%c.KVHeads
		w := a.step.Work[wi]
		// The work's first token's row in the step.
		t0 := 0
		for _, x := range a.step.Work[:wi] {
			t0 += x.End - x.Start
		}
		T, P := w.End-w.Start, w.End // its tokens, and the keys they see
		table := w.Seq.BlockTable()
		for j := range P {
			kr, vr := p.cacheRow(int(p.geo.Slot(table, j)), a.layer)
			copy(keys[j*hd:(j+1)*hd], kr[g*hd:(g+1)*hd])
			copy(values[j*hd:(j+1)*hd], vr[g*hd:(g+1)*hd])
		}
		for h := g * group; h < (g+1)*group; h++ {
			gemm(true, T, P, hd, scale, p.q[t0*Q+h*hd:], Q, keys, hd, 0, scores, P)
			for t := range T {
				row := scores[t*P : (t+1)*P]
				pos := w.Start + t
				from := 0
				if c.SlidingWindow > 0 {
					from = max(0, pos-c.SlidingWindow+1)
				}
				clear(row[:from])
				clear(row[pos+1:])
				softmaxRow(row[from : pos+1])
			}
			gemm(false, T, hd, P, 1, scores, P, values, hd, 0, p.att[t0*Q+h*hd:], Q)
		}
	}
}

// dot32 is x·y with four running sums.
func dot32(x, y []float32) float32 {
	var s0, s1, s2, s3 float32
	n := len(x)
	y = y[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		s0 += x[i] * y[i]
		s1 += x[i+1] * y[i+1]
		s2 += x[i+2] * y[i+2]
		s3 += x[i+3] * y[i+3]
	}
	for ; i < n; i++ {
		s0 += x[i] * y[i]
	}
	return (s0 + s1) + (s2 + s3)
}
