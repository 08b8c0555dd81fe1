package grammar

// maxDepth bounds a stack (calls nested in calls); a deeper nesting is
// refused, as if the grammar ended there.
const maxDepth = 1024

// A stack is a run of states: the states to return to, from the bottom,
// then the current one on top. A stack set is flat: each stack is its
// length followed by its states. Every stack in a matcher's set has a top
// state that reads a byte; calls and rule ends are taken eagerly
// (closeInto).

// sim steps stack sets; it holds scratch space, one per matcher.
type sim struct {
	g    *Grammar
	work []int32 // stacks still to expand: each its states then its length
	seen []int32 // stacks met in this closure, flat like a stack set
	cur  []int32 // the stack being expanded
	nxt  []int32 // the stack being stepped

	levels [][]int32 // stack sets by depth, for the trie walks
	root   []int32   // the stack set a state's entry starts from
}

// closeInto adds to out each stack reachable from stk by calls and rule
// ends without reading a byte whose top reads a byte, and reports whether
// the root rule can end there (the output is complete).
func (m *sim) closeInto(out, stk []int32) ([]int32, bool) {
	g := m.g
	top := stk[len(stk)-1]
	if g.callOff[top] == g.callOff[top+1] && !g.final[top] {
		return addStack(out, stk), false
	}
	complete := false
	m.work = append(append(m.work[:0], stk...), int32(len(stk)))
	m.seen = addStack(m.seen[:0], stk)
	for len(m.work) > 0 {
		n := int(m.work[len(m.work)-1])
		w := len(m.work) - 1 - n
		cur := append(m.cur[:0], m.work[w:w+n]...)
		m.work = m.work[:w]
		top := cur[n-1]
		if g.hasBytes(top) {
			out = addStack(out, cur)
		}
		if g.final[top] {
			if n == 1 {
				complete = true
			} else {
				m.push(cur[:n-1])
			}
		}
		if n < maxDepth {
			for _, c := range g.callsOf(top) {
				cur[n-1] = c.to
				cur = append(cur[:n], g.start[c.rule])
				m.push(cur)
				cur = cur[:n]
				cur[n-1] = top
			}
		}
		m.cur = cur
	}
	return out, complete
}

func (m *sim) push(stk []int32) {
	if containsStack(m.seen, stk) {
		return
	}
	m.seen = addStack(m.seen, stk)
	m.work = append(append(m.work, stk...), int32(len(stk)))
}

// step adds to out the closed stacks that set reaches by reading b, and
// reports whether the output is complete after it.
func (m *sim) step(out, set []int32, b byte) ([]int32, bool) {
	complete := false
	for i := 0; i < len(set); {
		n := int(set[i])
		stk := set[i+1 : i+1+n]
		i += 1 + n
		t := m.g.next(stk[n-1], b)
		if t < 0 {
			continue
		}
		m.nxt = append(m.nxt[:0], stk...)
		m.nxt[n-1] = t
		var c bool
		out, c = m.closeInto(out, m.nxt)
		complete = complete || c
	}
	return out, complete
}

// setLevel0 starts a trie walk from set, keeping the deeper levels
// buffers.
func (m *sim) setLevel0(set []int32) {
	if len(m.levels) == 0 {
		m.levels = append(m.levels, nil)
	}
	m.levels[0] = set
}

// level is the scratch stack set for depth d of a trie walk.
func (m *sim) level(d int) []int32 {
	for len(m.levels) <= d {
		m.levels = append(m.levels, nil)
	}
	return m.levels[d][:0]
}

func addStack(set, stk []int32) []int32 {
	if containsStack(set, stk) {
		return set
	}
	set = append(set, int32(len(stk)))
	return append(set, stk...)
}

func containsStack(set, stk []int32) bool {
	n := len(stk)
	for i := 0; i < len(set); i += 1 + int(set[i]) {
		if int(set[i]) != n {
			continue
		}
		s := set[i+1 : i+1+n]
		j := n - 1
		for j >= 0 && s[j] == stk[j] {
			j--
		}
		if j < 0 {
			return true
		}
	}
	return false
}
