package cpufallback

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/stepserve/stepserve/engine"
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
	batch   int
	seq     int
	heads   int
	headDim int
	layout  engine.Layout

	ids, mask, types []int64   // the bucket's "device" input buffers, [B*S]
	maskAdd          []float32 // 0 or maskedScore per key, [B*S]
	x, q, k, v, ctx  []float32 // [B*S, H]
	tmp              []float32 // [B*S, H]
	inter            []float32 // [B*S, I]
	scores           []float32 // [S, S], one head at a time
	pooled           []float32 // [B, H]
}

func newEncoderPlan(e *models.Encoder, layout engine.Layout) *encoderPlan {
	c := e.Config
	b, s := layout.Bucket.Batch, layout.Bucket.Seq
	t := b * s
	return &encoderPlan{
		e: e, batch: b, seq: s, heads: c.Heads, headDim: c.Hidden / c.Heads, layout: layout,
		ids: make([]int64, t), mask: make([]int64, t), types: make([]int64, t),
		maskAdd: make([]float32, t),
		x:       make([]float32, t*c.Hidden), q: make([]float32, t*c.Hidden), k: make([]float32, t*c.Hidden),
		v: make([]float32, t*c.Hidden), ctx: make([]float32, t*c.Hidden), tmp: make([]float32, t*c.Hidden),
		inter:  make([]float32, t*c.Intermediate),
		scores: make([]float32, s*s),
		pooled: make([]float32, b*c.Hidden),
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
// (the server validates them; this keeps a bad caller from reading past the
// embedding tables).
func (p *encoderPlan) step(in, out []byte) error {
	l := p.layout.Inputs
	copy(p.ids, int64s(in[l[0].Offset:l[0].Offset+l[0].Bytes]))
	copy(p.mask, int64s(in[l[1].Offset:l[1].Offset+l[1].Bytes]))
	copy(p.types, int64s(in[l[2].Offset:l[2].Offset+l[2].Bytes]))
	if err := p.embed(); err != nil {
		return err
	}
	for i := range p.e.Layers {
		p.layer(&p.e.Layers[i])
	}
	p.pool()
	copy(floats(out), p.pooled)
	return nil
}

func (p *encoderPlan) embed() error {
	c := p.e.Config
	H := c.Hidden
	for t := range p.ids {
		id, tt, pos := p.ids[t], p.types[t], t%p.seq
		if id < 0 || id >= int64(c.VocabSize) || tt < 0 || tt >= int64(c.TypeVocabSize) {
			return fmt.Errorf("cpufallback: token %d: id %d or type %d outside the vocabulary (%d ids, %d types)", t, id, tt, c.VocabSize, c.TypeVocabSize)
		}
		row := p.x[t*H : (t+1)*H]
		w := p.e.WordEmb[int(id)*H:]
		ps := p.e.PosEmb[pos*H:]
		ty := p.e.TypeEmb[int(tt)*H:]
		for j := range row {
			row[j] = w[j] + ps[j] + ty[j]
		}
		p.maskAdd[t] = 0
		if p.mask[t] == 0 {
			p.maskAdd[t] = maskedScore
		}
	}
	layerNormRows(p.x, p.e.EmbNorm, c.LayerNormEps)
	return nil
}

func (p *encoderPlan) layer(l *models.EncoderLayer) {
	c := p.e.Config
	H, I, T := c.Hidden, c.Intermediate, p.batch*p.seq
	S, d := p.seq, p.headDim

	for _, proj := range []struct {
		lin *models.Linear
		out []float32
	}{{&l.Query, p.q}, {&l.Key, p.k}, {&l.Value, p.v}} {
		linear(T, H, H, p.x, proj.lin.Weight, proj.out)
		biasAct(proj.out, proj.lin.Bias, actNone)
	}

	scale := float32(1 / math.Sqrt(float64(d)))
	for b := range p.batch {
		keys := p.maskAdd[b*S : (b+1)*S]
		for h := range p.heads {
			off := b*S*H + h*d
			// scores = q_h · k_hᵀ / sqrt(d) + mask; ctx_h = softmax(scores) · v_h
			gemm(true, S, S, d, scale, p.q[off:], H, p.k[off:], H, 0, p.scores, S)
			addSoftmaxRows(p.scores, keys)
			gemm(false, S, d, S, 1, p.scores, S, p.v[off:], H, 0, p.ctx[off:], H)
		}
	}

	linear(T, H, H, p.ctx, l.AttnOut.Weight, p.tmp)
	residualNorm(p.x, p.tmp, l.AttnOut.Bias, l.AttnNorm, c.LayerNormEps)

	linear(T, I, H, p.x, l.Inter.Weight, p.inter)
	biasAct(p.inter, l.Inter.Bias, actGELU)
	linear(T, H, I, p.inter, l.Out.Weight, p.tmp)
	residualNorm(p.x, p.tmp, l.Out.Bias, l.OutNorm, c.LayerNormEps)
}

// pool reduces each sequence to one vector: its first token, or the mean
// over the attention mask; then optionally scales it to unit length.
func (p *encoderPlan) pool() {
	c := p.e.Config
	H, S := c.Hidden, p.seq
	for b := range p.batch {
		dst := p.pooled[b*H : (b+1)*H]
		if c.Pooling == "cls" {
			copy(dst, p.x[b*S*H:b*S*H+H])
		} else {
			clear(dst)
			n := 0
			for s := range S {
				if p.mask[b*S+s] == 0 {
					continue
				}
				n++
				for j, v := range p.x[(b*S+s)*H : (b*S+s+1)*H] {
					dst[j] += v
				}
			}
			if n > 0 {
				inv := 1 / float32(n)
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
