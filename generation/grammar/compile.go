package grammar

import (
	"sync"
	"sync/atomic"
)

// Compiled is a grammar bound to a vocabulary: what every sequence under
// this constraint shares. It learns, lazily and once per automaton state,
// which tokens the state accepts (Warm learns them all at once); it is
// safe for concurrent use by the matchers it makes. Each state learnt
// keeps a bitmask of the vocabulary (Size/8 bytes) when it accepts many
// tokens, a list when few: compile once per constraint and vocabulary,
// and share.
type Compiled struct {
	g       *Grammar
	v       *Vocab
	mu      sync.Mutex // held while an entry is computed
	entries []atomic.Pointer[entry]
}

// entry is what one automaton state s, on top of a stack, makes of the
// vocabulary, whatever lies below it on the stack.
type entry struct {
	// accepted: tokens read wholly without leaving s's rule, or that end
	// exactly where the rule ends. A bitmask when many, else a list.
	dense  []uint32
	sparse []int32
	// rest: tokens that leave the rule part way through, keyed by the
	// bytes left when it ends (a token may appear under several); the
	// stack below decides them. Nil when none.
	rest *trie
}

// Compile binds g to v. It is cheap: the per-state work happens the first
// time a matcher reaches a state.
func Compile(g *Grammar, v *Vocab) *Compiled {
	return &Compiled{g: g, v: v, entries: make([]atomic.Pointer[entry], g.NumStates())}
}

// Warm computes every state's token classes now, rather than the first
// time a matcher meets the state: the mask's latency is then flat from
// the first token, at the cost of states no output may reach. It takes
// milliseconds for a typical schema at a 128k vocabulary; a long bounded
// string (maxLength) has a state per character and costs more.
func (c *Compiled) Warm() {
	m := sim{g: c.g}
	for s := range int32(c.g.NumStates()) {
		if c.g.hasBytes(s) {
			c.entry(s, &m)
		}
	}
}

// Vocab is the vocabulary the grammar is compiled for.
func (c *Compiled) Vocab() *Vocab { return c.v }

// entry is state s's entry, computed with m's scratch space if needed.
func (c *Compiled) entry(s int32, m *sim) *entry {
	if e := c.entries[s].Load(); e != nil {
		return e
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[s].Load(); e != nil {
		return e
	}
	e := c.compute(s, m)
	c.entries[s].Store(e)
	return e
}

// compute walks the vocabulary's trie from the stack [s], pruning a
// subtree once no path lives on in the rule and none has ended it.
func (c *Compiled) compute(s int32, m *sim) *entry {
	t := &c.v.trie
	var accepted []int32
	var rest []trieItem
	var ends []int32 // the depths along the current path where the rule ended
	m.root = append(m.root[:0], 1, s)
	m.setLevel0(m.root)
	for i := 0; i < len(t.b); {
		d := int(t.depth[i])
		for len(ends) > 0 && ends[len(ends)-1] >= int32(d) {
			ends = ends[:len(ends)-1]
		}
		prev := m.levels[d-1]
		set, ended := m.step(m.level(d), prev, t.b[i])
		m.levels[d] = set
		if len(set) > 0 || ended {
			accepted = append(accepted, t.tokensAt(i)...)
		} else {
			rest = c.appendRest(rest, t.tokensAt(i), ends)
		}
		if ended {
			ends = append(ends, int32(d))
		}
		if len(set) == 0 {
			if end := int(t.end[i]); len(ends) > 0 {
				for j := i + 1; j < end; j++ {
					rest = c.appendRest(rest, t.tokensAt(j), ends)
				}
			}
			i = int(t.end[i])
			continue
		}
		i++
	}
	e := &entry{}
	if words := c.v.MaskWords(); len(accepted) > words {
		e.dense = make([]uint32, words)
		for _, id := range accepted {
			e.dense[id>>5] |= 1 << (id & 31)
		}
	} else {
		e.sparse = accepted
	}
	if len(rest) > 0 {
		r := buildTrie(rest)
		e.rest = &r
	}
	return e
}

// appendRest adds each token's bytes after each place its path ended
// the rule.
func (c *Compiled) appendRest(rest []trieItem, toks []int32, ends []int32) []trieItem {
	for _, id := range toks {
		b := c.v.tokens[id]
		for _, d := range ends {
			if int(d) < len(b) {
				rest = append(rest, trieItem{b[d:], id})
			}
		}
	}
	return rest
}

// allow sets in mask the tokens of rest that the stack set below reads
// whole: a walk of rest's trie, pruned where the set dies.
func (m *sim) allow(mask []uint32, rest *trie, below []int32) {
	m.setLevel0(below)
	for i := 0; i < len(rest.b); {
		d := int(rest.depth[i])
		set, complete := m.step(m.level(d), m.levels[d-1], rest.b[i])
		m.levels[d] = set
		if len(set) > 0 || complete {
			for _, id := range rest.tokensAt(i) {
				mask[id>>5] |= 1 << (id & 31)
			}
		}
		if len(set) == 0 {
			i = int(rest.end[i])
			continue
		}
		i++
	}
}
