package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"

	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// dialGRPC connects to a server's gRPC API until the test ends.
func dialGRPC(t *testing.T, p *process) (pb.GRPCInferenceServiceClient, healthpb.HealthClient) {
	t.Helper()
	require.NotEmpty(t, p.grpc, "the server serves gRPC")
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return pb.NewGRPCInferenceServiceClient(conn), healthpb.NewHealthClient(conn)
}

// rawFP32 is raw_output_contents' FP32 values.
func rawFP32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func pixelsRaw(rows []digit) []byte {
	var b []byte
	for _, d := range rows {
		for _, v := range d.pixels {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	}
	return b
}

// classesHTTP is each digit's class from single-row JSON requests.
func classesHTTP(t *testing.T, base string, digits []digit) []int {
	out := make([]int, len(digits))
	for i, d := range digits {
		resp, body := post(t, base+"/v2/models/digits/infer", jsonRequest("x", []digit{d}))
		require.Equal(t, 200, resp.StatusCode, string(body))
		var r inferResponse
		require.NoError(t, json.Unmarshal(body, &r))
		out[i] = argmax(r.Outputs[0].Data)
	}
	return out
}

// TestGRPCEndToEnd runs every gRPC RPC the server implements against the
// real binary on a loopback port: the held-out digits classify the same
// over gRPC (typed contents one row a request, raw contents 50 rows a
// request, larger than a step; raw contents out, as Triton answers) as
// over HTTP, text goes in as BYTES both ways, errors name the input, the
// metrics count each protocol, and SIGTERM drains with gRPC clients
// connected.
func TestGRPCEndToEnd(t *testing.T) {
	p := start(t, "--server.max_body_bytes", "64KiB", "--server.enable_model_control")
	c, h := dialGRPC(t, p)
	ctx := context.Background()

	live, err := c.ServerLive(ctx, &pb.ServerLiveRequest{})
	require.NoError(t, err)
	assert.True(t, live.Live)
	ready, err := c.ServerReady(ctx, &pb.ServerReadyRequest{})
	require.NoError(t, err)
	assert.True(t, ready.Ready)
	md, err := c.ServerMetadata(ctx, &pb.ServerMetadataRequest{})
	require.NoError(t, err)
	assert.Equal(t, "stepserve", md.Name)
	assert.Contains(t, md.Extensions, "binary_tensor_data")
	hr, err := h.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hr.Status)
	mr, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "digits"})
	require.NoError(t, err)
	assert.True(t, mr.Ready)
	meta, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "digits"})
	require.NoError(t, err)
	assert.Equal(t, "pixels", meta.Inputs[0].Name)
	assert.Equal(t, []int64{-1, 64}, meta.Inputs[0].Shape)
	assert.Equal(t, []int64{-1, 10}, meta.Outputs[0].Shape)
	idx, err := c.RepositoryIndex(ctx, &pb.RepositoryIndexRequest{Ready: true})
	require.NoError(t, err)
	var names []string
	for _, m := range idx.Models {
		names = append(names, m.Name)
	}
	assert.Subset(t, names, []string{"digits", "tiny-encoder"})

	digits := heldout(t)
	want := classesHTTP(t, p.base, digits)
	correct := 0
	for i, d := range digits {
		resp, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: "pixels", Datatype: "FP32", Shape: []int64{1, 64}, Contents: &pb.InferTensorContents{Fp32Contents: d.pixels}}}})
		require.NoError(t, err)
		require.Equal(t, []int64{1, 10}, resp.Outputs[0].Shape)
		require.Len(t, resp.RawOutputContents, 1, "typed contents in, raw contents out")
		got := argmax(rawFP32(resp.RawOutputContents[0]))
		assert.Equal(t, want[i], got, "digit %d: gRPC and HTTP classify alike", i)
		if got == d.label {
			correct++
		}
	}
	t.Logf("held-out accuracy over gRPC typed contents: %.4f (%d digits)", float64(correct)/float64(len(digits)), len(digits))
	assert.GreaterOrEqual(t, float64(correct)/float64(len(digits)), 0.96)
	for start := 0; start < len(digits); start += 50 {
		rows := digits[start:min(start+50, len(digits))]
		resp, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "digits", ModelVersion: "1", Id: "batch",
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "pixels", Datatype: "FP32", Shape: []int64{int64(len(rows)), 64}}},
			RawInputContents: [][]byte{pixelsRaw(rows)}})
		require.NoError(t, err)
		assert.Equal(t, "batch", resp.Id)
		require.Len(t, resp.RawOutputContents, 1)
		probs := rawFP32(resp.RawOutputContents[0])
		require.Len(t, probs, len(rows)*10)
		for i := range rows {
			assert.Equal(t, want[start+i], argmax(probs[i*10:(i+1)*10]), "digit %d, raw", start+i)
		}
	}

	// Text as BYTES: typed bytes_contents and Triton's raw serialization
	// give the embedding JSON gives.
	texts := []string{"The water is warm.", "Children play near the river."}
	body, _ := json.Marshal(map[string]any{"inputs": []map[string]any{{"name": "text", "datatype": "BYTES", "shape": []int{2}, "data": texts}}})
	resp, out := post(t, p.base+"/v2/models/tiny-encoder/infer", body)
	require.Equal(t, 200, resp.StatusCode, string(out))
	var viaHTTP inferResponse
	require.NoError(t, json.Unmarshal(out, &viaHTTP))
	var blob []byte
	typed := &pb.InferTensorContents{}
	for _, s := range texts {
		blob = binary.LittleEndian.AppendUint32(blob, uint32(len(s)))
		blob = append(blob, s...)
		typed.BytesContents = append(typed.BytesContents, []byte(s))
	}
	for _, req := range []*pb.ModelInferRequest{
		{ModelName: "tiny-encoder", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "text", Datatype: "BYTES", Shape: []int64{2}, Contents: typed}}},
		{ModelName: "tiny-encoder", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "text", Datatype: "BYTES", Shape: []int64{2}}}, RawInputContents: [][]byte{blob}},
	} {
		r, err := c.ModelInfer(ctx, req)
		require.NoError(t, err)
		assert.Equal(t, []int64{2, 128}, r.Outputs[0].Shape)
		require.Len(t, r.RawOutputContents, 1)
		emb := rawFP32(r.RawOutputContents[0])
		require.Len(t, emb, 256)
		assert.InDeltaSlice(t, viaHTTP.Outputs[0].Data, emb, 1e-5)
	}

	// Errors: the HTTP path's messages, with the gRPC code of its status.
	for _, tc := range []struct {
		req  *pb.ModelInferRequest
		code codes.Code
		want string
	}{
		{&pb.ModelInferRequest{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "image", Datatype: "FP32", Shape: []int64{1, 64},
			Contents: &pb.InferTensorContents{Fp32Contents: make([]float32, 64)}}}}, codes.InvalidArgument, `unknown input "image"; model digits takes "pixels" (FP32 [-1 64])`},
		{&pb.ModelInferRequest{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "pixels", Datatype: "FP32", Shape: []int64{1, 64}}},
			RawInputContents: [][]byte{make([]byte, 100)}}, codes.InvalidArgument, `input "pixels": raw_input_contents is 100 bytes, but FP32 [1 64] needs 256`},
		{&pb.ModelInferRequest{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "pixels", Datatype: "FP32", Shape: []int64{1, 64},
			Contents: &pb.InferTensorContents{Fp32Contents: append(make([]float32, 63), float32(math.NaN()))}}}}, codes.InvalidArgument, `input "pixels": element 63 is NaN; values must be finite`},
		{&pb.ModelInferRequest{ModelName: "mnist"}, codes.NotFound, `Request for unknown model: 'mnist' is not found`},
		{&pb.ModelInferRequest{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "pixels", Datatype: "FP32", Shape: []int64{300, 64}}},
			RawInputContents: [][]byte{make([]byte, 300*256)}}, codes.ResourceExhausted, `larger than max`},
	} {
		_, err := c.ModelInfer(ctx, tc.req)
		st, _ := grpcstatus.FromError(err)
		assert.Equal(t, tc.code, st.Code(), st.Message())
		assert.Contains(t, st.Message(), tc.want)
	}

	mresp, err := http.Get(p.base + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	assert.Equal(t, float64(len(digits)+(len(digits)+49)/50), metricSum(t, string(metrics), "stepserve_requests_total", `model="digits"`, `outcome="success"`, `protocol="grpc"`))
	assert.Equal(t, float64(len(digits)), metricSum(t, string(metrics), "stepserve_requests_total", `model="digits"`, `outcome="success"`, `protocol="http"`))
	assert.Equal(t, 3.0, metricSum(t, string(metrics), "stepserve_requests_total", `model="digits"`, `outcome="invalid"`, `protocol="grpc"`))
	assert.Contains(t, string(metrics), `stepserve_request_duration_seconds_count{model="tiny-encoder",protocol="grpc"} 2`)

	// SIGTERM with a gRPC client connected: health says NOT_SERVING or the
	// connection goes, and the server exits 0.
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.done:
		p.done <- err
		assert.NoError(t, err, "exit status after SIGTERM")
	case <-time.After(15 * time.Second):
		t.Fatal("server did not exit within 15s of SIGTERM")
	}
	_, err = c.ServerLive(ctx, &pb.ServerLiveRequest{})
	assert.Error(t, err, "the gRPC listener is closed")
}

// zeros is a message of that many zero bytes, which zerosCodec hands gRPC
// as one small chunk again and again: the client neither holds nor
// scans 64 MiB to compress them (which takes a minute under the race
// detector).
type zeros int

type zerosCodec struct{ encoding.CodecV2 }

var zeroChunk = make([]byte, 32<<10)

func (c zerosCodec) Marshal(v any) (mem.BufferSlice, error) {
	n, ok := v.(zeros)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	out := make(mem.BufferSlice, int(n)/len(zeroChunk))
	for i := range out {
		out[i] = mem.SliceBuffer(zeroChunk)
	}
	return out, nil
}

// TestGRPCCompression: clients that compress their calls with gzip or
// deflate (tritonclient's compression_algorithm) are answered, and
// compressed bombs (64 MiB of zeros in a few hundred KiB, four at once)
// are refused with RESOURCE_EXHAUSTED once they inflate to
// server.max_body_bytes, with the server's memory bounded by that limit
// and not by what they would inflate to.
func TestGRPCCompression(t *testing.T) {
	p := startCapped(t, hostileMemoryCap, "--model_repository", hostileRepo(t), "--server.max_body_bytes", "4MiB")
	c, _ := dialGRPC(t, p)
	ctx := context.Background()
	d := heldout(t)[0]
	for _, enc := range []string{"gzip", "deflate"} {
		for _, req := range []*pb.ModelInferRequest{
			{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "pixels", Datatype: "FP32", Shape: []int64{1, 64}}},
				RawInputContents: [][]byte{pixelsRaw([]digit{d})}},
			{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "pixels", Datatype: "FP32", Shape: []int64{1, 64},
				Contents: &pb.InferTensorContents{Fp32Contents: d.pixels}}}},
		} {
			resp, err := c.ModelInfer(ctx, req, grpc.UseCompressor(enc))
			require.NoError(t, err, enc)
			require.Len(t, resp.RawOutputContents, 1, enc)
			assert.Equal(t, d.label, argmax(rawFP32(resp.RawOutputContents[0])), enc)
		}
	}

	// 64 MiB of zeros, compressed as gRPC sends them (deflate is
	// registered in this binary by the server's packages, as in the
	// server's).
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(zerosCodec{encoding.GetCodecV2(protoenc.Name)})))
	require.NoError(t, err)
	defer conn.Close()
	bomb := zeros(64 << 20)
	baseline := p.rss(t)
	rss := sampleRSS(p)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			enc := []string{"gzip", "deflate"}[i%2]
			err := conn.Invoke(ctx, pb.GRPCInferenceService_ModelInfer_FullMethodName, bomb, new(pb.ModelInferResponse), grpc.UseCompressor(enc))
			st, _ := grpcstatus.FromError(err)
			assert.Equal(t, codes.ResourceExhausted, st.Code(), "%s: %s", enc, st.Message())
			assert.Contains(t, st.Message(), "after decompression larger than max 4194304", enc)
		})
	}
	wg.Wait()
	peak := rss.peak()
	t.Logf("4 gRPC compression bombs inflating to 64 MiB each, limit 4 MiB: peak RSS %.0f MiB (baseline %.0f MiB)",
		float64(peak)/(1<<20), float64(baseline)/(1<<20))
	assert.Less(t, peak, baseline+96<<20)
	resp, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{
		{Name: "pixels", Datatype: "FP32", Shape: []int64{1, 64}}}, RawInputContents: [][]byte{pixelsRaw([]digit{d})}}, grpc.UseCompressor("gzip"))
	require.NoError(t, err, "the server answers afterwards")
	assert.Equal(t, d.label, argmax(rawFP32(resp.RawOutputContents[0])))
}

// TestGRPCTokensAndSIGHUP: gRPC requires the same bearer tokens as HTTP,
// as authorization metadata, and a SIGHUP rotation applies to it at once.
func TestGRPCTokensAndSIGHUP(t *testing.T) {
	const oldToken, newToken, repoToken = "old-token-0123456789", "new-token-0123456789", "repo-token-0123456789"
	file := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(file, []byte(oldToken+"\n"), 0o600))
	p := start(t, "--auth.inference.token_file", file, "--auth.repository.token", repoToken, "--server.enable_model_control")
	c, _ := dialGRPC(t, p)
	d := heldout(t)[0]
	infer := func(token string) codes.Code {
		ctx := context.Background()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: "pixels", Datatype: "FP32", Shape: []int64{1, 64}, Contents: &pb.InferTensorContents{Fp32Contents: d.pixels}}}})
		return grpcstatus.Code(err)
	}
	assert.Equal(t, codes.OK, infer(oldToken))
	assert.Equal(t, codes.Unauthenticated, infer(""))
	assert.Equal(t, codes.Unauthenticated, infer(newToken))
	_, err := c.ServerLive(context.Background(), &pb.ServerLiveRequest{})
	assert.NoError(t, err, "liveness stays open")
	_, err = c.RepositoryIndex(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+oldToken), &pb.RepositoryIndexRequest{})
	assert.Equal(t, codes.Unauthenticated, grpcstatus.Code(err), "the repository API takes its own token")
	_, err = c.RepositoryIndex(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+repoToken), &pb.RepositoryIndexRequest{})
	assert.NoError(t, err)

	require.NoError(t, os.WriteFile(file, []byte(newToken+"\n"), 0o600))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	assert.Eventually(t, func() bool { return infer(newToken) == codes.OK }, 10*time.Second, 20*time.Millisecond, "the new token is accepted after SIGHUP")
	assert.Equal(t, codes.Unauthenticated, infer(oldToken), "the old token is gone")
	assert.NotContains(t, p.logs.String(), newToken, "a token is never logged")
}

// TestGRPCDisabled: an empty server.grpc_addr serves no gRPC.
func TestGRPCDisabled(t *testing.T) {
	p := start(t, "--server.grpc_addr=")
	assert.Empty(t, p.grpc)
	assert.NotContains(t, p.logs.String(), "serving grpc")
}

// TestPythonGRPCClients runs Python's grpcio (Debian's python3-grpcio)
// against the real binary, with stubs generated at test time
// (python3-grpc-tools) from the repository's proto/inference.proto: raw
// contents (as tritonclient sends them), typed contents (as KServe's
// clients and Triton's explicit-content examples do), streaming, and
// calls compressed with gzip and deflate (as tritonclient's
// compression_algorithm makes them).
func TestPythonGRPCClients(t *testing.T) {
	const python = "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import grpc, grpc_tools.protoc").CombinedOutput(); err != nil {
		t.Skipf("Python's grpcio and grpc_tools are needed (make deps installs python3-grpcio and python3-grpc-tools): %s", out)
	}
	p := start(t)
	protos, err := filepath.Abs("../../proto")
	require.NoError(t, err)
	for _, mode := range []string{"raw", "typed", "stream", "compressed"} {
		cmd := exec.Command(python, "testdata/grpc_client.py", mode, protos, t.TempDir(), p.grpc)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s client:\n%s", mode, out)
		t.Logf("%s client: %s", mode, strings.TrimSpace(string(out)))
		assert.Contains(t, string(out), "ok", mode)
	}
	resp, err := http.Get(p.base + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.GreaterOrEqual(t, metricSum(t, string(metrics), "stepserve_requests_total", `outcome="success"`, `protocol="grpc"`), 4.0)
}
