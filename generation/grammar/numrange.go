package grammar

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// maxBound is the magnitude an integer with a minimum or a maximum stays
// within on its open side (18 digits).
const maxBound = 999_999_999_999_999_999

// intBounds reads minimum, maximum, exclusiveMinimum and exclusiveMaximum
// (numbers, as in JSON Schema 2019 and later) as an inclusive range;
// ok is false when v has none of them.
func intBounds(v *jvalue, path string) (lo, hi int64, ok bool, err error) {
	lo, hi = -maxBound, maxBound
	for _, k := range []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} {
		n := v.get(k)
		if n == nil {
			continue
		}
		ok = true
		f, perr := strconv.ParseFloat(n.num.String(), 64)
		if n.kind != 'n' || perr != nil {
			return 0, 0, false, fmt.Errorf("grammar: %s at %s is not a number", k, at(path))
		}
		switch k {
		case "minimum":
			lo = max(lo, clampBound(math.Ceil(f)))
		case "exclusiveMinimum":
			lo = max(lo, clampBound(math.Floor(f)+1))
		case "maximum":
			hi = min(hi, clampBound(math.Floor(f)))
		default:
			hi = min(hi, clampBound(math.Ceil(f)-1))
		}
	}
	if ok && lo > hi {
		return 0, 0, false, fmt.Errorf("grammar: no integer between the minimum and the maximum at %s", at(path))
	}
	return lo, hi, ok, nil
}

func clampBound(f float64) int64 { return int64(max(-maxBound, min(maxBound, f))) }

// intRange matches the integers in [lo, hi], written without leading
// zeros or a minus sign on 0.
func intRange(lo, hi int64) *expr {
	var alts []*expr
	if lo < 0 {
		alts = append(alts, seq(lit("-"), natRange(max(1, -min(hi, -1)), -lo)))
	}
	if hi >= 0 {
		alts = append(alts, natRange(max(lo, 0), hi))
	}
	return alt(alts...)
}

// natRange matches the naturals in [lo, hi] (0 <= lo <= hi <= maxBound),
// split by their number of digits.
func natRange(lo, hi int64) *expr {
	var alts []*expr
	for first, last := int64(0), int64(9); first <= hi; first, last = last+1, last*10+9 {
		if a, b := max(lo, first), min(hi, last); a <= b {
			alts = append(alts, sameLength(strconv.FormatInt(a, 10), strconv.FormatInt(b, 10)))
		}
		if last >= maxBound {
			break
		}
	}
	return alt(alts...)
}

// sameLength matches the digit strings from lo to hi, both as long.
func sameLength(lo, hi string) *expr {
	n := len(lo)
	if n == 0 {
		return eps()
	}
	if lo[0] == hi[0] {
		return seq(lit(lo[:1]), sameLength(lo[1:], hi[1:]))
	}
	if strings.Trim(lo[1:], "0") == "" && strings.Trim(hi[1:], "9") == "" {
		return seq(byteRange(lo[0], hi[0]), digits(n-1, n-1))
	}
	alts := []*expr{seq(lit(lo[:1]), sameLength(lo[1:], strings.Repeat("9", n-1)))}
	if lo[0]+1 <= hi[0]-1 {
		alts = append(alts, seq(byteRange(lo[0]+1, hi[0]-1), digits(n-1, n-1)))
	}
	return alt(append(alts, seq(lit(hi[:1]), sameLength(strings.Repeat("0", n-1), hi[1:])))...)
}
