package grpcapi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/stepserve/stepserve/server/inferencepb"
)

// The walk counts what decoding builds, and its bound on the decoded size
// is above what the decoded message holds (protoRequestBytes, what the
// budget is charged after decoding), for every kind of field.
func TestScanInferRequestBoundsTheDecodedMessage(t *testing.T) {
	param := &inferencepb.InferParameter{ParameterChoice: &inferencepb.InferParameter_Int64Param{Int64Param: 7}}
	for name, r := range map[string]*inferencepb.ModelInferRequest{
		"empty": {},
		"typed": {ModelName: "m", ModelVersion: "2", Id: "req", Parameters: map[string]*inferencepb.InferParameter{"priority": param},
			Inputs: []*inferencepb.ModelInferRequest_InferInputTensor{
				{Name: "x", Datatype: "INT64", Shape: []int64{2, 3}, Parameters: map[string]*inferencepb.InferParameter{"a": param},
					Contents: &inferencepb.InferTensorContents{Int64Contents: []int64{0, 1, 2, 3, 4, 1 << 40}}},
				{Name: "s", Datatype: "BYTES", Shape: []int64{2}, Contents: &inferencepb.InferTensorContents{BytesContents: [][]byte{nil, []byte("hello")}}},
				{Name: "b", Datatype: "BOOL", Shape: []int64{3}, Contents: &inferencepb.InferTensorContents{BoolContents: []bool{true, false, true}}},
				{Name: "f", Datatype: "FP32", Shape: []int64{1}, Contents: &inferencepb.InferTensorContents{Fp32Contents: []float32{1}, Fp64Contents: []float64{2}, IntContents: []int32{3}, UintContents: []uint32{4}, Uint64Contents: []uint64{5}}},
			},
			Outputs: []*inferencepb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: map[string]*inferencepb.InferParameter{"binary_data": param}}}},
		"raw": {ModelName: "m", Inputs: []*inferencepb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 4}}},
			RawInputContents: [][]byte{make([]byte, 16)}},
		"many small": {ModelName: "m", Inputs: make([]*inferencepb.ModelInferRequest_InferInputTensor, 50)},
	} {
		for i := range r.Inputs {
			if r.Inputs[i] == nil {
				r.Inputs[i] = &inferencepb.ModelInferRequest_InferInputTensor{}
			}
		}
		b, err := proto.Marshal(r)
		require.NoError(t, err)
		sc, err := scanInferRequest(b, 1<<24)
		require.NoError(t, err, name)
		assert.Equal(t, r.GetModelName(), sc.model, name)
		assert.Equal(t, r.GetModelVersion(), sc.version, name)
		assert.Equal(t, len(r.GetInputs()), sc.inputs, name)
		assert.Equal(t, len(r.GetOutputs()), sc.outputs, name)
		assert.Equal(t, len(r.GetRawInputContents()), sc.raw, name)
		assert.GreaterOrEqual(t, sc.decoded, protoRequestBytes(r), "%s: the walk's bound covers what the budget charges after decoding", name)
	}
}

// Counts far past any request's are refused before decoding; bytes that
// are not protobuf are left to the decoder to describe.
func TestScanInferRequestRefuses(t *testing.T) {
	many := func(n int, f func(r *inferencepb.ModelInferRequest)) []byte {
		r := &inferencepb.ModelInferRequest{ModelName: "m"}
		for range n {
			f(r)
		}
		b, err := proto.Marshal(r)
		require.NoError(t, err)
		return b
	}
	param := &inferencepb.InferParameter{}
	for name, tc := range map[string]struct {
		b    []byte
		want string
	}{
		"parameters": {many(1, func(r *inferencepb.ModelInferRequest) {
			r.Parameters = map[string]*inferencepb.InferParameter{}
			for i := range pbMaxParameters + 1 {
				r.Parameters[string(rune('a'+i%26))+string(rune(i))] = param
			}
		}), "the request's parameters have more than 1024 entries"},
		"shape": {many(1, func(r *inferencepb.ModelInferRequest) {
			r.Inputs = append(r.Inputs, &inferencepb.ModelInferRequest_InferInputTensor{Shape: make([]int64, pbMaxRank+1)})
		}), "an input's shape has more than 256 dimensions"},
		"contents": {many(1, func(r *inferencepb.ModelInferRequest) {
			r.Inputs = append(r.Inputs, &inferencepb.ModelInferRequest_InferInputTensor{Contents: &inferencepb.InferTensorContents{Fp32Contents: make([]float32, 101)}})
		}), "the inputs' contents hold more than 100 values, the limit (server.max_request_elements)"},
	} {
		sc, err := scanInferRequest(tc.b, 100)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), tc.want, name)
		assert.Equal(t, "m", sc.model, "%s: the model's name is read all the same", name)
	}
	_, err := scanInferRequest([]byte{0x2a, 0x05, 0x00}, 100) // a length past the end
	assert.ErrorIs(t, err, errProtoMalformed)
}
