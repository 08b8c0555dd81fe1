package wire

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var wireCases = []struct {
	body string
	fast bool // parseWire reads it itself rather than falling back
}{
	{`{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}`, true},
	{` { "id" : "r1" , "parameters" : {"priority":2,"timeout":100,"x":{"y":[null,true,"\u00e9"]}} , "inputs" : [ {"name":"a","shape":[-1, 0,-0,123456789012345678],"datatype":"BYTES","data":["a\"b",["c"]],"parameters":{}} ] , "outputs":[{"name":"o","parameters":{"binary_data":true}},{"name":"p"}] } `, true},
	{`{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,4],"parameters":{"binary_data_size":16}}],"outputs":[{"name":"probabilities","parameters":{"binary_data":true}}]}`, true},
	{`{"inputs":[],"outputs":[],"other":{"deep":[[[1.5e-3]]]},"more":"x\\y"}`, true},
	{`{"inputs":[{"name":"a","shape":[],"data":-0.5E+2}]}`, true},
	{`{"parameters":{"timeout":1,"timeout":2},"inputs":[{"name":"a","parameters":{"k":1,"k":[2]}}]}`, true}, // the last wins, as in a map

	// Everything below falls back to encoding/json.
	{`{"Inputs":[{"name":"a"}]}`, false},                                // another case
	{`{"inputs":[{"NAME":"a"}]}`, false},                                // another case
	{`{"inputs":[{"name":"a"}],"inputs":[]}`, false},                    // repeated
	{`{"inputs":[{"name":"a","name":"b"}]}`, false},                     // repeated
	{`{"id":"\u0041"}`, false},                                          // escape
	{`{"id":"é"}`, false},                                               // non-ASCII
	{`{"id":1}`, false},                                                 // wrong type
	{`{"id":null}`, false},                                              // null
	{`{"parameters":null}`, false},                                      // null
	{`{"inputs":[{"name":"a","data":null}]}`, false},                    // null
	{`{"inputs":[{"name":"a","shape":[1.0]}]}`, false},                  // fraction
	{`{"inputs":[{"name":"a","shape":[1e3]}]}`, false},                  // exponent
	{`{"inputs":[{"name":"a","shape":[99999999999999999999]}]}`, false}, // overflow
	{`{"inputs":[{"name":"a","shape":[01]}]}`, false},                   // malformed
	{`{"inputs":[{"name":"a","data":[1,]}]}`, false},                    // malformed
	{`{"inputs":[{"name":"a","data":[NaN]}]}`, false},                   // malformed
	{`{"inputs":[{"name":"a","data":"tab	here"}]}`, false},              // control character
	{`{"inputs":[{"name":"a"}]} x`, false},                              // trailing
	{`{"inputs":[{"name":"a"}]`, false},                                 // truncated
	{`{"x":"\q"}`, false},                                               // bad escape
	{`{"x":"\u12"}`, false},                                             // bad escape
	{`[1]`, false},                                                      // not an object
	{``, false},                                                         // empty
	{`{"\u0069nputs":[]}`, false},                                       // escaped key
	{`{"x":` + deepArray(100) + `}`, false},                             // too deep to skip here
}

// testLimits are wide enough for every case above.
var testLimits = wireLimits{inputs: 4, outputs: 4}

func deepArray(n int) string {
	b := make([]byte, 0, 2*n)
	for range n {
		b = append(b, '[')
	}
	for range n {
		b = append(b, ']')
	}
	return string(b)
}

// parseWire reads the common forms itself, and whatever it reads it reads
// exactly as encoding/json does.
func TestParseWireAgreesWithEncodingJSON(t *testing.T) {
	for _, c := range wireCases {
		var fast WireRequest
		ok := parseWire([]byte(c.body), &fast, testLimits)
		assert.Equal(t, c.fast, ok, "fast path for %s", c.body)
		if ok {
			var slow WireRequest
			require.NoError(t, json.Unmarshal([]byte(c.body), &slow), c.body)
			assert.Equal(t, slow, asMaps(fast), c.body)
		}
	}
}

// asMaps turns parseWire's parameter pairs into the maps encoding/json
// fills, so that the two decodings compare.
func asMaps(wr WireRequest) WireRequest {
	toMap := func(pairs ParamPairs) map[string]json.RawMessage {
		if pairs == nil {
			return nil
		}
		m := map[string]json.RawMessage{}
		for _, p := range pairs {
			m[p.Key] = p.Raw
		}
		return m
	}
	wr.Parameters, wr.Pairs = toMap(wr.Pairs), nil
	for i := range wr.Inputs {
		wr.Inputs[i].Parameters, wr.Inputs[i].Pairs = toMap(wr.Inputs[i].Pairs), nil
	}
	for i := range wr.Outputs {
		wr.Outputs[i].Parameters, wr.Outputs[i].Pairs = toMap(wr.Outputs[i].Pairs), nil
	}
	return wr
}

// FuzzParseWire: on any input parseWire accepts, encoding/json accepts it
// too and decodes the same request.
func FuzzParseWire(f *testing.F) {
	for _, c := range wireCases {
		f.Add([]byte(c.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var fast WireRequest
		if !parseWire(body, &fast, testLimits) {
			return
		}
		var slow WireRequest
		if err := json.Unmarshal(body, &slow); err != nil {
			t.Fatalf("parseWire accepted what encoding/json refuses (%v): %q", err, body)
		}
		if fast = asMaps(fast); !assert.ObjectsAreEqual(slow, fast) {
			t.Fatalf("decoded differently:\nencoding/json %+v\nparseWire     %+v\nbody %q", slow, fast, body)
		}
	})
}
