package main

// Hostile clients of gRPC's ModelStreamInfer against the real binary
// under a 4 GiB address-space cap and the default configuration: a stream
// of requests with huge ids whose responses are never read, a client that
// never reads its responses, and a crowd of idle streams. Each once took
// the server down or shut generation off for everyone; now each is cut or
// refused while other clients are served, and the server's memory stays
// under the cap.

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"

	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// streamCap is the address space the stream attacks' servers get, as the
// red team ran them.
const streamCap = 4 << 30

// genStreamRequest is a ModelStreamInfer generation on tiny-llama.
func genStreamRequest(id, prompt string, maxTokens int64) *pb.ModelInferRequest {
	raw := binary.LittleEndian.AppendUint32(nil, uint32(len(prompt)))
	return &pb.ModelInferRequest{ModelName: "tiny-llama", Id: id,
		Parameters: map[string]*pb.InferParameter{
			"max_tokens": {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: maxTokens}},
			"ignore_eos": {ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: true}},
		},
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "text_input", Datatype: "BYTES", Shape: []int64{1}}},
		RawInputContents: [][]byte{append(raw, prompt...)}}
}

// notReading is a connection whose client takes at most 64 KiB of
// responses (gRPC's least window; fixed, so that it does not grow) before
// the server must wait for it to read.
func notReading(t *testing.T, p *process) pb.GRPCInferenceServiceClient {
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return pb.NewGRPCInferenceServiceClient(conn)
}

// streamGenerates runs one generation on a new stream of c and reports
// whether it ended with its final response and no error.
func streamGenerates(t *testing.T, c pb.GRPCInferenceServiceClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := c.ModelStreamInfer(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(genStreamRequest("other", "once upon a time", 4)))
	require.NoError(t, st.CloseSend())
	final := false
	for {
		r, err := st.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "another client's stream")
		require.Empty(t, r.GetErrorMessage())
		final = final || r.GetInferResponse().GetParameters()["triton_final_response"].GetBoolParam()
	}
	assert.True(t, final, "another client's generation ends with its final response")
}

// httpGenerates runs one completion over HTTP.
func httpGenerates(t *testing.T, p *process) {
	t.Helper()
	st, body, err := exchangeWithin(p.base+"/v1/completions", []byte(`{"model":"tiny-llama","prompt":"hi","max_tokens":4}`), time.Minute)
	require.NoError(t, err, "no answer: the server crashed or hung")
	assert.Equal(t, http.StatusOK, st, body)
}

var inflightRE = regexp.MustCompile(`(?m)^stepserve_inflight_bytes (\S+)$`)

// inflightBytes is what requests hold of the in-flight budget now.
func inflightBytes(t *testing.T, p *process) float64 {
	m := inflightRE.FindStringSubmatch(scrape(t, p.base))
	require.NotNil(t, m, "no stepserve_inflight_bytes in /metrics")
	v, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	return v
}

// 64 requests on one stream, each with a 56 MiB id and a long
// generation, responses never read: the ids are refused (an id is at most
// 256 bytes on every door), every byte a request holds is charged while
// it holds it, and the server stays under its cap serving others.
func TestHostileGRPCStreamHugeIDs(t *testing.T) {
	p := startCapped(t, streamCap, "--model_repository", generateRepo(t))
	c, _ := dialGRPC(t, p)
	attacker := notReading(t, p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := attacker.ModelStreamInfer(ctx)
	require.NoError(t, err)
	id := strings.Repeat("i", 56<<20)
	var sent atomic.Int32
	attack := make(chan error, 1)
	go func() {
		for i := range 64 {
			if err := st.Send(genStreamRequest(id+strconv.Itoa(i), "once upon a time", 900)); err != nil {
				attack <- err
				return
			}
			sent.Add(1)
		}
		attack <- nil
	}()
	// Others are served while the attack goes on.
	served := 0
	for done := false; !done; {
		select {
		case err := <-attack:
			require.NoError(t, err, "the server ended the attacker's stream before it sent its requests")
			done = true
		default:
			httpGenerates(t, p)
			streamGenerates(t, c)
			served++
		}
		require.True(t, p.alive(), "the server died")
	}
	t.Logf("%d requests of 56 MiB sent; %d rounds of other clients served meanwhile", sent.Load(), served)
	httpGenerates(t, p)
	streamGenerates(t, c)
	require.Eventually(t, func() bool { return inflightBytes(t, p) < 16<<20 }, time.Minute, 100*time.Millisecond,
		"the refused requests give their memory back")
	require.Eventually(t, func() bool {
		return generationGauge(t, p, "stepserve_generation_sequences", "running") == 0
	}, time.Minute, 50*time.Millisecond)
	peak := p.peakRSS(t)
	t.Logf("peak RSS %d MiB", peak>>20)
	assert.Less(t, peak, int64(streamCap), "peak RSS")
	assert.True(t, p.alive())
}

// Generations whose responses their client never reads hold none of the
// model's places once the loop has generated them, and their streams
// are ended 30 s after a response stopped going out: new
// generations, over HTTP and gRPC, are served all along (they were once
// refused "queue full" for as long as the stream stayed open).
func TestHostileGRPCStreamNotReading(t *testing.T) {
	repo := t.TempDir()
	dir := filepath.Join(repo, "tiny-llama")
	require.NoError(t, os.CopyFS(dir, os.DirFS("../../model_repository/tiny-llama")))
	yaml, err := os.ReadFile(filepath.Join(dir, "model.yaml"))
	require.NoError(t, err)
	// 64 places.
	yaml = []byte(strings.Replace(string(yaml), "  max_num_seqs: 16\n", "  max_num_seqs: 16\n  max_queue_size: 48\n", 1))
	require.Contains(t, string(yaml), "max_queue_size: 48")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), yaml, 0o644))
	p := startCapped(t, streamCap, "--model_repository", repo)
	c, _ := dialGRPC(t, p)
	attacker := notReading(t, p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Two streams of 64 generations: more than the model's places, even
	// once the first few have sent their responses into gRPC's buffers.
	attacked := time.Now()
	var held []pb.GRPCInferenceService_ModelStreamInferClient
	for s := range 2 {
		st, err := attacker.ModelStreamInfer(ctx)
		require.NoError(t, err)
		for i := range 64 {
			require.NoError(t, st.Send(genStreamRequest(fmt.Sprintf("held-%d-%d", s, i), "once upon a time", 64)))
		}
		held = append(held, st)
	}
	// The loop generates them all; their responses wait for the client.
	require.Eventually(t, func() bool {
		return generationGauge(t, p, "stepserve_generation_sequences", "running") == 0 &&
			generationGauge(t, p, "stepserve_generation_sequences", "waiting") == 0 &&
			generationGauge(t, p, "stepserve_generation_kv_cache_blocks", "used") == 0
	}, time.Minute, 50*time.Millisecond)
	for range 3 {
		httpGenerates(t, p)
		streamGenerates(t, c)
	}
	assert.NotContains(t, p.logs.String(), "did not read its responses", "served while the stream was held")
	// The server ends the stream: its charges come back.
	require.Eventually(t, func() bool { return strings.Contains(p.logs.String(), "did not read its responses") },
		2*time.Minute, 100*time.Millisecond, "the stream is ended")
	t.Logf("the stream was ended %s after its requests were sent", time.Since(attacked).Round(time.Second))
	// Its connection is closed with it: nothing more can be sent on the
	// ended streams into buffers the budget does not see.
	big := genStreamRequest("more", strings.Repeat("x", 1<<20), 1)
	require.Eventually(t, func() bool {
		for _, st := range held {
			if st.Send(big) == nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "the attacker's connection is closed")
	require.Eventually(t, func() bool { return inflightBytes(t, p) < 16<<20 }, time.Minute, 100*time.Millisecond,
		"the ended stream's generations give their memory back")
	httpGenerates(t, p)
	streamGenerates(t, c)
	peak := p.peakRSS(t)
	t.Logf("peak RSS %d MiB", peak>>20)
	assert.Less(t, peak, int64(streamCap), "peak RSS")
	assert.True(t, p.alive())
}

// Idle streams hold nothing but their flow-control windows: a crowd of
// them refuses no one (two once shut every other stream out under this
// cap), and each is ended after server.idle_timeout, saying so.
func TestHostileGRPCIdleStreams(t *testing.T) {
	p := startCapped(t, streamCap, "--model_repository", generateRepo(t), "--server.idle_timeout", "3s")
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	idle := pb.NewGRPCInferenceServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ends sync.WaitGroup
	ended := make(chan error, 16)
	for range 16 {
		st, err := idle.ModelStreamInfer(ctx)
		require.NoError(t, err)
		ends.Go(func() {
			_, err := st.Recv()
			ended <- err
		})
	}
	time.Sleep(500 * time.Millisecond) // the server has opened them all
	c, _ := dialGRPC(t, p)
	for range 3 {
		streamGenerates(t, c)
		httpGenerates(t, p)
	}
	ends.Wait()
	close(ended)
	for err := range ended {
		assert.Equal(t, codes.Unavailable, grpcstatus.Code(err), "%v", err)
		assert.Contains(t, grpcstatus.Convert(err).Message(), "server.idle_timeout")
	}
	streamGenerates(t, c)
	peak := p.peakRSS(t)
	t.Logf("16 idle streams ended after server.idle_timeout 3s; peak RSS %d MiB", peak>>20)
	assert.Less(t, peak, int64(streamCap), "peak RSS")
	assert.True(t, p.alive())
}
