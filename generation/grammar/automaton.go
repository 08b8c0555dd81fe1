package grammar

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"unsafe"
)

// Limits on what one constraint may compile to.
const (
	maxNFAStates = 100_000 // per rule, counted while building
	maxDFAStates = 50_000  // over all rules (building is superlinear: keep it short)
)

var errTooLarge = errors.New("grammar: constraint too large (bounded repetitions or enums expand past the limit)")

// Grammar is a compiled constraint: rules, each a deterministic automaton
// over bytes whose edges may also call a rule (run it to its end, then
// continue at the edge's target). States are numbered across all rules.
// A Grammar is immutable and may be shared.
type Grammar struct {
	edgeOff []int32    // state s's byte edges are edges[edgeOff[s]:edgeOff[s+1]]
	edges   []byteEdge // sorted by lo, disjoint
	callOff []int32    // state s's calls are calls[callOff[s]:callOff[s+1]]
	calls   []callEdge
	final   []bool  // the rule may end in this state
	start   []int32 // each rule's first state
	names   []string
	root    int32 // the rule the output must match
}

// byteEdge leads on any byte in [lo, hi] to state to.
type byteEdge struct {
	lo, hi byte
	to     int32
}

// callEdge runs rule, then continues at state to.
type callEdge struct{ rule, to int32 }

// NumStates is the number of automaton states over all rules.
func (g *Grammar) NumStates() int { return len(g.final) }

// next is the state after byte b from state s, or -1.
func (g *Grammar) next(s int32, b byte) int32 {
	for _, e := range g.edges[g.edgeOff[s]:g.edgeOff[s+1]] {
		if b <= e.hi {
			if b >= e.lo {
				return e.to
			}
			return -1
		}
	}
	return -1
}

func (g *Grammar) callsOf(s int32) []callEdge { return g.calls[g.callOff[s]:g.callOff[s+1]] }
func (g *Grammar) hasBytes(s int32) bool      { return g.edgeOff[s] < g.edgeOff[s+1] }

// builder collects rules, then determinizes them into a Grammar.
type builder struct {
	names  []string
	bodies []*expr
}

// rule adds a rule whose body is set later with define (so that it may
// call itself).
func (b *builder) rule(name string) int {
	b.names = append(b.names, name)
	b.bodies = append(b.bodies, nil)
	return len(b.names) - 1
}

func (b *builder) define(rule int, body *expr) { b.bodies[rule] = body }

// nfa is a Thompson automaton for one rule's body.
type nfa struct {
	eps   [][]int32
	bytes [][]nfaByte
	calls [][]callEdge
}

type nfaByte struct {
	set byteSet
	to  int32
}

func (n *nfa) state() int32 {
	if len(n.eps) >= maxNFAStates {
		panic(errTooLarge)
	}
	n.eps = append(n.eps, nil)
	n.bytes = append(n.bytes, nil)
	n.calls = append(n.calls, nil)
	return int32(len(n.eps) - 1)
}

func (n *nfa) link(a, b int32) { n.eps[a] = append(n.eps[a], b) }

// build adds e's fragment, returning its entry and exit states.
func (n *nfa) build(e *expr) (int32, int32) {
	switch e.op {
	case opEmpty:
		s := n.state()
		return s, s
	case opNone:
		return n.state(), n.state()
	case opByte:
		s, t := n.state(), n.state()
		n.bytes[s] = append(n.bytes[s], nfaByte{e.set, t})
		return s, t
	case opCall:
		s, t := n.state(), n.state()
		n.calls[s] = append(n.calls[s], callEdge{int32(e.rule), t})
		return s, t
	case opSeq:
		s := n.state()
		cur := s
		for _, sub := range e.subs {
			a, z := n.build(sub)
			n.link(cur, a)
			cur = z
		}
		return s, cur
	case opAlt:
		s, t := n.state(), n.state()
		for _, sub := range e.subs {
			a, z := n.build(sub)
			n.link(s, a)
			n.link(z, t)
		}
		return s, t
	case opGraph:
		states := make([]int32, e.graph.nodes)
		for i := range states {
			states[i] = n.state()
		}
		for _, ge := range e.graph.edges {
			if ge.e == nil {
				n.link(states[ge.from], states[ge.to])
				continue
			}
			a, z := n.build(ge.e)
			n.link(states[ge.from], a)
			n.link(z, states[ge.to])
		}
		return states[0], states[len(states)-1]
	case opRep:
		s := n.state()
		cur := s
		for range e.min {
			a, z := n.build(e.subs[0])
			n.link(cur, a)
			cur = z
		}
		if e.max < 0 {
			loop := n.state()
			a, z := n.build(e.subs[0])
			n.link(cur, loop)
			n.link(loop, a)
			n.link(z, loop)
			return s, loop
		}
		end := n.state()
		n.link(cur, end)
		for range e.max - e.min {
			a, z := n.build(e.subs[0])
			n.link(cur, a)
			n.link(z, end)
			cur = z
		}
		return s, end
	}
	panic("grammar: unknown expr op")
}

// closure adds to set (sorted on return) the states reachable by empty
// moves.
func (n *nfa) closure(set []int32, mark []bool) []int32 {
	for _, s := range set {
		mark[s] = true
	}
	for i := 0; i < len(set); i++ {
		for _, t := range n.eps[set[i]] {
			if !mark[t] {
				mark[t] = true
				set = append(set, t)
			}
		}
	}
	for _, s := range set {
		mark[s] = false
	}
	slices.Sort(set)
	return set
}

func setKey(set []int32) string {
	if len(set) == 0 {
		return ""
	}
	return string(unsafe.Slice((*byte)(unsafe.Pointer(&set[0])), 4*len(set)))
}

// dstate is a state of a rule's automaton while it is determinized.
type dstate struct {
	edges []byteEdge
	calls []callEdge
	final bool
}

// determinize turns one rule's body into states appended to out.
func determinize(body *expr, out *[]dstate) (start int32, err error) {
	defer func() {
		if r := recover(); r != nil {
			if r != errTooLarge {
				panic(r)
			}
			err = errTooLarge
		}
	}()
	var n nfa
	a, z := n.build(body)
	mark := make([]bool, len(n.eps))
	ids := map[string]int32{}
	var sets [][]int32
	intern := func(set []int32) int32 {
		// Only the states that read, call or end tell sets apart: two
		// sets alike in those behave alike.
		set = n.closure(set, mark)
		kept := set[:0]
		for _, s := range set {
			if s == z || len(n.bytes[s]) > 0 || len(n.calls[s]) > 0 {
				kept = append(kept, s)
			}
		}
		set = kept
		k := setKey(set)
		if id, ok := ids[k]; ok {
			return id
		}
		if len(*out) >= maxDFAStates {
			panic(errTooLarge)
		}
		id := int32(len(*out))
		ids[k] = id
		*out = append(*out, dstate{})
		sets = append(sets, set)
		return id
	}
	start = intern([]int32{a})
	for i := 0; i < len(sets); i++ {
		set := sets[i]
		id := start + int32(i)
		var targets [256][]int32
		for _, s := range set {
			if s == z {
				(*out)[id].final = true
			}
			for _, e := range n.bytes[s] {
				for w := range 4 {
					for word := e.set[w]; word != 0; word &= word - 1 {
						b := w*64 + bits.TrailingZeros64(word)
						if !slices.Contains(targets[b], e.to) {
							targets[b] = append(targets[b], e.to)
						}
					}
				}
			}
		}
		var edges []byteEdge
		seen := map[string]int32{}
		for b := range 256 {
			if len(targets[b]) == 0 {
				continue
			}
			slices.Sort(targets[b])
			k := setKey(targets[b])
			to, ok := seen[k]
			if !ok {
				to = intern(targets[b])
				seen[k] = to
			}
			if m := len(edges); m > 0 && edges[m-1].to == to && int(edges[m-1].hi) == b-1 {
				edges[m-1].hi = byte(b)
			} else {
				edges = append(edges, byteEdge{byte(b), byte(b), to})
			}
		}
		byRule := map[int32][]int32{}
		var rules []int32
		for _, s := range set {
			for _, c := range n.calls[s] {
				if _, ok := byRule[c.rule]; !ok {
					rules = append(rules, c.rule)
				}
				byRule[c.rule] = append(byRule[c.rule], c.to)
			}
		}
		slices.Sort(rules)
		var calls []callEdge
		for _, r := range rules {
			calls = append(calls, callEdge{r, intern(byRule[r])})
		}
		(*out)[id].edges, (*out)[id].calls = edges, calls
	}
	return start, nil
}

// build determinizes every rule, drops the states from which no rule end
// can be reached, and refuses left recursion.
func (b *builder) build(root int) (*Grammar, error) {
	var states []dstate
	start := make([]int32, len(b.bodies))
	for r, body := range b.bodies {
		if body == nil {
			return nil, fmt.Errorf("grammar: rule %s has no body", b.names[r])
		}
		s, err := determinize(body, &states)
		if err != nil {
			return nil, err
		}
		start[r] = s
	}
	// live: a state from which its rule can end, given the rules it calls.
	live := make([]bool, len(states))
	for changed := true; changed; {
		changed = false
		for s := range states {
			if live[s] {
				continue
			}
			ok := states[s].final
			for _, e := range states[s].edges {
				ok = ok || live[e.to]
			}
			for _, c := range states[s].calls {
				ok = ok || live[c.to] && live[start[c.rule]]
			}
			if ok {
				live[s], changed = true, true
			}
		}
	}
	if !live[start[root]] {
		return nil, fmt.Errorf("grammar: the constraint matches nothing (rule %s)", b.names[root])
	}
	g := &Grammar{start: start, names: b.names, root: int32(root)}
	g.edgeOff = make([]int32, 0, len(states)+1)
	g.callOff = make([]int32, 0, len(states)+1)
	for s, st := range states {
		g.edgeOff = append(g.edgeOff, int32(len(g.edges)))
		g.callOff = append(g.callOff, int32(len(g.calls)))
		g.final = append(g.final, st.final)
		if !live[s] {
			continue
		}
		for _, e := range st.edges {
			if live[e.to] {
				g.edges = append(g.edges, e)
			}
		}
		for _, c := range st.calls {
			if live[c.to] && live[start[c.rule]] {
				g.calls = append(g.calls, c)
			}
		}
	}
	g.edgeOff = append(g.edgeOff, int32(len(g.edges)))
	g.callOff = append(g.callOff, int32(len(g.calls)))
	if err := g.checkLeftRecursion(); err != nil {
		return nil, err
	}
	return g, nil
}

// checkLeftRecursion refuses a rule that can call itself before reading
// a byte: matching it would push forever.
func (g *Grammar) checkLeftRecursion() error {
	n := len(g.start)
	nullable := make([]bool, n)
	for changed := true; changed; {
		changed = false
		for r := range n {
			if !nullable[r] && g.reachesEnd(g.start[r], nullable) {
				nullable[r], changed = true, true
			}
		}
	}
	// first[r]: the rules r may call before reading a byte.
	first := make([][]int32, n)
	for r := range n {
		seen := map[int32]bool{g.start[r]: true}
		work := []int32{g.start[r]}
		for len(work) > 0 {
			s := work[len(work)-1]
			work = work[:len(work)-1]
			for _, c := range g.callsOf(s) {
				if !slices.Contains(first[r], c.rule) {
					first[r] = append(first[r], c.rule)
				}
				if nullable[c.rule] && !seen[c.to] {
					seen[c.to] = true
					work = append(work, c.to)
				}
			}
		}
	}
	color := make([]uint8, n) // 0 unseen, 1 on the path, 2 done
	var visit func(r int32) error
	visit = func(r int32) error {
		color[r] = 1
		for _, q := range first[r] {
			if color[q] == 1 {
				return fmt.Errorf("grammar: rule %s is left-recursive (it can reach itself before reading anything)", g.names[q])
			}
			if color[q] == 0 {
				if err := visit(q); err != nil {
					return err
				}
			}
		}
		color[r] = 2
		return nil
	}
	for r := range n {
		if color[r] == 0 {
			if err := visit(int32(r)); err != nil {
				return err
			}
		}
	}
	return nil
}

// reachesEnd reports whether from s the rule can end reading no byte,
// calling only rules already known nullable.
func (g *Grammar) reachesEnd(s int32, nullable []bool) bool {
	seen := map[int32]bool{s: true}
	work := []int32{s}
	for len(work) > 0 {
		s := work[len(work)-1]
		work = work[:len(work)-1]
		if g.final[s] {
			return true
		}
		for _, c := range g.callsOf(s) {
			if nullable[c.rule] && !seen[c.to] {
				seen[c.to] = true
				work = append(work, c.to)
			}
		}
	}
	return false
}
