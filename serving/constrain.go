package serving

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"

	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/generation/grammar"
)

// Constraint is the structured output a generation asks for: exactly one
// of its fields. The model's output then matches it whatever the model
// would rather say: the step samples only the tokens it allows
// (generation.Constraint), on the model's own vocabulary.
type Constraint struct {
	// JSONSchema is a JSON Schema the output validates against (OpenAI's
	// response_format json_schema, vLLM's guided_json): the subset
	// generation/grammar takes, a keyword outside it refused by name.
	JSONSchema []byte
	// JSONObject is any JSON object (response_format json_object).
	JSONObject bool
	// Regex is a regular expression the whole output matches
	// (guided_regex).
	Regex string
	// Choices are the outputs allowed, one of them (guided_choice).
	Choices []string
}

// jsonWhitespace is the whitespace a constrained JSON output may have
// between two of its tokens: one (a space after a colon, a newline), so
// that a model that favours whitespace cannot pad the output out to
// max_tokens before it is complete.
const jsonWhitespace = 1

// maxGrammars bounds the compiled grammars a model keeps: a client that
// sends a new schema with every request makes each compile again, not
// the server grow.
const maxGrammars = 64

// grammars are a model's compiled constraints, by what they were
// compiled from, and its vocabulary's bytes, built at the first.
type grammars struct {
	mu       sync.Mutex
	vocab    *grammar.Vocab
	compiled map[[sha256.Size]byte]*grammar.Compiled
	order    [][sha256.Size]byte // oldest first, for eviction
}

// constraint compiles c for the generator's vocabulary (or takes it from
// the cache) and starts a matcher on it.
func (g *generator) constraint(c *Constraint) (generation.Constraint, error) {
	set := 0
	for _, b := range []bool{c.JSONSchema != nil, c.JSONObject, c.Regex != "", c.Choices != nil} {
		if b {
			set++
		}
	}
	if set != 1 {
		return nil, badGenerate("a generation takes one constraint (a JSON schema, a JSON object, a regex or choices); %d were given", set)
	}
	key := constraintKey(c)
	gs := &g.grammars
	gs.mu.Lock()
	if gs.vocab == nil {
		gs.vocab = grammar.NewVocab(g.tok.Tokenizers().VocabBytes(), g.eos)
		gs.compiled = map[[sha256.Size]byte]*grammar.Compiled{}
	}
	vocab, compiled := gs.vocab, gs.compiled[key]
	gs.mu.Unlock()
	if compiled == nil {
		// Compiled outside the lock: a large constraint costs its own
		// request the time, not the model's other constrained ones.
		gr, err := constraintGrammar(c)
		if err != nil {
			return nil, err
		}
		compiled = grammar.Compile(gr, vocab)
		gs.mu.Lock()
		if _, ok := gs.compiled[key]; !ok {
			if len(gs.order) == maxGrammars {
				delete(gs.compiled, gs.order[0])
				gs.order = gs.order[1:]
			}
			gs.compiled[key] = compiled
			gs.order = append(gs.order, key)
		}
		gs.mu.Unlock()
	}
	return &matcherConstraint{m: compiled.NewMatcher(), mask: make([]uint32, vocab.MaskWords())}, nil
}

// maxSchemaBytes bounds a constraint's source; what it expands to is
// bounded by the grammar package (a refusal says it is too large).
const maxSchemaBytes = 256 << 10

// constraintGrammar is c's grammar; a refusal names what is wrong.
func constraintGrammar(c *Constraint) (*grammar.Grammar, error) {
	if n := len(c.JSONSchema) + len(c.Regex); n > maxSchemaBytes {
		return nil, badGenerate("structured output: the schema is %d bytes; want at most %d", n, maxSchemaBytes)
	}
	var gr *grammar.Grammar
	var err error
	switch {
	case c.JSONSchema != nil:
		gr, err = grammar.FromJSONSchemaWith(c.JSONSchema, grammar.JSONOptions{MaxWhitespace: jsonWhitespace})
	case c.JSONObject:
		gr = grammar.JSONObject()
	case c.Regex != "":
		gr, err = grammar.FromRegex(c.Regex)
	default:
		if len(c.Choices) == 0 {
			return nil, badGenerate("choices is empty; want at least one")
		}
		gr, err = grammar.Choice(c.Choices)
	}
	if err != nil {
		return nil, badGenerate("structured output: %s", strings.TrimPrefix(err.Error(), "grammar: "))
	}
	return gr, nil
}

// constraintKey identifies what c compiles from.
func constraintKey(c *Constraint) [sha256.Size]byte {
	h := sha256.New()
	switch {
	case c.JSONSchema != nil:
		fmt.Fprintf(h, "schema\x00%s", c.JSONSchema)
	case c.JSONObject:
		h.Write([]byte("object"))
	case c.Regex != "":
		fmt.Fprintf(h, "regex\x00%s", c.Regex)
	default:
		h.Write([]byte("choices"))
		for _, s := range c.Choices {
			fmt.Fprintf(h, "\x00%d:%s", len(s), s)
		}
	}
	var k [sha256.Size]byte
	h.Sum(k[:0])
	return k
}

// matcherConstraint is a grammar matcher as the generation loop takes a
// constraint.
type matcherConstraint struct {
	m    *grammar.Matcher
	mask []uint32
}

func (c *matcherConstraint) Mask() []uint32 {
	c.m.Mask(c.mask)
	return c.mask
}

func (c *matcherConstraint) Accept(token int32) error { return c.m.Accept(token) }

// Done is an end-of-sequence token taken (a generation that ignores
// them outputs it); otherwise the mask leaves the model nothing but one
// once the output is complete, and the loop ends it there.
func (c *matcherConstraint) Done() bool { return c.m.Ended() }

// ToolFormat is the format the model writes tool calls in
// (models.ToolFormatHermes, ...): model.yaml's generation.tool_format, else
// its chat template's; "" when neither names one.
func (m *Model) ToolFormat() string {
	if m.gen == nil {
		return ""
	}
	if f := m.gen.opts.ToolFormat; f != "" {
		return f // model.yaml's generation.tool_format
	}
	if m.gen.chat == nil {
		return ""
	}
	return m.gen.chat.ToolFormat()
}
