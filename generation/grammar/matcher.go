package grammar

import "fmt"

// Matcher follows one sequence through a compiled grammar: Mask says
// which tokens may come next, Accept takes the one sampled. A Matcher is
// not safe for concurrent use; its Compiled is.
type Matcher struct {
	c        *Compiled
	sim      sim
	set      []int32 // the current stacks, closed
	complete bool    // the output so far matches the whole grammar
	ended    bool    // an end-of-sequence token was accepted
	a, b     []int32 // scratch stack sets for Accept
	below    []int32 // scratch for Mask
}

// NewMatcher starts a sequence at the beginning of the grammar.
func (c *Compiled) NewMatcher() *Matcher {
	m := &Matcher{c: c, sim: sim{g: c.g}}
	m.set, m.complete = m.sim.closeInto(nil, []int32{c.g.start[c.g.root]})
	return m
}

// Done reports whether the output so far is complete: an end-of-sequence
// token is allowed (or was accepted).
func (m *Matcher) Done() bool { return m.complete || m.ended }

// Ended reports whether an end-of-sequence token was accepted.
func (m *Matcher) Ended() bool { return m.ended }

// Mask fills dst, at least Vocab.MaskWords long, with the tokens allowed
// next: bit i%32 of word i/32 for token i. End-of-sequence tokens are
// allowed only when the output is complete; nothing is after one.
func (m *Matcher) Mask(dst []uint32) {
	v := m.c.v
	clear(dst)
	if m.ended {
		return
	}
	dst = dst[:v.MaskWords()]
	set := m.set
	for i := 0; i < len(set); {
		n := int(set[i])
		stk := set[i+1 : i+1+n]
		i += 1 + n
		e := m.c.entry(stk[n-1], &m.sim)
		if e.dense != nil {
			for w, bits := range e.dense {
				dst[w] |= bits
			}
		}
		for _, id := range e.sparse {
			dst[id>>5] |= 1 << (id & 31)
		}
		if e.rest == nil || n == 1 {
			continue // at the bottom, nothing may follow the end
		}
		m.below, _ = m.sim.closeInto(m.below[:0], stk[:n-1])
		if len(m.below) > 0 {
			m.sim.allow(dst, e.rest, m.below)
		}
	}
	if m.complete {
		for _, id := range v.eos {
			dst[id>>5] |= 1 << (id & 31)
		}
	}
}

// Accept advances by token, or returns an error and stays where it was
// if the token is not allowed.
func (m *Matcher) Accept(token int32) error {
	v := m.c.v
	if m.ended {
		return fmt.Errorf("grammar: token %d after the end of sequence", token)
	}
	if token < 0 || int(token) >= len(v.tokens) {
		return fmt.Errorf("grammar: token %d outside the vocabulary of %d", token, len(v.tokens))
	}
	if v.isEOS[token] {
		if !m.complete {
			return fmt.Errorf("grammar: end of sequence (token %d) before the output is complete", token)
		}
		m.ended = true
		return nil
	}
	bs := v.tokens[token]
	if len(bs) == 0 {
		return fmt.Errorf("grammar: token %d stands for no bytes", token)
	}
	cur, complete := m.set, false
	for j, c := range bs {
		next := m.a[:0]
		next, complete = m.sim.step(next, cur, c)
		if len(next) == 0 && !(complete && j == len(bs)-1) {
			return fmt.Errorf("grammar: token %d (%q) not allowed: byte %d does not fit", token, bs, j)
		}
		m.a = m.b
		m.b = next
		cur = next
	}
	m.set = append(m.set[:0], cur...)
	m.complete = complete
	return nil
}

// clone is an independent copy of m (for tests: try a token without
// advancing).
func (m *Matcher) clone() *Matcher {
	return &Matcher{c: m.c, sim: sim{g: m.c.g}, set: append([]int32(nil), m.set...), complete: m.complete, ended: m.ended}
}
