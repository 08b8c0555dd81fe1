package wire

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/stepserve/stepserve/models"
)

func TestCheckLimits(t *testing.T) {
	m := sumMax(t)
	lim := limitsOf(m.Config)
	in := `{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}`
	params := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"k` + strconv.Itoa(i) + `":1`)
		}
		return "{" + b.String() + "}"
	}
	cases := []struct {
		body, err string
	}{
		{`{"inputs":[` + in + `]}`, ""},
		{`{"inputs":[` + in + `,` + in + `]}`, `input "x" appears more than once`},
		{`{"INPUTS":[` + in + `,{"name":"z"}]}`, `the request names more than 1 input; model summax takes "x" (FP32 [-1 3])`},
		{`{"\u0069nputs":[` + in + `,{"n\u0061me":"x"}]}`, `input "x" appears more than once`},
		{`{"inputs":null,"inputs":[` + in + `,{}]}`, "more than 1 input"},
		{`{"inputs":[` + in + `],"outputs":[{"name":"y"},{"name":"y"}]}`, `output "y" is requested more than once`},
		{`{"inputs":[` + in + `],"Outputs":[{"name":"y"},{"name":"w"}]}`, `the request names more than 1 output; model summax gives "y" (FP32 [-1 2])`},
		{`{"inputs":[{"name":"x","shape":[` + strings.Repeat("1,", 16) + `1]}]}`, "an input's shape has more than 16 dimensions"},
		{`{"inputs":[{"name":"x","shape":[` + strings.Repeat("1,", 15) + `1]}]}`, ""},
		{`{"parameters":` + params(65) + `,"inputs":[` + in + `]}`, "a parameters object has more than 64 entries"},
		{`{"parameters":` + params(64) + `,"inputs":[` + in + `]}`, ""},
		{`{"inputs":[{"name":"x","parameters":` + params(65) + `}]}`, "more than 64 entries"},
		{`{"x":` + deepArray(200) + `,"inputs":[` + in + `,` + in + `]}`, "appears more than once"},
		{`{"inputs":[` + in + `,` + in, "appears more than once"},
		{`{"inputs":[1}`, ""},                     // malformed: encoding/json says so
		{`{"inputs":[1,2]}`, "more than 1 input"}, // not objects, but two of them
	}
	for _, c := range cases {
		err := checkLimits([]byte(c.body), m, lim)
		var wr WireRequest
		fast := parseWire([]byte(c.body), &wr, lim)
		if c.err == "" {
			assert.NoError(t, err, c.body)
			continue
		}
		assert.ErrorContains(t, err, c.err, c.body)
		assert.Equal(t, http.StatusBadRequest, statusOf(err))
		assert.False(t, fast, "parseWire stops at the limit too: %s", c.body)
	}
}

// FuzzCheckLimits: whatever checkLimits lets through, encoding/json
// decodes into no more inputs, outputs, dimensions or parameters than the
// limits.
func FuzzCheckLimits(f *testing.F) {
	for _, c := range wireCases {
		f.Add([]byte(c.body))
	}
	f.Add([]byte(`{"inputs":[{"name":"x"},{"NAME":"x"}],"outputs":[{},{}]}`))
	m := &models.Model{Name: "m", Config: &models.Config{
		Inputs:  []models.TensorSpec{{Name: "x", Datatype: models.FP32, Shape: []int{-1, 3}}},
		Outputs: []models.TensorSpec{{Name: "y", Datatype: models.FP32, Shape: []int{-1, 2}}},
	}}
	lim := limitsOf(m.Config)
	f.Fuzz(func(t *testing.T, body []byte) {
		if checkLimits(body, m, lim) != nil {
			return
		}
		var wr WireRequest
		if json.Unmarshal(body, &wr) != nil {
			return
		}
		if len(wr.Inputs) > lim.inputs || len(wr.Outputs) > lim.outputs || len(wr.Parameters) > MaxParameters {
			t.Fatalf("let through %d inputs, %d outputs, %d parameters: %q", len(wr.Inputs), len(wr.Outputs), len(wr.Parameters), body)
		}
		for _, in := range wr.Inputs {
			if len(in.Shape) > MaxRank || len(in.Parameters) > MaxParameters {
				t.Fatalf("let through a shape of %d, %d parameters: %q", len(in.Shape), len(in.Parameters), body)
			}
		}
		for _, o := range wr.Outputs {
			if len(o.Parameters) > MaxParameters {
				t.Fatalf("let through %d output parameters: %q", len(o.Parameters), body)
			}
		}
	})
}
