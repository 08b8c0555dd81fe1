package generation

// A Constraint limits what a sequence may sample, token by token:
// structured output (a JSON schema, a regular expression, a list of
// choices) compiled for the model's vocabulary (generation/grammar makes
// them). Before each step that samples the sequence, the loop takes the
// tokens allowed next as a bitmask, which the step applies to the logits
// before it samples (on the device, with the step's one upload); after the
// step, the sampled token advances it. A sequence without one sends no
// mask, and its steps pay nothing.
type Constraint interface {
	// Mask is the tokens allowed next, a bit a token id (token t is bit
	// t%32 of word t/32), (vocabulary+31)/32 words: the constraint's own
	// buffer, valid until Accept. An end-of-sequence token is allowed
	// only where the output may end.
	Mask() []uint32
	// Accept advances past token, which Mask allowed; an error when it
	// did not (an engine that sampled outside the mask).
	Accept(token int32) error
	// Done reports whether the output is complete and nothing may follow
	// it but its end: the sequence stops there.
	Done() bool
}

// Allowed reports whether mask allows token.
func Allowed(mask []uint32, token int32) bool {
	w := int(token) / 32
	return token >= 0 && w < len(mask) && mask[w]&(1<<(uint(token)%32)) != 0
}
