package wire

import (
	"bytes"
	"encoding/json"
)

// parseWire decodes the JSON part of an inference request into wr without
// reflection: the keys of the Open Inference Protocol spelled as the
// protocol spells them, strings without escapes, shapes of plain integers.
// Tensor data, and parameter values, are kept as raw JSON for the decoders
// that read them straight into place.
//
// It reports false for anything it does not decode exactly as
// encoding/json would (escapes, non-ASCII names, null, keys repeated or in
// another case, wrong types, malformed JSON); the caller then decodes the
// same bytes with encoding/json, whose errors say what is wrong. The two
// agree on every input this accepts (FuzzParseWire).
//
// It also reports false at the first input, output, dimension or parameter
// past lim, so that no request builds more of them than a model can take;
// checkLimits then says which limit the request broke.
func parseWire(b []byte, wr *WireRequest, lim wireLimits) bool {
	p := wireParser{b: b, lim: lim}
	if !p.object() {
		return false
	}
	var seen uint8
	for first := true; ; first = false {
		key, ok := p.key(first)
		if !ok {
			return false
		}
		if key == nil {
			break
		}
		var bit uint8
		switch string(key) {
		case "id":
			bit = 1
			var s []byte
			if s, ok = p.str(); ok {
				wr.ID = string(s)
			}
		case "parameters":
			bit = 2
			wr.Pairs, ok = p.params()
		case "inputs":
			bit = 4
			wr.Inputs, ok = p.inputs()
		case "outputs":
			bit = 8
			wr.Outputs, ok = p.outputs()
		default:
			ok = !foldsTo(key, "id", "parameters", "inputs", "outputs") && p.skip()
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
	p.ws()
	return p.i == len(p.b)
}

type wireParser struct {
	b     []byte
	i     int
	depth int
	lim   wireLimits
}

// foldsTo reports whether key is one of names in another case, which
// encoding/json would also match to the field.
func foldsTo(key []byte, names ...string) bool {
	for _, n := range names {
		if bytes.EqualFold(key, []byte(n)) {
			return true
		}
	}
	return false
}

func (p *wireParser) ws() {
	for p.i < len(p.b) && isSpace(p.b[p.i]) {
		p.i++
	}
}

// consume skips white space and then c, reporting whether c was there.
func (p *wireParser) consume(c byte) bool {
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *wireParser) object() bool { return p.consume('{') }

// key reads the next key of an object and its colon; nil at the object's
// end. first says whether this is the first key (no comma before it).
func (p *wireParser) key(first bool) ([]byte, bool) {
	if p.consume('}') {
		return nil, true
	}
	if !first && !p.consume(',') {
		return nil, false
	}
	k, ok := p.str()
	if !ok || !p.consume(':') {
		return nil, false
	}
	return k, true
}

// next reads the separator before an array's next element, reporting
// false at the array's end.
func (p *wireParser) next(first bool) (more, ok bool) {
	if p.consume(']') {
		return false, true
	}
	if !first && !p.consume(',') {
		return false, false
	}
	return true, true
}

// str reads a string of printable ASCII without escapes, the form of every
// name and datatype; anything else falls back.
func (p *wireParser) str() ([]byte, bool) {
	if !p.consume('"') {
		return nil, false
	}
	start := p.i
	for ; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, false
		}
	}
	return nil, false
}

// params reads a parameters object into pairs; an empty object gives an
// empty, non-nil list, as encoding/json gives an empty map.
func (p *wireParser) params() (ParamPairs, bool) {
	if !p.object() {
		return nil, false
	}
	pairs := make(ParamPairs, 0, 1)
	for first := true; ; first = false {
		key, ok := p.key(first)
		if !ok {
			return nil, false
		}
		if key == nil {
			return pairs, true
		}
		if len(pairs) == MaxParameters {
			return nil, false
		}
		raw, ok := p.raw()
		if !ok {
			return nil, false
		}
		pairs = append(pairs, ParamPair{paramKey(key), raw})
	}
}

func (p *wireParser) inputs() ([]WireInput, bool) {
	if !p.consume('[') {
		return nil, false
	}
	ins := make([]WireInput, 0, 1)
	for first := true; ; first = false {
		more, ok := p.next(first)
		if !ok {
			return nil, false
		}
		if !more {
			return ins, true
		}
		if len(ins) == p.lim.inputs {
			return nil, false
		}
		var in WireInput
		if !p.input(&in) {
			return nil, false
		}
		ins = append(ins, in)
	}
}

func (p *wireParser) input(in *WireInput) bool {
	if !p.object() {
		return false
	}
	var seen uint8
	for first := true; ; first = false {
		key, ok := p.key(first)
		if !ok {
			return false
		}
		if key == nil {
			return true
		}
		var bit uint8
		var s []byte
		switch string(key) {
		case "name":
			bit = 1
			if s, ok = p.str(); ok {
				in.Name = string(s)
			}
		case "shape":
			bit = 2
			in.Shape, ok = p.shape()
		case "datatype":
			bit = 4
			if s, ok = p.str(); ok {
				in.Datatype = string(s)
			}
		case "parameters":
			bit = 8
			in.Pairs, ok = p.params()
		case "data":
			bit = 16
			in.Data, ok = p.raw()
			ok = ok && string(in.Data) != "null"
		default:
			ok = !foldsTo(key, "name", "shape", "datatype", "parameters", "data") && p.skip()
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
}

func (p *wireParser) outputs() ([]WireOutput, bool) {
	if !p.consume('[') {
		return nil, false
	}
	outs := make([]WireOutput, 0, 1)
	for first := true; ; first = false {
		more, ok := p.next(first)
		if !ok {
			return nil, false
		}
		if !more {
			return outs, true
		}
		if len(outs) == p.lim.outputs {
			return nil, false
		}
		var o WireOutput
		if !p.object() {
			return nil, false
		}
		var seen uint8
		for kfirst := true; ; kfirst = false {
			key, ok := p.key(kfirst)
			if !ok {
				return nil, false
			}
			if key == nil {
				break
			}
			var bit uint8
			switch string(key) {
			case "name":
				bit = 1
				var s []byte
				if s, ok = p.str(); ok {
					o.Name = string(s)
				}
			case "parameters":
				bit = 2
				o.Pairs, ok = p.params()
			default:
				ok = !foldsTo(key, "name", "parameters") && p.skip()
			}
			if !ok || seen&bit != 0 {
				return nil, false
			}
			seen |= bit
		}
		outs = append(outs, o)
	}
}

// shape reads an array of integers as encoding/json reads them into int64:
// digits with an optional minus sign, no fraction or exponent, in range.
func (p *wireParser) shape() ([]int64, bool) {
	if !p.consume('[') {
		return nil, false
	}
	s := make([]int64, 0, 4)
	for first := true; ; first = false {
		more, ok := p.next(first)
		if !ok {
			return nil, false
		}
		if !more {
			return s, true
		}
		if len(s) == MaxRank {
			return nil, false
		}
		p.ws()
		start := p.i
		if !p.number() {
			return nil, false
		}
		v, ok := parseInt64(p.b[start:p.i])
		if !ok {
			return nil, false
		}
		s = append(s, v)
	}
}

// paramKey is a parameter's name as a string, without allocating for the
// names the protocol defines.
func paramKey(b []byte) string {
	switch string(b) {
	case "binary_data_size":
		return "binary_data_size"
	case "binary_data":
		return "binary_data"
	case "binary_data_output":
		return "binary_data_output"
	case "priority":
		return "priority"
	case "timeout":
		return "timeout"
	}
	return string(b)
}

// parseInt64 parses a JSON integer without fraction or exponent.
func parseInt64(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false // longer ones may overflow: encoding/json decides
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}

// raw skips one value and returns its bytes, as json.RawMessage holds them.
func (p *wireParser) raw() (json.RawMessage, bool) {
	p.ws()
	start := p.i
	if !p.skip() {
		return nil, false
	}
	return p.b[start:p.i], true
}

// maxSkipDepth bounds the nesting skip follows; deeper values fall back to
// encoding/json, which has its own limit.
const maxSkipDepth = 64

// skip validates and skips one JSON value of any kind.
func (p *wireParser) skip() bool {
	p.ws()
	if p.i >= len(p.b) {
		return false
	}
	switch c := p.b[p.i]; {
	case c == '{':
		if p.depth++; p.depth > maxSkipDepth {
			return false
		}
		p.i++
		for first := true; ; first = false {
			if p.consume('}') {
				p.depth--
				return true
			}
			if !first && !p.consume(',') {
				return false
			}
			p.ws()
			if !p.skipString() || !p.consume(':') || !p.skip() {
				return false
			}
		}
	case c == '[':
		if p.depth++; p.depth > maxSkipDepth {
			return false
		}
		p.i++
		for first := true; ; first = false {
			more, ok := p.next(first)
			if !ok {
				return false
			}
			if !more {
				p.depth--
				return true
			}
			if !p.skip() {
				return false
			}
		}
	case c == '"':
		return p.skipString()
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	default:
		return p.number()
	}
}

func (p *wireParser) literal(lit string) bool {
	if !bytes.HasPrefix(p.b[p.i:], []byte(lit)) {
		return false
	}
	p.i += len(lit)
	return true
}

// skipString skips a string with any escapes JSON allows.
func (p *wireParser) skipString() bool {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return false
	}
	for p.i++; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			p.i++
			if p.i >= len(p.b) {
				return false
			}
			switch p.b[p.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if p.i+4 >= len(p.b) {
					return false
				}
				for _, h := range p.b[p.i+1 : p.i+5] {
					if !isHex(h) {
						return false
					}
				}
				p.i += 4
			default:
				return false
			}
		}
	}
	return false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number skips a number in JSON's grammar:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *wireParser) number() bool {
	b, i := p.b, p.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	p.i = i
	return true
}
