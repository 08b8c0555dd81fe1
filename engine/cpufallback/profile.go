package cpufallback

import "github.com/stepserve/stepserve/internal/trace"

// record has the encoder's next steps record their spans into rec (a
// profiled step's: trace level PROFILE); nil stops. Its spans are the
// embeddings, each layer of each group of sequences (the track is the
// group's first sequence) with its products and element-wise kernels, and
// the pooling.
func (p *encoderPlan) record(rec *trace.Recorder) { p.rec = rec }
