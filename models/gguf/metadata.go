package gguf

import (
	"fmt"
	"math"

	"github.com/stepserve/stepserve/internal/clip"
)

// The accessors read a metadata key as Go wants it. ok is false when the
// key is absent; err (wrapping ErrMalformed) says the key holds a value of
// another type, or one out of range.

func (f *File) wrongType(key, want string) error {
	return fmt.Errorf("%w: metadata %q is %s; want %s", ErrMalformed, clip.Clip(key, maxErrName), typeName(f.Metadata[key]), want)
}

// Uint reads an integer key of any integer type, which must not be
// negative.
func (f *File) Uint(key string) (v uint64, ok bool, err error) {
	raw, ok := f.Metadata[key]
	if !ok {
		return 0, false, nil
	}
	var s int64
	switch x := raw.(type) {
	case uint8:
		return uint64(x), true, nil
	case uint16:
		return uint64(x), true, nil
	case uint32:
		return uint64(x), true, nil
	case uint64:
		return x, true, nil
	case int8:
		s = int64(x)
	case int16:
		s = int64(x)
	case int32:
		s = int64(x)
	case int64:
		s = x
	default:
		return 0, true, f.wrongType(key, "an integer")
	}
	if s < 0 {
		return 0, true, fmt.Errorf("%w: metadata %q is %d; want a count, at least 0", ErrMalformed, clip.Clip(key, maxErrName), s)
	}
	return uint64(s), true, nil
}

// Float reads a float32 or float64 key (an integer is taken too).
func (f *File) Float(key string) (v float64, ok bool, err error) {
	raw, ok := f.Metadata[key]
	if !ok {
		return 0, false, nil
	}
	switch x := raw.(type) {
	case float32:
		return float64(x), true, nil
	case float64:
		return x, true, nil
	}
	if u, _, err := f.Uint(key); err == nil {
		return float64(u), true, nil
	}
	return 0, true, f.wrongType(key, "a number")
}

// String reads a string key.
func (f *File) String(key string) (v string, ok bool, err error) {
	raw, ok := f.Metadata[key]
	if !ok {
		return "", false, nil
	}
	s, isStr := raw.(string)
	if !isStr {
		return "", true, f.wrongType(key, "string")
	}
	return s, true, nil
}

// Bool reads a bool key.
func (f *File) Bool(key string) (v bool, ok bool, err error) {
	raw, ok := f.Metadata[key]
	if !ok {
		return false, false, nil
	}
	b, isBool := raw.(bool)
	if !isBool {
		return false, true, f.wrongType(key, "bool")
	}
	return b, true, nil
}

// Strings reads an array of strings.
func (f *File) Strings(key string) (v []string, ok bool, err error) {
	raw, ok := f.Metadata[key]
	if !ok {
		return nil, false, nil
	}
	s, isStrs := raw.([]string)
	if !isStrs {
		return nil, true, f.wrongType(key, "an array of string")
	}
	return s, true, nil
}

// Float32s reads an array of numbers as float32 (float32 as stored,
// float64 and integers converted).
func (f *File) Float32s(key string) (v []float32, ok bool, err error) {
	raw, ok := f.Metadata[key]
	if !ok {
		return nil, false, nil
	}
	switch x := raw.(type) {
	case []float32:
		return x, true, nil
	case []float64:
		return convert(x, func(v float64) float32 { return float32(v) }), true, nil
	}
	if ints, _, err := f.Ints(key); err == nil {
		return convert(ints, func(v int64) float32 { return float32(v) }), true, nil
	}
	return nil, true, f.wrongType(key, "an array of float32")
}

// Ints reads an array of integers of any integer type as int64; a uint64
// above 2^63-1 is an error.
func (f *File) Ints(key string) (v []int64, ok bool, err error) {
	raw, ok := f.Metadata[key]
	if !ok {
		return nil, false, nil
	}
	switch x := raw.(type) {
	case []uint8:
		return convert(x, func(v uint8) int64 { return int64(v) }), true, nil
	case []int8:
		return convert(x, func(v int8) int64 { return int64(v) }), true, nil
	case []uint16:
		return convert(x, func(v uint16) int64 { return int64(v) }), true, nil
	case []int16:
		return convert(x, func(v int16) int64 { return int64(v) }), true, nil
	case []uint32:
		return convert(x, func(v uint32) int64 { return int64(v) }), true, nil
	case []int32:
		return convert(x, func(v int32) int64 { return int64(v) }), true, nil
	case []int64:
		return x, true, nil
	case []uint64:
		for i, u := range x {
			if u > math.MaxInt64 {
				return nil, true, fmt.Errorf("%w: metadata %q[%d] is %d; want under 2^63", ErrMalformed, clip.Clip(key, maxErrName), i, u)
			}
		}
		return convert(x, func(v uint64) int64 { return int64(v) }), true, nil
	}
	return nil, true, f.wrongType(key, "an array of integers")
}

func convert[S, T any](in []S, f func(S) T) []T {
	out := make([]T, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}
