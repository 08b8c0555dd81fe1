package tei

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The cut itself: whole characters, within the bucket, either side.
func TestCutToTokens(t *testing.T) {
	long := strings.Repeat("héllo 😀😀 wörld 日本語のテキスト ", 40)
	m, err := models.Load("../../model_repository/tiny-encoder")
	require.NoError(t, err)
	for _, left := range []bool{true, false} {
		for _, maxSeq := range []int{5, 6, 7, 12, 24, 31, 32, 64} {
			cut, err := cutToTokens(m, long, maxSeq, left)
			require.NoError(t, err)
			assert.True(t, utf8.ValidString(cut), "left %v, %d tokens: %q", left, maxSeq, cut)
			ids, err := m.Tokenizer.AppendEncode(nil, cut, 1<<20, false)
			require.NoError(t, err)
			assert.LessOrEqual(t, len(ids), maxSeq, "left %v: %q", left, cut)
		}
	}
}

// Every error a TEI endpoint answers, in TEI's shape with TEI's status
// for its type.
func TestWriteTEIError(t *testing.T) {
	for _, tc := range []struct {
		err        error
		status     int // what core.StatusOf gives
		wantStatus int
		wantType   string
		retry      bool
	}{
		{&tokenizerError{errors.New("bad text")}, 500, 422, "Tokenizer", false},
		{text.EmptyRequest("inputs is empty"), 400, 400, "Empty", false},
		{fmt.Errorf("element 0: %w", models.ErrInput), 400, 413, "Validation", false},
		{apierr.BadRequest("inputs: want a string"), 400, 422, "Validation", false},
		{&apierr.Error{Status: 413, Msg: "too many"}, 413, 413, "Validation", false},
		{apierr.NotFound("unknown model"), 404, 404, "Validation", false},
		{notAvailable("embed_all is not available"), 424, 424, "Backend", false},
		{core.NotReady("m"), 503, 503, "Unhealthy", true},
		{serving.ErrQueueFull, 503, 429, "Overloaded", true},
		{errors.New("deadline"), 504, 429, "Overloaded", true},
		{errors.New("engine failed"), 500, 424, "Backend", false},
	} {
		w := httptest.NewRecorder()
		writeTEIError(w, tc.status, tc.err)
		assert.Equal(t, tc.wantStatus, w.Code, tc.err.Error())
		var e struct {
			Error     string `json:"error"`
			ErrorType string `json:"error_type"`
		}
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e), w.Body.String())
		assert.Equal(t, tc.wantType, e.ErrorType, tc.err.Error())
		assert.Equal(t, tc.err.Error(), e.Error)
		assert.Equal(t, tc.retry, w.Header().Get("Retry-After") == "1", tc.err.Error())
	}
	w := httptest.NewRecorder()
	writeTEIError(w, core.StatusClientClosed, errors.New("gone"))
	assert.Empty(t, w.Body.Bytes(), "nobody is listening")
}

// /decode's ids: one list, or a list of lists; anything else, nulls
// included, is refused.
func TestTokenIDs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want [][]int64
	}{
		{`[101, 7592, 102]`, [][]int64{{101, 7592, 102}}},
		{` [ [1,2], [], [3] ]`, [][]int64{{1, 2}, {}, {3}}},
		{`[]`, [][]int64{{}}},
		{`[-1]`, [][]int64{{-1}}}, // refused by the handler, which knows the vocabulary
	} {
		var p tokenIDs
		require.NoError(t, json.Unmarshal([]byte(tc.in), &p), tc.in)
		assert.True(t, p.set)
		assert.Equal(t, tc.want, p.lists, tc.in)
	}
	for _, in := range []string{`"1 2"`, `{"a":1}`, `5`, `[1,[2]]`, `[[1],2]`, `[1.5]`, `["1"]`, `[1,null]`, `[[1],null]`, `[[null]]`, `[1e40]`} {
		var p tokenIDs
		err := json.Unmarshal([]byte(in), &p)
		var te *text.TextsError
		assert.True(t, errors.As(err, &te), "%s: %v", in, err)
	}
	var p tokenIDs
	require.NoError(t, json.Unmarshal([]byte(`null`), &p))
	assert.False(t, p.set, "null is absent")
}

func TestCosine(t *testing.T) {
	for _, tc := range []struct {
		a, b []float32
		want float64
	}{
		{[]float32{1, 2, 3}, []float32{1, 2, 3}, 1},
		{[]float32{1, 2, 3}, []float32{2, 4, 6}, 1}, // not normalized: the same direction
		{[]float32{1, 0}, []float32{0, 5}, 0},
		{[]float32{1, 1}, []float32{-1, -1}, -1},
		{[]float32{3, 4}, []float32{4, 3}, 24.0 / 25},
		{[]float32{0, 0}, []float32{1, 0}, 0}, // the zero vector has no direction
	} {
		assert.InDelta(t, tc.want, float64(cosine(tc.a, tc.b)), 1e-7, "%v %v", tc.a, tc.b)
	}
}

// POST / sends an embedding model's body to /similarity when its inputs
// is an object, and only then.
func TestObjectProbe(t *testing.T) {
	for in, want := range map[string]bool{`{"a":1}`: true, ` {}`: true, `"text"`: false, `["a"]`: false, `null`: false} {
		var p struct {
			Inputs objectProbe `json:"inputs"`
		}
		require.NoError(t, json.Unmarshal([]byte(`{"inputs":`+in+`}`), &p), in)
		assert.Equal(t, want, p.Inputs.object, in)
	}
}
