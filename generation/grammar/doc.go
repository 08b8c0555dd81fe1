// Package grammar turns an output constraint into a per-step mask of the
// tokens a model may sample next: constrained decoding for structured
// output (a JSON Schema, any JSON object, a regular expression, a choice
// among strings) over the model's own vocabulary.
//
// It owns three things and nothing else:
//
//   - constraints ([FromJSONSchema], [JSONObject], [FromRegex], [Choice]),
//     each compiled into a [Grammar]: a set of rules, each rule a
//     deterministic automaton over bytes whose edges may also call other
//     rules (a recursive transition network, so that $ref recursion and
//     nested JSON need no depth fixed in advance);
//   - a [Vocab]: the raw bytes each token stands for, kept as a byte trie,
//     so that a token may end in the middle of a UTF-8 character and the
//     next one finish it;
//   - a [Compiled] grammar for one vocabulary, shared by every sequence
//     that uses it, and a [Matcher] per sequence whose Mask fills the
//     allowed-token bitmask (vocab/32 words, bit i of word i/32 for token
//     i) and whose Accept advances by the token sampled.
//
// A matcher's state is a small set of stacks of automaton states (the
// rule being matched on top, the states to return to below). For every
// automaton state the compiled grammar learns once, lazily, which tokens
// are accepted from it without leaving its rule (a bitmask), which are
// rejected, and which leave the rule part way through (a trie of the
// bytes left after the rule ends); only the last kind is checked against
// the rest of the stack at each step, as XGrammar's adaptive token mask
// cache does. Mask therefore costs about one OR of the vocabulary's
// bitmask per stack plus a small pruned walk, whatever the vocabulary's
// size.
//
// The package imports nothing from the module: the decoders apply the
// mask to the logits, and the API layers turn response_format and tools
// into constraints.
package grammar
