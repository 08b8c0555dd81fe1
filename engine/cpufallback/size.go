package cpufallback

import (
	"math"
	"unsafe"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
)

// ResidentBytes is the host memory the engine allocates for a model of cfg
// loaded with buckets, every bucket compiled: the Linear weights in the
// engine's layout (shared by its replicas), and each replica's staging
// pair and plan for every bucket. The model's own weights
// ([models.Weights]) are not counted. It reads model.yaml's sizes alone,
// so that a model too large to serve is refused before its weights are
// read; it saturates at math.MaxInt64 rather than overflow.
func (Engine) ResidentBytes(cfg *models.Config, buckets []bucketing.Shape) int64 {
	var replica int64
	for _, s := range buckets {
		l := engine.NewLayout(cfg, s)
		replica = addBytes(replica, alignedSize(l.InBytes)+alignedSize(l.OutBytes)+planBytes(cfg, s))
	}
	n := residentWeightBytes(cfg)
	for range cfg.Instances.Replicas(1) {
		n = addBytes(n, replica)
	}
	return n
}

// residentWeightBytes is what newResidentWeights allocates: a copy of
// every Linear weight in the product kernels' layout (transposed, or packed
// in panels whose last is padded to the kernel's width).
func residentWeightBytes(cfg *models.Config) int64 {
	width, elem := int64(1), int64(4)
	if products != nil {
		width = int64(products.width)
	}
	bf16 := wantsBF16(cfg)
	weight := func(in, out int) int64 {
		n := int64(in)
		if bf16 {
			n, elem = (n+1)/2*2, 2 // pairs of k, in bfloat16
		}
		return elem * n * ((int64(out) + width - 1) / width * width)
	}
	var n int64
	switch {
	case cfg.MLP != nil:
		for i := 0; i+1 < len(cfg.MLP.Sizes); i++ {
			n += weight(cfg.MLP.Sizes[i], cfg.MLP.Sizes[i+1])
		}
	case cfg.Encoder != nil:
		H, I := cfg.Encoder.Hidden, cfg.Encoder.Intermediate
		n = int64(cfg.Encoder.Layers) * (4*weight(H, H) + weight(H, I) + weight(I, H))
		if cfg.Encoder.Head == models.HeadClassification {
			n += weight(H, H) + weight(H, cfg.Encoder.NumLabels)
		}
	}
	return n
}

// planBytes is what newEncoderPlan or newMLPPlan allocates for bucket s.
// model.yaml's bounds keep every term within int64.
func planBytes(cfg *models.Config, s bucketing.Shape) int64 {
	b := int64(s.Batch)
	switch {
	case cfg.MLP != nil:
		n := 4 * b * int64(cfg.MLP.Sizes[0]) // input
		for _, w := range cfg.MLP.Sizes[1:] {
			n += 4 * b * int64(w) // each layer's activations
		}
		return n
	case cfg.Encoder != nil:
		c := cfg.Encoder
		seq := int64(s.Seq)
		t, H, I := b*seq, int64(c.Hidden), int64(c.Intermediate)
		groups, threads := min(b, int64(stepThreads())), int64(stepThreads())
		return 3*8*t + // ids, mask, types
			4*t + 4*seq + // maskAdd, zeros
			2*8*b + // seqOff, seqLen
			6*4*t*H + // x, q, k, v, ctx, tmp
			4*t*I + // inter
			4*threads*seq*seq + // scores
			groups*int64(unsafe.Sizeof(attnTask{})) + // attn
			8*groups + // crews
			8*groups + // gthreads
			8*(b+1) + // groups
			4*b*H + // pooled
			headBytes(c, b)
	}
	return 0
}

// headBytes is what a classification head's plan buffers take.
func headBytes(c *models.EncoderConfig, b int64) int64 {
	if c.Head != models.HeadClassification {
		return 0
	}
	return 4*b*int64(c.Hidden) + 4*b*int64(c.NumLabels)
}

// alignedSize is what alignedBytes(n) allocates.
func alignedSize(n int) int64 { return 8 * ((int64(n) + 7) / 8) }

func addBytes(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}
