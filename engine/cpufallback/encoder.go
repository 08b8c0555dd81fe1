package cpufallback

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
)

// maskedScore is added to the attention score of a padded key: large enough
// that its softmax weight is exactly zero in float32, finite so that a row
// with every key padded (a padding row of the batch) stays free of NaN.
const maskedScore = -1e9

// encoderPlan is one (batch, seq) bucket's compiled encoder: resident
// weights and every buffer a step writes, allocated once.
type encoderPlan struct {
	e       *models.Encoder
	w       residentWeights
	batch   int
	seq     int
	heads   int
	headDim int
	layout  engine.Layout

	ids, mask, types []int64     // the bucket's "device" input buffers, [B*S]
	maskAdd          []float32   // 0 or maskedScore per key, [B*S]
	zeros            []float32   // [S]: the key mask once padding is left out
	seqOff, seqLen   []int       // [B]: each sequence's rows in x
	compacted        bool        // whether this step left padding out
	neverCompact     bool        // tests: always compute every token
	x, q, k, v, ctx  []float32   // [B*S, H]
	tmp              []float32   // [B*S, H]
	inter            []float32   // [B*S, I]
	scores           [][]float32 // per thread: [S, S], one head at a time
	pooled           []float32   // [B, H]
	act              activation  // the feed-forward's
	headX, logits    []float32   // a classification head's: [B, H], [B, num_labels]

	// The step's split of its sequences into groups that run side by side:
	// group g is sequences groups[g] up to groups[g+1].
	groups    []int
	groupDone chan struct{}
	// threads is how many threads each group's products and attention
	// heads split among: more than one when the step has fewer groups than
	// engine.cpu_threads (a step of one sequence uses every allowed CPU).
	threads  int
	attn     []attnTask // per group
	crews    []*crew    // per group: the threads it holds while it runs (crew.go)
	gthreads []int      // per group: the threads it splits its work among

	rec *trace.Recorder // a profiled step's spans (profile.go); nil otherwise
}

func newEncoderPlan(e *models.Encoder, w residentWeights, layout engine.Layout) *encoderPlan {
	c := e.Config
	b, s := layout.Bucket.Batch, layout.Bucket.Seq
	t := b * s
	p := &encoderPlan{
		e: e, w: w, batch: b, seq: s, heads: c.Heads, headDim: c.Hidden / c.Heads, layout: layout,
		ids: make([]int64, t), mask: make([]int64, t), types: make([]int64, t),
		maskAdd: make([]float32, t), zeros: make([]float32, s),
		seqOff: make([]int, b), seqLen: make([]int, b),
		x: make([]float32, t*c.Hidden), q: make([]float32, t*c.Hidden), k: make([]float32, t*c.Hidden),
		v: make([]float32, t*c.Hidden), ctx: make([]float32, t*c.Hidden), tmp: make([]float32, t*c.Hidden),
		inter:     make([]float32, t*c.Intermediate),
		scores:    scoreBuffers(stepThreads(), s),
		attn:      make([]attnTask, min(b, stepThreads())),
		crews:     make([]*crew, min(b, stepThreads())),
		gthreads:  make([]int, min(b, stepThreads())),
		groups:    make([]int, 0, b+1),
		groupDone: make(chan struct{}, b),
		pooled:    make([]float32, b*c.Hidden),
		act:       hiddenAct(c.HiddenAct),
	}
	if e.Head != nil {
		p.headX, p.logits = make([]float32, b*c.Hidden), make([]float32, b*c.NumLabels)
	}
	return p
}

// hiddenAct is encoder.hidden_act's activation.
func hiddenAct(name string) activation {
	switch name {
	case "gelu_new", "gelu_pytorch_tanh":
		return actGELUTanh
	case "relu":
		return actReLU
	default:
		return actGELU
	}
}

func int64s(b []byte) []int64 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*int64)(unsafe.Pointer(&b[0])), len(b)/8)
}

// step copies the token tensors in once, runs the encoder, and copies the
// pooled embeddings out once. Token ids outside the vocabulary are an error
// (models.PrepareInputs refuses them; this keeps a bad caller from reading
// past the embedding tables).
func (p *encoderPlan) step(in, out []byte) error {
	tensor := func(i int) []int64 {
		l := p.layout.Inputs[i]
		return int64s(in[l.Offset : l.Offset+l.Bytes])
	}
	copy(p.ids, tensor(models.EncoderInputIDs))
	copy(p.mask, tensor(models.EncoderAttentionMask))
	copy(p.types, tensor(models.EncoderTokenTypeIDs))
	t := p.rec.Begin()
	rows, err := p.embed()
	if err != nil {
		return err
	}
	p.rec.End("embeddings+layernorm", -1, 0, t)
	p.split(rows)
	tasks := (chan groupTask)(nil)
	if n := len(p.groups) - 1; n > 1 {
		tasks = ensureWorkers(n - 1)
		for g := 1; g < n; g++ {
			tasks <- groupTask{p, g}
		}
	}
	p.runGroup(0)
	for g := 1; g < len(p.groups)-1; g++ {
		<-p.groupDone
	}
	t = p.rec.Begin()
	p.pool()
	p.rec.End("pooling", -1, 0, t)
	if p.e.Head != nil {
		t = p.rec.Begin()
		p.classify()
		p.rec.End("classification head", -1, 0, t)
		copy(floats(out), p.logits)
		return nil
	}
	copy(floats(out), p.pooled)
	return nil
}

// classify runs the classification head on the pooled first tokens:
// dense, tanh or ReLU, then the classifier, into p.logits.
func (p *encoderPlan) classify() {
	h := p.e.Head
	H, L := p.e.Config.Hidden, p.e.Config.NumLabels
	linear(p.batch, H, H, p.pooled, p.w[&h.Dense], p.headX)
	if h.Act == "relu" {
		biasAct(p.headX, h.Dense.Bias, actReLU)
	} else {
		biasAct(p.headX, h.Dense.Bias, actNone)
		for i, v := range p.headX {
			p.headX[i] = float32(math.Tanh(float64(v)))
		}
	}
	linear(p.batch, L, H, p.headX, p.w[&h.Classifier], p.logits)
	biasAct(p.logits, h.Classifier.Bias, actNone)
}

// compact reports whether the step may leave padded tokens out: a padded
// token's row never reaches a real token (attention masks it as a key) nor
// the output (mean pooling skips it), except under cls pooling when a
// sequence's first token is itself padded, which is then pooled.
func (p *encoderPlan) compact() bool {
	if p.neverCompact {
		return false
	}
	if p.e.Config.Pooling != "cls" {
		return true
	}
	for b := range p.batch {
		row := p.mask[b*p.seq : (b+1)*p.seq]
		if row[0] != 0 {
			continue
		}
		for _, m := range row {
			if m != 0 {
				return false
			}
		}
	}
	return true
}

// embed writes the embeddings of the tokens the step computes into the
// first rows of p.x and returns how many there are. The CPU engine leaves
// padding out: sequence b's real tokens become rows seqOff[b] up to
// seqOff[b]+seqLen[b], so that the products run on real tokens only (a
// 14-token text in a 32-token bucket costs 14 rows, not 32). When it may
// not (see compact), every token is a row and the key mask does the work.
func (p *encoderPlan) embed() (int, error) {
	c := p.e.Config
	H := c.Hidden
	compact := p.compact()
	types := p.e.TypeEmb != nil
	// The RoBERTa family's positions: pad_token_id for a padding id, and
	// pad_token_id + n for the n-th id of the sequence that is not
	// padding (HF's create_position_ids_from_input_ids).
	offset, pad := c.OffsetPositions(), int64(c.PadID())
	r := 0
	for b := range p.batch {
		p.seqOff[b] = r
		real := 0
		for s := range p.seq {
			t := b*p.seq + s
			id, tt := p.ids[t], p.types[t]
			if id < 0 || id >= int64(c.VocabSize) || types && (tt < 0 || tt >= int64(c.TypeVocabSize)) {
				return 0, fmt.Errorf("cpufallback: token %d: id %d or type %d outside the vocabulary (%d ids, %d types)", t, id, tt, c.VocabSize, c.TypeVocabSize)
			}
			pos := s
			if offset {
				pos = int(pad)
				if id != pad {
					real++
					pos += real
				}
			}
			if compact && p.mask[t] == 0 {
				continue
			}
			p.maskAdd[t] = 0
			if p.mask[t] == 0 {
				p.maskAdd[t] = maskedScore
			}
			row := p.x[r*H : (r+1)*H]
			w := p.e.WordEmb[int(id)*H:]
			ps := p.e.PosEmb[pos*H : (pos+1)*H]
			if types {
				ty := p.e.TypeEmb[int(tt)*H:]
				for j := range row {
					row[j] = w[j] + ps[j] + ty[j]
				}
			} else {
				for j := range row {
					row[j] = w[j] + ps[j]
				}
			}
			r++
		}
		p.seqLen[b] = r - p.seqOff[b]
	}
	p.compacted = compact
	layerNormRows(p.x[:r*H], p.e.EmbNorm, c.LayerNormEps)
	return r, nil
}

// split divides the step's sequences into at most parallelism groups of
// about equal rows, each of at least minGroupRows; one group when the
// step is small.
func (p *encoderPlan) split(rows int) {
	threads := int(parallelism.Load())
	n := min(threads, rows/minGroupRows, len(p.attn), len(p.scores))
	n = max(n, 1)
	defer func() {
		// The threads the groups leave idle go to their products and heads.
		p.threads = max(1, min(threads, len(p.scores))/(len(p.groups)-1))
	}()
	p.groups = append(p.groups[:0], 0)
	for b, g := 0, 1; g < n; g++ {
		// The first sequence at which the rows so far reach g/n of them.
		for b < p.batch && p.seqOff[b]+p.seqLen[b] <= rows*g/n {
			b++
		}
		if b > p.groups[len(p.groups)-1] && b < p.batch {
			p.groups = append(p.groups, b)
		}
	}
	p.groups = append(p.groups, p.batch)
}

// scoreBuffers allocates one attention score matrix per thread that may
// run a head, one after another in one block (a crew's threads find
// theirs by index).
func scoreBuffers(threads, seq int) [][]float32 {
	all := make([]float32, threads*seq*seq)
	s := make([][]float32, threads)
	for i := range s {
		s[i] = all[i*seq*seq : (i+1)*seq*seq : (i+1)*seq*seq]
	}
	return s
}

// runGroup runs every layer on group g's sequences.
func (p *encoderPlan) runGroup(g int) {
	lo, hi := p.groups[g], p.groups[g+1]
	if lo >= hi {
		return
	}
	rowLo, rowHi := p.seqOff[lo], p.seqOff[hi-1]+p.seqLen[hi-1]
	groupRunning(1)
	defer groupRunning(-1)
	p.crews[g], p.gthreads[g] = nil, 1
	if rowHi > rowLo {
		p.crews[g], p.gthreads[g] = beginCrewFor(p.threads, p.work(rowHi-rowLo))
	}
	defer p.endCrew(g)
	for i := range p.e.Layers {
		t := p.rec.Begin()
		p.layer(&p.e.Layers[i], lo, hi, rowLo, rowHi, g)
		p.rec.End("layer", i, lo, t)
	}
}

// work is about how many multiply-adds a step of rows rows does: its
// products (attention's, a few percent at the lengths that matter here,
// left out).
func (p *encoderPlan) work(rows int) int {
	c := p.e.Config
	return rows * len(p.e.Layers) * (4*c.Hidden*c.Hidden + 2*c.Hidden*c.Intermediate)
}

// endCrew lets group g's crew go, if it holds one.
func (p *encoderPlan) endCrew(g int) {
	p.crews[g].end()
	p.crews[g] = nil
}

// layer runs one encoder layer on sequences lo up to hi, which are rows
// rowLo up to rowHi of p.x.
func (p *encoderPlan) layer(l *models.EncoderLayer, lo, hi, rowLo, rowHi, g int) {
	c := p.e.Config
	H, I := c.Hidden, c.Intermediate
	d := p.headDim
	rows := rowHi - rowLo
	r0, r1 := rowLo*H, rowHi*H
	x, q, k, v, ctx, tmp := p.x[r0:r1], p.q[r0:r1], p.k[r0:r1], p.v[r0:r1], p.ctx[r0:r1], p.tmp[r0:r1]

	cr, threads := p.crews[g], p.gthreads[g]
	t := p.rec.Begin()
	linearParN(cr, threads, rows, x, 3, [3]*weight{p.w[&l.Query], p.w[&l.Key], p.w[&l.Value]},
		[3][]float32{q, k, v}, [3][]float32{l.Query.Bias, l.Key.Bias, l.Value.Bias}, actNone)
	p.rec.End("q/k/v product+bias", -1, lo, t)
	t = p.rec.Begin()

	// Each sequence's heads, split among the group's threads: thread j
	// takes heads j, j+threads, ... on its own score buffer.
	a := &p.attn[g]
	*a = attnTask{p: p, q: q, k: k, v: v, ctx: ctx, scale: float32(1 / math.Sqrt(float64(d))), rowLo: rowLo,
		threads: min(threads, p.heads), scores: p.scores[g*p.threads:]}
	for b := lo; b < hi; b++ {
		a.b = b
		S := p.seqLen[b]
		switch {
		case S == 0:
		case 2*S*S*H < minParallelWork:
			parallelRun(a, a.threads, 1) // the same chunks, on this thread
		case cr != nil:
			off := (p.seqOff[b] - rowLo) * H
			cr.nat.attention(a, p.heads, S, H, d, q[off:], k[off:], v[off:], a.maskedKeys(), ctx[off:], cr.threads)
		default:
			parallelRun(a, a.threads, a.threads)
		}
	}

	p.rec.End("attention scores+softmax+context", -1, lo, t)
	t = p.rec.Begin()
	linearPar(cr, threads, rows, ctx, p.w[&l.AttnOut], tmp, nil, actNone)
	p.rec.End("attention output product", -1, lo, t)
	t = p.rec.Begin()
	cr.residualNorm(x, tmp, l.AttnOut.Bias, l.AttnNorm, c.LayerNormEps)
	p.rec.End("residual+layernorm", -1, lo, t)

	inter := p.inter[rowLo*I : rowHi*I]
	t = p.rec.Begin()
	linearPar(cr, threads, rows, x, p.w[&l.Inter], inter, l.Inter.Bias, p.act)
	p.rec.End("feed-forward in product+bias+activation", -1, lo, t)
	t = p.rec.Begin()
	linearPar(cr, threads, rows, inter, p.w[&l.Out], tmp, nil, actNone)
	p.rec.End("feed-forward out product", -1, lo, t)
	t = p.rec.Begin()
	cr.residualNorm(x, tmp, l.Out.Bias, l.OutNorm, c.LayerNormEps)
	p.rec.End("residual+layernorm", -1, lo, t)
}

// attnTask is one layer's attention for sequence b of a group, its heads
// split among threads (see parallelRun): chunk j runs heads j,
// j+threads, ... on score buffer scores[j], one head's [S, S] block at a
// time.
type attnTask struct {
	p            *encoderPlan
	q, k, v, ctx []float32 // the group's rows
	scores       [][]float32
	scale        float32
	rowLo, b     int
	threads      int
}

// keys is the mask added to sequence b's attention scores: none left to
// mask when padding was left out.
func (a *attnTask) keys() []float32 {
	p := a.p
	S := p.seqLen[a.b]
	if p.compacted {
		return p.zeros[:S]
	}
	return p.maskAdd[a.b*p.seq : a.b*p.seq+S]
}

// maskedKeys is keys, or nil when no key is masked (padding left out):
// the native head then skips adding it.
func (a *attnTask) maskedKeys() []float32 {
	if a.p.compacted {
		return nil
	}
	return a.keys()
}

func (a *attnTask) run(j int) {
	p := a.p
	H, d := p.e.Config.Hidden, p.headDim
	S := p.seqLen[a.b]
	keys, masked := a.keys(), a.maskedKeys()
	scores := a.scores[j][:S*S]
	native := products != nil && products.attention != nil
	for h := j; h < p.heads; h += a.threads {
		off := (p.seqOff[a.b]-a.rowLo)*H + h*d
		// scores = q_h · k_hᵀ / sqrt(d) + mask; ctx_h = softmax(scores) · v_h
		if native {
			products.attention(S, d, H, a.scale, a.q[off:], a.k[off:], a.v[off:], masked, a.ctx[off:], scores)
			continue
		}
		gemm(true, S, S, d, a.scale, a.q[off:], H, a.k[off:], H, 0, scores, S)
		addSoftmaxRows(scores, keys)
		gemm(false, S, d, S, 1, scores, S, a.v[off:], H, 0, a.ctx[off:], H)
	}
}

// pool reduces each sequence to one vector: its first token, its last
// real token, or the mean over the attention mask; then optionally scales
// it to unit length. A
// sequence with no tokens at all (a padding row of the batch) pools to
// zeros.
func (p *encoderPlan) pool() {
	c := p.e.Config
	H := c.Hidden
	for b := range p.batch {
		dst := p.pooled[b*H : (b+1)*H]
		clear(dst)
		off, n := p.seqOff[b], p.seqLen[b]
		switch {
		case n == 0:
		case c.Pooling == "cls":
			copy(dst, p.x[off*H:(off+1)*H])
		case c.Pooling == "last":
			last := n - 1
			for !p.compacted && last >= 0 && p.mask[b*p.seq+last] == 0 {
				last--
			}
			if last >= 0 {
				copy(dst, p.x[(off+last)*H:(off+last+1)*H])
			}
		default:
			real := 0
			for s := range n {
				if !p.compacted && p.mask[b*p.seq+s] == 0 {
					continue
				}
				real++
				for j, v := range p.x[(off+s)*H : (off+s+1)*H] {
					dst[j] += v
				}
			}
			if real > 0 {
				inv := 1 / float32(real)
				for j := range dst {
					dst[j] *= inv
				}
			}
		}
		if c.Normalize {
			var ss float64
			for _, v := range dst {
				ss += float64(v) * float64(v)
			}
			inv := float32(1 / math.Max(math.Sqrt(ss), 1e-12))
			for j := range dst {
				dst[j] *= inv
			}
		}
	}
}

// EncoderFLOPs counts the floating-point operations of one step's matrix
// products (2 per multiply-add), for benchmarks.
func EncoderFLOPs(c *models.EncoderConfig, batch, seq int) float64 {
	T, H, I, S := float64(batch*seq), float64(c.Hidden), float64(c.Intermediate), float64(seq)
	perLayer := 2*T*H*H*4 + 2*T*H*I*2 + 2*float64(batch)*S*S*H*2
	return perLayer * float64(c.Layers)
}
