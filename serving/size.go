package serving

import (
	"fmt"
	"math"
	"runtime"
	"strings"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/internal/bytesize"
	"github.com/stepserve/stepserve/internal/memlimit"
	"github.com/stepserve/stepserve/models"
)

// A sizer is an engine that can say, from model.yaml alone, how much host
// memory loading a model on it takes (every bucket compiled), beyond the
// weights the model itself holds. The CPU engine is one; for an engine
// that is not, the set counts the staging buffers every engine keeps on
// the host.
type sizer interface {
	ResidentBytes(cfg *models.Config, buckets []bucketing.Shape) int64
}

// modelLimit is the most host memory one model may take, and where the
// number comes from, for the error that refuses a model.
type modelLimit struct {
	bytes int64
	why   string
}

// newModelLimit is n, or half the process's memory limit when n is 0: a
// model being replaced and its new version are resident side by side
// while the new one warms up.
func newModelLimit(n int64) modelLimit {
	if n > 0 {
		return modelLimit{n, bytesize.Format(n)}
	}
	l := memlimit.Read()
	if l.Bytes == 0 {
		return modelLimit{math.MaxInt64, "no memory limit could be read"}
	}
	return modelLimit{l.Bytes / 2, fmt.Sprintf("%s, half the memory limit of %s: %s", bytesize.Format(l.Bytes/2), bytesize.Format(l.Bytes), l.Source)}
}

// admit refuses man before anything that grows with it is allocated when
// what serving it takes, with what the models served already hold, is
// above the limit: its weights as models holds them, and what each engine
// it loads on allocates for its buckets. A model being reloaded counts
// twice, since both versions are resident while the new one warms up. It
// returns the model's own estimate once loaded (a CPU decoder's without
// the float32 weights serving drops after the load).
func (l *loader) admit(man *models.Manifest, engines []string, shapes []bucketing.Shape) (int64, error) {
	weights := man.Weights.ResidentBytes()
	need := weights
	// loaded is what the model holds once loaded: need, but where the CPU
	// engine packs a decoder's weights and serving then drops the model's
	// float32 copies (engine.WeightReleaser), without them.
	loaded := int64(-1)
	parts := []string{"weights " + bytesize.Format(weights)}
	for i, name := range engines {
		if d := man.Config.Decoder; d != nil {
			// The engine's packed copy of the weights (Q8_0: 34 bytes
			// a block of 32 float32s; Q4_0: 18, its head and embeddings
			// Q8_0), the KV cache, the step's buffers, and (the
			// worker's) the token counts the penalties read: two int32
			// tables of max_num_seqs+1 rows of the vocabulary.
			packed := weights
			switch man.Config.Quantization {
			case "q8_0":
				packed = weights / 128 * 34
			case "q4_0": // the output head and the embeddings stay Q8_0
				table := 4 * int64(d.Vocab) * int64(d.Hidden)
				if !d.TiedEmbeddings {
					table *= 2
				}
				table = min(weights, table)
				packed = (weights-table)/128*18 + table/128*34
			}
			n := addBytes(packed, man.Config.KVCacheBytes())
			g := man.Config.Generation
			n = addBytes(n, 4*int64(g.MaxBatchTokens)*int64(4*d.Hidden+2*d.Heads*d.HeadDim+2*d.Intermediate)+4*int64(g.MaxNumSeqs)*int64(d.Vocab))
			n = addBytes(n, 8*int64(g.MaxNumSeqs+1)*int64(d.Vocab))
			// Per thread, a prompt chunk's scores and a sequence's keys
			// and values; four a thread, a decode's group of heads'
			// scores.
			n = addBytes(n, int64(runtime.NumCPU())*4*int64(g.MaxModelLen)*int64(g.MaxBatchTokens+2*d.HeadDim+4*d.Heads/max(d.KVHeads, 1)))
			need = addBytes(need, n)
			if name == "cpu" {
				loaded = n
			}
			parts = append(parts, fmt.Sprintf("engine %s %s (KV cache %s)", name, bytesize.Format(n), bytesize.Format(man.Config.KVCacheBytes())))
			break
		}
		eng, err := l.engines.get(name)
		if err != nil {
			return 0, fmt.Errorf("model %s: %w", man.Name, err)
		}
		cfg := man.Config
		if i > 0 { // the failover engine holds one replica
			cfg = oneReplicaConfig(cfg)
		}
		n := engineBytes(eng, cfg, shapes)
		need = addBytes(need, n)
		part := fmt.Sprintf("engine %s %s for %d buckets", name, bytesize.Format(n), len(shapes))
		if r := replicaCount(eng, cfg); r > 1 {
			part += fmt.Sprintf(" on %d replicas", r)
		}
		parts = append(parts, part)
	}
	if need > l.limit.bytes {
		return 0, fmt.Errorf("model %s: needs about %s resident (%s), above models.max_model_bytes (%s); use fewer or smaller buckets, or raise the limit",
			man.Name, bytesize.Format(need), strings.Join(parts, ", "), l.limit.why)
	}
	var held int64
	served := l.set.Models()
	for _, m := range served {
		held = addBytes(held, m.resident)
	}
	if total := addBytes(held, need); total > l.limit.bytes {
		return 0, fmt.Errorf("model %s: needs about %s resident, and the %d models served hold about %s: %s together, above models.max_model_bytes (%s), the memory all models may hold; unload a model first, or raise the limit",
			man.Name, bytesize.Format(need), len(served), bytesize.Format(held), bytesize.Format(total), l.limit.why)
	}
	if loaded >= 0 {
		return loaded, nil
	}
	return need, nil
}

// engineBytes is what eng allocates on the host for a model of cfg, every
// replica that cfg's instances place counted (a sizer counts its own).
func engineBytes(eng engine.Engine, cfg *models.Config, shapes []bucketing.Shape) int64 {
	if sz, ok := eng.(sizer); ok {
		return sz.ResidentBytes(cfg, shapes)
	}
	var one int64
	for _, s := range shapes {
		l := engine.NewLayout(cfg, s)
		one = addBytes(one, int64(l.InBytes)+int64(l.OutBytes))
	}
	var n int64
	for range replicaCount(eng, cfg) {
		n = addBytes(n, one)
	}
	return n
}

// replicaCount is how many replicas cfg's instances place on eng.
func replicaCount(eng engine.Engine, cfg *models.Config) int {
	devices := 1
	if p, ok := eng.(engine.Placer); ok {
		devices = max(len(p.DeviceNames()), 1)
	}
	return cfg.Instances.Replicas(devices)
}

func addBytes(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}
