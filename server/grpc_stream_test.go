package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// streamRequest is a ModelStreamInfer request as Triton's LLM clients
// send it: text_input raw, parameters beside it.
func streamRequest(id, prompt string, params map[string]*pb.InferParameter) *pb.ModelInferRequest {
	raw := binary.LittleEndian.AppendUint32(nil, uint32(len(prompt)))
	return &pb.ModelInferRequest{ModelName: "tiny-llama", Id: id, Parameters: params,
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "text_input", Datatype: "BYTES", Shape: []int64{1}}},
		RawInputContents: [][]byte{append(raw, prompt...)}}
}

func intParam(v int64) *pb.InferParameter {
	return &pb.InferParameter{ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: v}}
}

func boolParam(v bool) *pb.InferParameter {
	return &pb.InferParameter{ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: v}}
}

// streamText is a response's text_output.
func streamText(t *testing.T, r *pb.ModelInferResponse) string {
	t.Helper()
	if len(r.GetRawOutputContents()) == 0 {
		return ""
	}
	b := r.GetRawOutputContents()[0]
	require.GreaterOrEqual(t, len(b), 4)
	require.Equal(t, int(binary.LittleEndian.Uint32(b)), len(b)-4)
	return string(b[4:])
}

// ModelStreamInfer with Triton's decoupled semantics: requests on one
// stream run side by side, each answered piece by piece in order, the
// pieces together the text the HTTP API gives, the last flagged final
// (an empty final response when asked for); errors come as responses and
// the stream goes on.
func TestGRPCModelStreamInfer(t *testing.T) {
	f := newGenFixture(t, "")
	client, _ := grpcClients(t, f.s)
	_, b := f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0, "ignore_eos": true})
	want := decodeCompletion(t, b).Choices[0].Text

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := client.ModelStreamInfer(ctx)
	require.NoError(t, err)
	params := func(emptyFinal bool) map[string]*pb.InferParameter {
		return map[string]*pb.InferParameter{"max_tokens": intParam(20), "temperature": intParam(0), "ignore_eos": boolParam(true),
			"triton_enable_empty_final_response": boolParam(emptyFinal)}
	}
	require.NoError(t, stream.Send(streamRequest("a", "Once upon a time", params(false))))
	require.NoError(t, stream.Send(streamRequest("b", "Once upon a time", params(true))))
	require.NoError(t, stream.Send(&pb.ModelInferRequest{ModelName: "nope", Id: "c"}))
	bad := streamRequest("d", "Once upon a time", map[string]*pb.InferParameter{"beam_width": intParam(4)})
	require.NoError(t, stream.Send(bad))
	require.NoError(t, stream.CloseSend())

	text := map[string]string{}
	finals := map[string]int{}
	errs := map[string]string{}
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		resp := r.GetInferResponse()
		id := resp.GetId()
		if r.GetErrorMessage() != "" {
			errs[id] = r.GetErrorMessage()
			continue
		}
		require.Zero(t, finals[id], "a response after request %s's final one", id)
		assert.Equal(t, "tiny-llama", resp.GetModelName())
		text[id] += streamText(t, resp)
		if resp.GetParameters()["triton_final_response"].GetBoolParam() {
			finals[id]++
			if id == "b" {
				assert.Empty(t, resp.GetRawOutputContents(), "the empty final response asked for")
			}
			assert.Equal(t, "length", resp.GetParameters()["finish_reason"].GetStringParam())
		}
	}
	assert.Equal(t, want, text["a"])
	assert.Equal(t, want, text["b"])
	assert.Equal(t, map[string]int{"a": 1, "b": 1}, finals)
	assert.Contains(t, errs["c"], "nope")
	assert.Contains(t, errs["d"], "unknown parameter beam_width")
}

// A client that closes its stream mid-generation stops its sequences:
// their KV cache blocks come back.
func TestGRPCModelStreamInferCancel(t *testing.T) {
	f := newGenFixture(t, "")
	client, _ := grpcClients(t, f.s)
	// Steps run as the feeder lets them, a few a millisecond: slowly
	// enough that all three requests are running before the stream is
	// closed, whatever the scheduling.
	f.eng.gate = make(chan struct{})
	stopFeed, fed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(fed)
		for {
			select {
			case f.eng.gate <- struct{}{}:
				time.Sleep(time.Millisecond)
			case <-stopFeed:
				return
			}
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := client.ModelStreamInfer(ctx)
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, stream.Send(streamRequest(fmt.Sprint(i), "Once upon a time", map[string]*pb.InferParameter{
			"max_tokens": intParam(500), "temperature": intParam(0), "ignore_eos": boolParam(true)})))
	}
	// Every request has a piece: all three are running.
	seen := map[string]bool{}
	for len(seen) < 3 {
		r, err := stream.Recv()
		require.NoError(t, err, "pieces")
		seen[r.GetInferResponse().GetId()] = true
	}
	close(stopFeed)
	<-fed
	assert.Positive(t, metricValue(t, f.reg, "stepserve_generation_kv_cache_blocks", "used"))
	cancel()
	require.Eventually(t, func() bool {
		return metricValue(t, f.reg, "stepserve_generation_request_duration_seconds", "") == 3
	}, 10*time.Second, 5*time.Millisecond)
	close(f.eng.gate)
	require.Eventually(t, func() bool {
		return metricValue(t, f.reg, "stepserve_generation_kv_cache_blocks", "used") == 0
	}, 10*time.Second, 5*time.Millisecond)
	assert.Less(t, metricValue(t, f.reg, "stepserve_generation_generated_tokens_total", ""), 1500.0)
}

// A stream waits for its client's next request as long as the client
// keeps it open: server.read_timeout bounds a message's arrival, not the
// time between requests.
func TestGRPCModelStreamInferIdle(t *testing.T) {
	f := newGenFixture(t, "")
	s, err := New(Options{Models: f.set, Version: "test", ReadTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	client, _ := grpcClients(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := client.ModelStreamInfer(ctx)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // idle, past the read timeout
	require.NoError(t, stream.Send(streamRequest("late", "Once", map[string]*pb.InferParameter{"max_tokens": intParam(3), "ignore_eos": boolParam(true)})))
	require.NoError(t, stream.CloseSend())
	final := false
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		require.Empty(t, r.GetErrorMessage())
		final = final || r.GetInferResponse().GetParameters()["triton_final_response"].GetBoolParam()
	}
	assert.True(t, final)
}
