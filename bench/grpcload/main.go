// Command grpcload is make bench's gRPC load generator, the counterpart of
// wrk for stepserve's gRPC API: closed-loop ModelInfer calls of one
// single-row digits request on -c concurrent streams over -conns
// connections for -d, then one line of figures:
//
//	requests 123456 errors 0 rps 41152.0 p50 1.502ms p99 4.1ms cpu 0.98
//
// cpu is the generator's own CPU time over the run's wall time (1.0: one
// CPU busy), so that a report can say whether the client or the server
// was the limit. make bench runs it with GOMAXPROCS=1, one thread as wrk
// -t1 is.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	pb "github.com/stepserve/stepserve/server/inferencepb"
)

var (
	addr     = flag.String("addr", "127.0.0.1:8001", "the server's gRPC address")
	streams  = flag.Int("c", 64, "concurrent streams (calls in flight)")
	conns    = flag.Int("conns", 1, "connections the streams share")
	duration = flag.Duration("d", 3*time.Second, "how long to load")
	typed    = flag.Bool("typed", false, "send typed contents (fp32_contents) instead of raw_input_contents")
	reqFile  = flag.String("request", "", "a file holding the ModelInferRequest to send, protobuf-encoded (make bench's large inputs and shared-memory calls); empty: the single-row digits request")
	frame    = flag.String("frame", "", "write the request as one gRPC length-prefixed message to this file and exit: the body for a raw HTTP/2 load generator (h2load)")
)

// seven is a held-out 7 (README, "Try it").
var seven = []float32{0, 0, 2, 13, 16, 14, 1, 0, 0, 0, 11, 12, 7, 16, 3, 0, 0, 0, 9, 3, 2, 16, 3, 0, 0, 0, 0, 0, 9, 11, 0, 0,
	0, 0, 2, 11, 15, 13, 3, 0, 0, 0, 4, 15, 16, 13, 3, 0, 0, 0, 0, 14, 8, 0, 0, 0, 0, 0, 5, 15, 4, 0, 0, 0}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "grpcload:", err)
		os.Exit(1)
	}
}

func request() (*pb.ModelInferRequest, error) {
	if *reqFile != "" {
		b, err := os.ReadFile(*reqFile)
		if err != nil {
			return nil, err
		}
		req := new(pb.ModelInferRequest)
		if err := proto.Unmarshal(b, req); err != nil {
			return nil, fmt.Errorf("%s: %w", *reqFile, err)
		}
		return req, nil
	}
	in := &pb.ModelInferRequest_InferInputTensor{Name: "pixels", Datatype: "FP32", Shape: []int64{1, 64}}
	req := &pb.ModelInferRequest{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{in}}
	if *typed {
		in.Contents = &pb.InferTensorContents{Fp32Contents: seven}
		return req, nil
	}
	raw := make([]byte, 0, 4*len(seven))
	for _, v := range seven {
		raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(v))
	}
	req.RawInputContents = [][]byte{raw}
	return req, nil
}

func run() error {
	req, err := request() // shared: sent, never changed
	if err != nil {
		return err
	}
	if *frame != "" {
		return writeFrame(*frame, req)
	}
	clients := make([]pb.GRPCInferenceServiceClient, max(*conns, 1))
	for i := range clients {
		conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		clients[i] = pb.NewGRPCInferenceServiceClient(conn)
		// Connected, and the request right, before the clock starts.
		if _, err := clients[i].ModelInfer(context.Background(), req); err != nil {
			return fmt.Errorf("the first request: %w", err)
		}
	}
	var (
		mu      sync.Mutex
		lat     []time.Duration
		errs    int
		lastErr error
		wg      sync.WaitGroup
	)
	cpu0 := cpuTime()
	start := time.Now()
	end := start.Add(*duration)
	for w := range *streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%len(clients)]
			mine := make([]time.Duration, 0, 1<<16)
			var bad int
			var last error
			for {
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				if _, err := c.ModelInfer(context.Background(), req); err != nil {
					bad++
					last = err
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += bad
			if last != nil {
				lastErr = last
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	cpu := cpuTime() - cpu0
	if len(lat) == 0 {
		return fmt.Errorf("no request succeeded (%d errors; last: %v)", errs, lastErr)
	}
	if errs > 0 {
		fmt.Fprintf(os.Stderr, "grpcload: %d errors; last: %v\n", errs, lastErr)
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration {
		return lat[min(len(lat)-1, int(p*float64(len(lat))))].Round(time.Microsecond)
	}
	fmt.Printf("requests %d errors %d rps %.1f p50 %v p99 %v cpu %.2f\n", len(lat), errs,
		float64(len(lat))/wall.Seconds(), q(0.50), q(0.99), cpu.Seconds()/wall.Seconds())
	return nil
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// writeFrame writes req as gRPC sends it on the wire: a zero compression
// flag, the message's length (4 bytes, big endian), the message.
func writeFrame(path string, req *pb.ModelInferRequest) error {
	msg, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	b := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	return os.WriteFile(path, append(b, msg...), 0o644)
}
