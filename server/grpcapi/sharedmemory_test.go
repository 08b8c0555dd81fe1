package grpcapi

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/stepserve/stepserve/server/inferencepb"
)

// A stream's tensors travel in its messages: one that names a
// shared-memory region is refused, naming the tensor and ModelInfer.
func TestStreamRefusesSharedMemory(t *testing.T) {
	region := map[string]*inferencepb.InferParameter{
		"shared_memory_region": {ParameterChoice: &inferencepb.InferParameter_StringParam{StringParam: "r"}}}
	assert.NoError(t, refuseStreamSharedMemory(&inferencepb.ModelInferRequest{
		Inputs: []*inferencepb.ModelInferRequest_InferInputTensor{{Name: "text_input"}}}))
	err := refuseStreamSharedMemory(&inferencepb.ModelInferRequest{
		Inputs: []*inferencepb.ModelInferRequest_InferInputTensor{{Name: "text_input", Parameters: region}}})
	assert.EqualError(t, err, "input text_input: ModelStreamInfer takes its inputs in the message, not in shared memory; ModelInfer serves tensors in shared memory")
	err = refuseStreamSharedMemory(&inferencepb.ModelInferRequest{
		Outputs: []*inferencepb.ModelInferRequest_InferRequestedOutputTensor{{Name: "text_output", Parameters: region}}})
	assert.EqualError(t, err, "output text_output: ModelStreamInfer answers in its messages, not in shared memory; ModelInfer serves tensors in shared memory")
}
