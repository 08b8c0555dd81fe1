// Package randweights writes the random-weight encoders the shipped demos
// are (cmd/gen-tiny-encoder, cmd/gen-tiny-xlmr): a BERT-layout encoder's
// tensors under Hugging Face's names, weights drawn from N(0, 0.02) (BERT's
// and XLM-R's initialisation) by a seeded generator, LayerNorms at one and
// biases at zero, so that the same seed writes the same bytes.
package randweights

import (
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/stepserve/stepserve/models"
)

// Builder collects tensors drawn from its generator, in the order they are
// added (the order of the draws, and so the bytes, depend on it).
type Builder struct {
	rng     *rand.Rand
	tensors []*models.Tensor
}

// New returns a Builder drawing from PCG(seed1, seed2).
func New(seed1, seed2 uint64) *Builder {
	return &Builder{rng: rand.New(rand.NewPCG(seed1, seed2))}
}

func (b *Builder) normal(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(b.rng.NormFloat64() * 0.02)
	}
	return out
}

func fill(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func (b *Builder) add(name string, data []float32, shape ...int) {
	b.tensors = append(b.tensors, &models.Tensor{Name: name, Shape: shape, Data: data})
}

// Embedding adds a [rows, width] table of random weights.
func (b *Builder) Embedding(name string, rows, width int) {
	b.add(name, b.normal(rows*width), rows, width)
}

// Norm adds a LayerNorm of width: weight one, bias zero.
func (b *Builder) Norm(name string, width int) {
	b.add(name+".weight", fill(width, 1), width)
	b.add(name+".bias", fill(width, 0), width)
}

// Linear adds a torch.nn.Linear: a random [out, in] weight, a zero bias.
func (b *Builder) Linear(name string, out, in int) {
	b.add(name+".weight", b.normal(out*in), out, in)
	b.add(name+".bias", fill(out, 0), out)
}

// Encoder is a BERT-layout encoder's shape.
type Encoder struct {
	Vocab, Positions, Types, Hidden, Intermediate, Layers int
}

// Encoder adds an encoder's embeddings and layers under prefix ("",
// "bert.", "roberta.").
func (b *Builder) Encoder(prefix string, e Encoder) {
	b.Embedding(prefix+"embeddings.word_embeddings.weight", e.Vocab, e.Hidden)
	b.Embedding(prefix+"embeddings.position_embeddings.weight", e.Positions, e.Hidden)
	b.Embedding(prefix+"embeddings.token_type_embeddings.weight", e.Types, e.Hidden)
	b.Norm(prefix+"embeddings.LayerNorm", e.Hidden)
	H, I := e.Hidden, e.Intermediate
	for i := range e.Layers {
		p := fmt.Sprintf("%sencoder.layer.%d.", prefix, i)
		b.Linear(p+"attention.self.query", H, H)
		b.Linear(p+"attention.self.key", H, H)
		b.Linear(p+"attention.self.value", H, H)
		b.Linear(p+"attention.output.dense", H, H)
		b.Norm(p+"attention.output.LayerNorm", H)
		b.Linear(p+"intermediate.dense", I, H)
		b.Linear(p+"output.dense", H, I)
		b.Norm(p+"output.LayerNorm", H)
	}
}

// Write writes the tensors as safetensors at path, with metadata.
func (b *Builder) Write(path string, metadata map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := models.WriteSafetensors(f, b.tensors, metadata); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
