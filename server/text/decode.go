package text

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/wire"
)

// A text API's JSON body, decoded within the in-flight budget.

// decodeJSON decodes a request body into v with encoding/json, once the
// most it may build is charged: the body again, and a string header and
// a slice's share for every string it may hold (at most one per two
// quotes), so that a body of many tiny strings costs the server its
// budget, not more.
// field names the body's texts in the message of a texts field that does
// not decode.
func (t *Request) DecodeJSON(body []byte, v any, field string) error {
	return t.decode(body, v, field, false)
}

// decodeStrict is decodeJSON refusing keys v does not have, by name.
func (t *Request) DecodeStrict(body []byte, v any) error {
	return t.decode(body, v, "", true)
}

// decodeIDs is decodeJSON for a body of token ids (/decode's): each
// value is charged as an int64 or a list's header in a slice that doubles
// as it grows, and their number is bounded by the body's limit alone (a
// sequence is hundreds of ids).
// field names the ids in the message of an ids field that does not
// decode.
func (t *Request) DecodeIDs(body []byte, v any, field string) error {
	const perValue = 32
	return t.decodeCharged(body, v, field, false, perValue, math.MaxInt)
}

func (t *Request) decode(body []byte, v any, field string, strict bool) error {
	// What decoding builds is bounded before it is built: every JSON value
	// (a string, a null, an empty object) may become a header of up to 48
	// bytes in a slice that doubles as it grows, whatever its own length.
	// No request of these APIs needs more values than its texts (2048, or
	// 2048 pairs) and a few keys, so more is refused unread.
	const perValue = 48
	return t.decodeCharged(body, v, field, strict, perValue, maxTextValues)
}

// decodeCharged decodes body into v once len(body) and perValue bytes for
// each of its JSON values are charged, refusing more than maxValues.
func (t *Request) decodeCharged(body []byte, v any, field string, strict bool, perValue int64, maxValues int) error {
	values, most, mostN := jsonValues(body)
	if values > maxValues {
		where, field := "", string(most)
		if field != "" {
			where = fmt.Sprintf(" (%s holds %d)", apierr.ClipName(field), mostN)
		}
		return WithParam(field, &apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf(
			"the request holds more than %d JSON values%s; a request sends at most %d texts (or pairs): split it", maxValues, where, MaxClientBatch)})
	}
	if err := t.Take(int64(len(body))+perValue*int64(values+1), "decoding the request"); err != nil {
		return err
	}
	if !utf8.Valid(body) {
		return apierr.BadRequest("the request body is not valid UTF-8")
	}
	var err error
	if strict {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err = dec.Decode(v); err == nil && dec.More() {
			err = errors.New("the body holds more than one JSON value")
		}
		if err != nil && strings.HasPrefix(err.Error(), "json: unknown field ") {
			name, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
			return WithParam(name, apierr.BadRequest(fmt.Sprintf("unknown parameter %q; see the API's reference for the parameters stepserve takes", apierr.ClipName(name))))
		}
	} else {
		err = json.Unmarshal(body, v)
	}
	var typ *json.UnmarshalTypeError
	if strict && errors.As(err, &typ) && typ.Field != "" {
		// The embedded struct's name is not the client's: the last
		// segment of the path is the parameter.
		name := typ.Field
		if i := strings.LastIndexByte(name, '.'); i >= 0 && strings.HasPrefix(name, "openaiSampling.") {
			name = name[i+1:]
		}
		typ.Field = name
		param := name
		if i := strings.IndexByte(param, '.'); i >= 0 {
			param = param[:i]
		}
		return WithParam(param, apierr.BadRequest(wire.JSONErrorMessage(body, typ)))
	}
	if err != nil {
		var te *TextsError
		if errors.As(err, &te) {
			return apierr.BadRequest(field + ": " + te.Msg)
		}
		return apierr.BadRequest(wire.JSONErrorMessage(body, err))
	}
	return nil
}

// maxTextValues bounds the JSON values of a text API request: 2048 pairs
// (three values each) and room for the other keys.
const maxTextValues = 3*MaxClientBatch + 1024

// jsonValues counts the values in a JSON document, as the elements and
// members its arrays and objects hold (a comma or an opening bracket each,
// outside strings), in one pass: a bound, not a parse. It also returns
// the top-level key whose value holds the most of them (a span of b), and
// how many, so that a refusal can name the field at fault.
func jsonValues(b []byte) (n int, most []byte, mostN int) {
	inString := false
	depth, cur := 0, 0
	// The current top-level key and the one holding the most values, as
	// spans of b: a string is built only for the one a refusal names.
	key, mostKey := [2]int{}, [2]int{}
	keyStart, expectKey := -1, false
	endKey := func() {
		if cur > mostN {
			mostKey, mostN = key, cur
		}
		cur = 0
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inString:
			if c == '\\' {
				i++
			} else if c == '"' {
				inString = false
				if keyStart >= 0 {
					key, keyStart = [2]int{keyStart, i}, -1
				}
			}
		case c == '"':
			inString = true
			if depth == 1 && expectKey {
				keyStart, expectKey = i+1, false
			}
		case c == '[' || c == '{':
			n++
			if depth >= 1 {
				cur++
			}
			depth++
			expectKey = depth == 1 && c == '{'
		case c == ',':
			n++
			if depth >= 2 {
				cur++
			}
			if depth == 1 {
				endKey()
				expectKey = true
			}
		case c == ']' || c == '}':
			depth--
			if depth == 0 {
				endKey()
			}
		}
	}
	return n, b[mostKey[0]:mostKey[1]], mostN
}

// StringOrList is a JSON string or an array of strings, the two forms both
// APIs take their texts in. An array of numbers (token ids) is refused
// with its own error.
type StringOrList struct {
	List []string
	Set  bool
}

// TextsError is a texts field that is neither a string nor an array of
// strings; decodeJSON names the field.
type TextsError struct{ Msg string }

func (e *TextsError) Error() string { return e.Msg }

var ErrTokenIDs = &TextsError{"token id arrays are not supported; send the text"}

func (s *StringOrList) UnmarshalJSON(b []byte) error {
	s.Set = true
	b = bytes.TrimLeft(b, " \t\r\n")
	switch {
	case len(b) > 0 && b[0] == '"':
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return &TextsError{"want a string or an array of strings"}
		}
		s.List = []string{one}
		return nil
	case len(b) > 0 && b[0] == '[':
		if rest := bytes.TrimLeft(b[1:], " \t\r\n"); len(rest) > 0 && (rest[0] == '-' || rest[0] == '[' || '0' <= rest[0] && rest[0] <= '9') {
			return ErrTokenIDs
		}
		var list []string
		if err := json.Unmarshal(b, &list); err != nil {
			return &TextsError{"want a string or an array of strings"}
		}
		if list == nil {
			list = []string{}
		}
		s.List = list
		return nil
	case bytes.Equal(b, []byte("null")):
		s.Set = false
		return nil
	}
	return &TextsError{"want a string or an array of strings"}
}
