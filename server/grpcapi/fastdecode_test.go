package grpcapi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// A plain request decodes as protobuf decodes it, its raw contents
// aliasing the message; anything more is left to protobuf.
func TestDecodePlain(t *testing.T) {
	plain := &pb.ModelInferRequest{ModelName: "digits", ModelVersion: "1", Id: "req-7",
		Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "pixels", Datatype: "FP32", Shape: []int64{2, 64}},
			{Name: "mask", Datatype: "INT64", Shape: []int64{-1, 0, 1 << 40}}},
		Outputs:          []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "probabilities"}, {}},
		RawInputContents: [][]byte{make([]byte, 512), {1, 2, 3}}}
	b, err := proto.Marshal(plain)
	require.NoError(t, err)
	got, ok := decodePlain(b)
	require.True(t, ok)
	assert.True(t, proto.Equal(plain, got), "decoded as protobuf decodes it:\n%v\n%v", plain, got)
	got.RawInputContents[1][0] = 9
	assert.Contains(t, string(b), "\x09\x02\x03", "raw contents alias the message")

	// An unpacked shape, as some encoders write repeated scalars.
	var unpacked []byte
	unpacked = protowire.AppendTag(unpacked, 1, protowire.BytesType)
	unpacked = protowire.AppendString(unpacked, "x")
	unpacked = protowire.AppendTag(unpacked, pbInputShape, protowire.VarintType)
	unpacked = protowire.AppendVarint(unpacked, 3)
	unpacked = protowire.AppendTag(unpacked, pbInputShape, protowire.VarintType)
	unpacked = protowire.AppendVarint(unpacked, uint64(1<<64-1)) // -1
	msg := protowire.AppendTag(nil, pbRequestInputs, protowire.BytesType)
	msg = protowire.AppendBytes(msg, unpacked)
	got, ok = decodePlain(msg)
	require.True(t, ok)
	assert.Equal(t, []int64{3, -1}, got.Inputs[0].Shape)

	str := func(s string) *pb.InferParameter {
		return &pb.InferParameter{ParameterChoice: &pb.InferParameter_StringParam{StringParam: s}}
	}
	params := map[string]*pb.InferParameter{"s": str("r"), "i": {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: -5}},
		"b": {ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: true}}, "d": {ParameterChoice: &pb.InferParameter_DoubleParam{DoubleParam: 0.25}},
		"u": {ParameterChoice: &pb.InferParameter_Uint64Param{Uint64Param: 1 << 63}}, "empty": {}}
	withParams := &pb.ModelInferRequest{ModelName: "m", Parameters: params,
		Inputs:  []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Shape: []int64{1}, Parameters: params}},
		Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: params}}}
	b, err = proto.Marshal(withParams)
	require.NoError(t, err)
	got, ok = decodePlain(b)
	require.True(t, ok)
	assert.True(t, proto.Equal(withParams, got), "parameters of every kind:\n%v\n%v", withParams, got)

	for name, m := range map[string]*pb.ModelInferRequest{
		"typed contents":              {ModelName: "m", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Contents: &pb.InferTensorContents{Fp32Contents: []float32{1}}}}},
		"a parameter without its key": {ModelName: "m", Parameters: map[string]*pb.InferParameter{"": str("1")}},
	} {
		b, err := proto.Marshal(m)
		require.NoError(t, err)
		_, ok := decodePlain(b)
		assert.False(t, ok, "%s: left to protobuf", name)
	}
	bad := protowire.AppendTag(nil, pbRequestModelName, protowire.BytesType)
	bad = protowire.AppendBytes(bad, []byte{0xff, 0xfe})
	_, ok = decodePlain(bad)
	assert.False(t, ok, "a model name that is not UTF-8: protobuf's refusal")
	_, ok = decodePlain([]byte{0x0a, 0x05, 'a'})
	assert.False(t, ok, "truncated")
	_, ok = decodePlain(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	assert.False(t, ok, "an unknown field")
}

// Whatever decodePlain accepts, protobuf decodes to the same message.
func FuzzDecodePlain(f *testing.F) {
	for _, m := range []*pb.ModelInferRequest{
		{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "pixels", Datatype: "FP32", Shape: []int64{1, 64}}}, RawInputContents: [][]byte{{1, 2, 3, 4}}},
		{ModelName: "m", Id: "x", Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y"}}},
		{ModelName: "m", Parameters: map[string]*pb.InferParameter{"priority": {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: 2}}},
			Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: map[string]*pb.InferParameter{"binary_data": {ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: true}}}}}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := decodePlain(b)
		if !ok {
			return
		}
		want := new(pb.ModelInferRequest)
		if err := proto.Unmarshal(b, want); err != nil {
			t.Fatalf("decodePlain accepted what protobuf refuses (%v): %x", err, b)
		}
		if !proto.Equal(want, got) {
			t.Fatalf("decoded differently:\nprotobuf %v\nplain    %v", want, got)
		}
	})
}
