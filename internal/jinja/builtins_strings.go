package jinja

import (
	"fmt"
	"strings"
	"unicode"
)

func filterJoin(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}

	if !args[0].IsList() {
		s, err := b.print(args[0])
		return NewString(s), err
	}

	var err error
	sep := ""
	if len(args) > 1 {
		if sep, err = b.print(args[1]); err != nil {
			return Undefined(), err
		}
	}
	if s, ok := kwargs["d"]; ok {
		if sep, err = b.print(s); err != nil {
			return Undefined(), err
		}
	}

	attr := ""
	if a, ok := kwargs["attribute"]; ok {
		if attr, err = b.print(a); err != nil {
			return Undefined(), err
		}
	}

	list := args[0].AsList()
	if err := b.list(int64(list.Len())); err != nil {
		return Undefined(), err
	}
	parts := make([]string, list.Len())
	size := int64(0)
	for i, item := range list.Items {
		if attr != "" && item.IsDict() {
			v, ok := item.AsDict().Get(attr)
			if ok {
				item = v
			}
		}
		if parts[i], err = b.print(item); err != nil {
			return Undefined(), err
		}
		// The joined size is checked as it grows, before it is built.
		if size += int64(len(parts[i])) + int64(len(sep)); size > b.lim.MaxBytes {
			return Undefined(), b.str(size)
		}
	}
	if err := b.str(size); err != nil {
		return Undefined(), err
	}
	return NewString(strings.Join(parts, sep)), nil
}

func filterTrim(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}
	s, err := b.print(args[0])
	if err != nil {
		return Undefined(), err
	}
	if err := b.scan(len(s)); err != nil {
		return Undefined(), err
	}
	if len(args) > 1 {
		chars, err := b.print(args[1])
		if err != nil {
			return Undefined(), err
		}
		if err := b.scan(len(chars)); err != nil {
			return Undefined(), err
		}
		s = strings.Trim(s, chars)
	} else {
		s = strings.TrimSpace(s)
	}
	return NewString(s), nil
}

// stringFilter is a filter of its argument's text by f (whose result is
// at most three times as long: see mapString).
func stringFilter(f func(string) string) builtinFunc {
	return func(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
		if len(args) == 0 {
			return NewString(""), nil
		}
		s, err := b.print(args[0])
		if err != nil {
			return Undefined(), err
		}
		return builder{b}.mapString(s, f)
	}
}

var (
	filterLower = stringFilter(strings.ToLower)
	filterUpper = stringFilter(strings.ToUpper)
	filterTitle = stringFilter(func(s string) string {
		runes := []rune(s)
		inWord := false
		for i, r := range runes {
			if unicode.IsLetter(r) || unicode.IsDigit(r) {
				if !inWord {
					runes[i] = unicode.ToUpper(r)
					inWord = true
				} else {
					runes[i] = unicode.ToLower(r)
				}
			} else {
				inWord = false
			}
		}
		return string(runes)
	})
	filterCapitalize = stringFilter(func(s string) string {
		if len(s) == 0 {
			return ""
		}
		runes := []rune(s)
		runes[0] = unicode.ToUpper(runes[0])
		for i := 1; i < len(runes); i++ {
			runes[i] = unicode.ToLower(runes[i])
		}
		return string(runes)
	})
)

func filterReplace(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) < 3 {
		return NewString(""), fmt.Errorf("replace: expected at least 3 arguments")
	}
	s, err := b.print(args[0])
	if err != nil {
		return Undefined(), err
	}

	count := int64(-1)
	if len(args) > 3 {
		count = toInt64(args[3])
	}
	if c, ok := kwargs["count"]; ok {
		count = toInt64(c)
	}

	return builder{b}.replace(s, args[1], args[2], count)
}

func filterIndent(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}

	s, err := b.print(args[0])
	if err != nil {
		return Undefined(), err
	}
	width := int64(4)
	if len(args) > 1 {
		width = toInt64(args[1])
	}
	if w, ok := kwargs["width"]; ok {
		width = toInt64(w)
	}
	width = max(width, 0)

	indentFirst := false
	if len(args) > 2 {
		indentFirst = args[2].IsTruthy()
	}
	if f, ok := kwargs["first"]; ok {
		indentFirst = f.IsTruthy()
	}

	// The indented size, checked before it is built: every line that is
	// not empty grows by width. The lines are not split into a slice (4
	// MiB of newlines made 64 MiB of it): the text is read twice, and
	// written once, into a string of the size checked. A line costs time
	// besides its bytes: a step per four.
	if err := b.scan(len(s)); err != nil {
		return Undefined(), err
	}
	lines, grown := int64(0), int64(0)
	for rest, first := s, true; ; first = false {
		line, after, more := strings.Cut(rest, "\n")
		lines++
		if line != "" && (!first || indentFirst) {
			grown++
		}
		if !more {
			break
		}
		rest = after
	}
	if err := b.step(lines / 4); err != nil {
		return Undefined(), err
	}
	size := int64(len(s)) + mulSat(grown, width)
	if err := b.str(size); err != nil {
		return Undefined(), err
	}
	if grown == 0 { // nothing to indent (whatever the width)
		return NewString(s), nil
	}

	// width*grown fits the size checked: the pad does too.
	if err := b.build(width); err != nil {
		return Undefined(), err
	}
	pad := strings.Repeat(" ", int(width))
	var sb strings.Builder
	sb.Grow(int(size))
	for rest, first := s, true; ; first = false {
		line, after, more := strings.Cut(rest, "\n")
		if line != "" && (!first || indentFirst) {
			sb.WriteString(pad)
		}
		sb.WriteString(line)
		if !more {
			break
		}
		sb.WriteByte('\n')
		rest = after
	}
	return NewString(sb.String()), nil
}

func filterWordcount(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewInt(0), nil
	}
	s, err := b.print(args[0])
	if err != nil {
		return Undefined(), err
	}
	if err := b.scan(len(s)); err != nil {
		return Undefined(), err
	}
	return NewInt(int64(countFields(s))), nil
}

var htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#39;")

func filterEscape(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}
	s, err := b.print(args[0])
	if err != nil {
		return Undefined(), err
	}
	// The escaped size, checked before it is built.
	if err := b.scan(len(s)); err != nil {
		return Undefined(), err
	}
	size := int64(len(s))
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '&', '"', '\'':
			size += 4
		case '<', '>':
			size += 3
		}
	}
	if err := b.str(size); err != nil {
		return Undefined(), err
	}
	return NewString(htmlEscaper.Replace(s)), nil
}
