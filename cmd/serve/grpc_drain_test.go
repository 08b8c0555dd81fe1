package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcstatus "google.golang.org/grpc/status"

	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// writeSlowTorch writes a torch model, name, to repo: y = 2x on a [-1, 4]
// FP32 input, whose step, by x[0][0]: at 9999 writes a line to
// hostile.log in the model's folder and blocks for ever; at 7777 prints
// 2,000,000 lines and answers; above 1000 sleeps x[0][0]-1000 seconds;
// otherwise answers at once (warm-up runs on zeros). extra is appended to
// its model.yaml. It returns the path of hostile.log.
func writeSlowTorch(t *testing.T, repo, name, extra string) string {
	t.Helper()
	dir := filepath.Join(repo, name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.py"), []byte(`
import sys
import threading
import time

import torch


class Slow(torch.nn.Module):
    def __init__(self, mark):
        super().__init__()
        self.mark = mark

    def forward(self, x):
        v = float(x[0][0])
        if v == 9999:
            with open(self.mark, "a") as f:
                f.write("hostile step\n")
            threading.Event().wait()
        elif v == 7777:
            for i in range(2_000_000):
                print("flood", i)
            sys.stdout.flush()
        elif v > 1000:
            time.sleep(v - 1000)
        return x * 2


def build(config):
    return Slow(config["mark"])
`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(`
architecture: torch
torch: {module: model.py, config: {mark: `+strconv.Quote(filepath.Join(dir, "hostile.log"))+`}}
inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
buckets: {batch: [1, 8]}
engine: torch
`+extra), 0o644))
	return filepath.Join(dir, "hostile.log")
}

// slowInfer is a single-row request to the slow model whose step sleeps
// seconds.
func slowInfer(model string, seconds float32) *pb.ModelInferRequest {
	return &pb.ModelInferRequest{ModelName: model, Inputs: []*pb.ModelInferRequest_InferInputTensor{
		{Name: "x", Datatype: "FP32", Shape: []int64{1, 4}, Contents: &pb.InferTensorContents{Fp32Contents: []float32{1000 + seconds, 1, 2, 3}}}}}
}

// TestGRPCDrainSaysNotServing: after SIGTERM, grpc.health.v1 answers
// NOT_SERVING to a probe on a new connection (as grpc-health-probe makes)
// while the requests in flight finish, rather than refusing the
// connection; every request sent before SIGTERM is answered (OK, or
// UNAVAILABLE for one the draining model refused), none is left without
// an answer; then the listener closes and the process exits 0.
func TestGRPCDrainSaysNotServing(t *testing.T) {
	repo := t.TempDir()
	writeSlowTorch(t, repo, "slow", "")
	p := start(t, "--model_repository", repo, "--server.shutdown_grace", "30s")
	c, _ := dialGRPC(t, p)

	const n = 8
	var wg sync.WaitGroup
	codesOf := make(chan codes.Code, n)
	for range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := c.ModelInfer(ctx, slowInfer("slow", 1.5))
			codesOf <- grpcstatus.Code(err)
		})
	}
	// The first step sleeps 1.5 s: the requests are in flight once the
	// model has one running.
	require.Eventually(t, func() bool {
		return metricSum(t, scrape(t, p.base), "stepserve_queue_depth", `model="slow"`) >= 1
	}, 10*time.Second, 10*time.Millisecond, "requests queue behind the sleeping step")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))

	probe := func() (healthpb.HealthCheckResponse_ServingStatus, error) {
		conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return 0, err
		}
		return r.Status, nil
	}
	assert.Eventually(t, func() bool {
		st, err := probe()
		return err == nil && st == healthpb.HealthCheckResponse_NOT_SERVING
	}, time.Second, 20*time.Millisecond, "a new connection's probe says NOT_SERVING while draining")

	wg.Wait()
	close(codesOf)
	ok := 0
	for code := range codesOf {
		assert.Contains(t, []codes.Code{codes.OK, codes.Unavailable}, code, "every request in flight is answered")
		if code == codes.OK {
			ok++
		}
	}
	assert.GreaterOrEqual(t, ok, 1, "the request running at SIGTERM finishes")
	select {
	case err := <-p.done:
		p.done <- err
		assert.NoError(t, err, "exit status after SIGTERM")
	case <-time.After(30 * time.Second):
		t.Fatal("server did not exit within 30s of SIGTERM")
	}
	_, err := probe()
	assert.Error(t, err, "the gRPC listener is closed once drained")
}
