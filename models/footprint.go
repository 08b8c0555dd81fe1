package models

// MaxSeq is the longest sequence a step takes (the largest seq bucket); 0
// for a model without a sequence.
func (c *Config) MaxSeq() int {
	if len(c.Buckets.Seq) == 0 {
		return 0
	}
	return c.maxSeq()
}

// StepBytes bounds what [Model.PrepareInputs] allocates for rows rows of
// sequences at most seq long, so that a server can refuse a request it
// cannot afford before building any of it: a text model's token ids, one
// slice a row, and the three INT64 tensors they are packed into; the zero
// token types a token model adds when a request leaves them out; nothing
// for a model that hands its inputs on as they are.
func (m *Model) StepBytes(rows, seq int) int64 {
	cfg := m.Config
	if cfg.Architecture != "encoder" {
		return 0
	}
	r, s := int64(rows), int64(seq)
	if cfg.TextInput() {
		const sliceHeader = 24
		return r*(sliceHeader+8*s) + 3*8*r*s
	}
	return 8 * r * s
}
