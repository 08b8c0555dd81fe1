package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
)

// Limits on what decoding a request's JSON may build, whichever decoder
// reads it: a request of many tiny inputs, outputs, dimensions or
// parameters would otherwise cost the server many times its size before
// any of them is checked.
const (
	// MaxRank bounds a shape's dimensions: far above any model's, so that
	// a shape of the wrong rank is still told what rank it should be.
	MaxRank = 16
	// MaxParameters bounds the entries of one parameters object.
	MaxParameters = 64
)

// wireLimits are the counts a request may not exceed: a model's inputs and
// outputs.
type wireLimits struct{ inputs, outputs int }

func limitsOf(cfg *models.Config) wireLimits {
	return wireLimits{inputs: len(cfg.Inputs), outputs: len(cfg.Outputs)}
}

// checkLimits holds a body that parseWire did not read to the same limits,
// before encoding/json builds it: it walks the JSON as encoding/json
// matches keys (any case, with escapes) and refuses at the first input,
// output, dimension or parameter past a limit. JSON it cannot follow is
// left to encoding/json, which validates a document before it builds any
// of it.
func checkLimits(b []byte, m *models.Model, lim wireLimits) error {
	w := limitWalker{p: wireParser{b: b}, m: m, lim: lim}
	err := w.object(w.requestField)
	if err == errCannotFollow {
		return nil
	}
	return err
}

// errCannotFollow stops a walk through malformed JSON.
var errCannotFollow = errors.New("server: malformed JSON")

type limitWalker struct {
	p   wireParser
	m   *models.Model
	lim wireLimits
}

func (w *limitWalker) requestField(key []byte) error {
	switch {
	case bytes.EqualFold(key, []byte("inputs")):
		return w.tensors(true)
	case bytes.EqualFold(key, []byte("outputs")):
		return w.tensors(false)
	case bytes.EqualFold(key, []byte("parameters")):
		return w.parameters()
	}
	return w.value()
}

// tensors walks the inputs or outputs array. At the first past the model's
// count it names a repeated name, the likelier mistake, or the count.
func (w *limitWalker) tensors(inputs bool) error {
	if !w.peek('[') {
		return w.value()
	}
	cfg := w.m.Config
	limit, kind, verb, specs := w.lim.inputs, "input", "takes", cfg.Inputs
	if !inputs {
		limit, kind, verb, specs = w.lim.outputs, "output", "gives", cfg.Outputs
	}
	var names []string
	return w.array(func(i int) error {
		name, err := w.tensor(inputs)
		if err != nil {
			return err
		}
		if i < limit {
			names = append(names, name)
			return nil
		}
		for _, n := range names {
			if n != name || name == "" {
				continue
			}
			if inputs {
				return apierr.BadRequest(fmt.Sprintf("input %q appears more than once", name))
			}
			return apierr.BadRequest(fmt.Sprintf("output %q is requested more than once", name))
		}
		return apierr.BadRequest(fmt.Sprintf("the request names more than %d %s; model %s %s %s",
			limit, Plural(limit, kind), w.m.Name, verb, Signature(specs)))
	})
}

// tensor walks one input or output object and returns its name.
func (w *limitWalker) tensor(input bool) (string, error) {
	if !w.peek('{') {
		return "", w.value()
	}
	var name string
	err := w.object(func(key []byte) error {
		switch {
		case bytes.EqualFold(key, []byte("name")) && w.peek('"'):
			s, ok := w.str()
			if !ok {
				return errCannotFollow
			}
			name = string(s)
			return nil
		case input && bytes.EqualFold(key, []byte("shape")) && w.peek('['):
			return w.array(func(i int) error {
				if i == MaxRank {
					return apierr.BadRequest(fmt.Sprintf("an input's shape has more than %d dimensions", MaxRank))
				}
				return w.value()
			})
		case bytes.EqualFold(key, []byte("parameters")):
			return w.parameters()
		}
		return w.value()
	})
	return name, err
}

func (w *limitWalker) parameters() error {
	if !w.peek('{') {
		return w.value()
	}
	n := 0
	return w.object(func([]byte) error {
		if n++; n > MaxParameters {
			return apierr.BadRequest(fmt.Sprintf("a parameters object has more than %d entries", MaxParameters))
		}
		return w.value()
	})
}

// object walks an object, calling field with each key, decoded; field
// consumes the value.
func (w *limitWalker) object(field func(key []byte) error) error {
	p := &w.p
	if !p.object() {
		return errCannotFollow
	}
	for first := true; ; first = false {
		if p.consume('}') {
			return nil
		}
		if !first && !p.consume(',') {
			return errCannotFollow
		}
		p.ws()
		key, ok := w.str()
		if !ok || !p.consume(':') {
			return errCannotFollow
		}
		if err := field(key); err != nil {
			return err
		}
	}
}

// array walks an array, calling elem for each element; elem consumes it.
func (w *limitWalker) array(elem func(i int) error) error {
	p := &w.p
	if !p.consume('[') {
		return errCannotFollow
	}
	for i := 0; ; i++ {
		more, ok := p.next(i == 0)
		if !ok {
			return errCannotFollow
		}
		if !more {
			return nil
		}
		if err := elem(i); err != nil {
			return err
		}
	}
}

// str reads a string and decodes its escapes.
func (w *limitWalker) str() ([]byte, bool) {
	p := &w.p
	start := p.i
	if !p.skipString() {
		return nil, false
	}
	quoted := p.b[start:p.i]
	if bytes.IndexByte(quoted, '\\') < 0 {
		return quoted[1 : len(quoted)-1], true
	}
	var s string
	if json.Unmarshal(quoted, &s) != nil {
		return nil, false
	}
	return []byte(s), true
}

// peek skips white space and reports whether the next value starts with c.
func (w *limitWalker) peek(c byte) bool {
	w.p.ws()
	return w.p.i < len(w.p.b) && w.p.b[w.p.i] == c
}

// value skips one value, of any depth: brackets are counted, not checked,
// as encoding/json checks them.
func (w *limitWalker) value() error {
	p := &w.p
	p.ws()
	if p.i >= len(p.b) {
		return errCannotFollow
	}
	switch p.b[p.i] {
	case '"':
		if !p.skipString() {
			return errCannotFollow
		}
		return nil
	case '{', '[':
		depth := 0
		for p.i < len(p.b) {
			switch p.b[p.i] {
			case '"':
				if !p.skipString() {
					return errCannotFollow
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					p.i++
					return nil
				}
			}
			p.i++
		}
		return errCannotFollow
	}
	for p.i < len(p.b) && !isDelim(p.b[p.i]) && p.b[p.i] != '}' {
		p.i++
	}
	return nil
}

func Plural(n int, noun string) string {
	if n == 1 {
		return noun
	}
	return noun + "s"
}

// MaxRequestIDBytes bounds a request's id on every door (OIP's id over
// HTTP and gRPC, Triton's generate, ModelStreamInfer): an id is echoed in
// every response, and an unbounded one is memory a client chooses.
const MaxRequestIDBytes = 256

// CheckRequestID refuses an id past MaxRequestIDBytes.
func CheckRequestID(id string) error {
	if len(id) > MaxRequestIDBytes {
		return apierr.BadRequest(fmt.Sprintf("id is %d bytes; want a string of at most %d bytes", len(id), MaxRequestIDBytes))
	}
	return nil
}

// StreamWriteTimeout bounds how long one piece of a streamed answer (an
// event of an HTTP event stream, a ModelStreamInfer response) waits for
// its client to take it; past it the client is cut, its generation
// cancelled, as for a client that does not read.
const StreamWriteTimeout = 30 * time.Second
