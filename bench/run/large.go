package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// largeCase is a request with a large input, sent four ways: HTTP binary
// tensors, gRPC raw_input_contents, and the input read from (and the
// output written to) system shared memory over HTTP and over gRPC.
type largeCase struct {
	name     string // in the report
	model    string
	input    string
	datatype string
	shape    []int64
	raw      []byte // the input as raw tensor bytes (BYTES: Triton's serialization)
	output   string
	outBytes int64 // the output's size as raw bytes
	conns    int   // requests in flight

	httpBinary, httpShm string // wrk scripts
	grpcRaw, grpcShm    string // bench/grpcload request files; with ".grpc" added, h2load's (gRPC-framed)
	region              string // the shared-memory object, under /dev/shm
}

// largeCases are section 1c's: digits at its largest bucket (32 rows) and
// the tiny encoder at 64 texts of about 128 tokens.
func largeCases() []*largeCase {
	row := []float32{0, 0, 2, 13, 16, 14, 1, 0, 0, 0, 11, 12, 7, 16, 3, 0, 0, 0, 9, 3, 2, 16, 3, 0, 0, 0, 0, 0, 9, 11, 0, 0, 0, 0, 2, 11, 15, 13, 3, 0, 0, 0, 4, 15, 16, 13, 3, 0, 0, 0, 0, 14, 8, 0, 0, 0, 0, 0, 5, 15, 4, 0, 0, 0}
	var pixels []byte
	for range 32 {
		for _, v := range row {
			pixels = binary.LittleEndian.AppendUint32(pixels, math.Float32bits(v))
		}
	}
	words := strings.Fields("the water is warm and the children play near the river while their parents watch from the bank under old trees")
	var texts []byte
	for i := range 64 {
		var b strings.Builder
		for j := range 130 { // past 128 tokens: truncated to the longest bucket
			if j > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(words[(i+j)%len(words)])
		}
		texts = binary.LittleEndian.AppendUint32(texts, uint32(b.Len()))
		texts = append(texts, b.String()...)
	}
	return []*largeCase{
		{name: "digits, 32 rows (FP32 32x64, 8 KiB in)", model: "digits", input: "pixels", datatype: "FP32", shape: []int64{32, 64}, raw: pixels, output: "probabilities", outBytes: 32 * 10 * 4, conns: 16},
		{name: "tiny-encoder, 64 texts of 128 tokens (BYTES, 49 KiB in)", model: "tiny-encoder", input: "text", datatype: "BYTES", shape: []int64{64}, raw: texts, output: "embedding", outBytes: 64 * 128 * 4, conns: 4},
	}
}

// prepare writes c's wrk scripts and gRPC request files under dir, and
// registers its shared-memory regions with the server at base (unregister
// them with cleanup).
func (c *largeCase) prepare(dir, base string) error {
	tag := fmt.Sprintf("bench-%s-%d", c.model, os.Getpid())
	c.region = "/" + tag
	outAt := (int64(len(c.raw)) + 4095) &^ 4095
	f, err := os.OpenFile(filepath.Join("/dev/shm", tag), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("shared memory: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(outAt + c.outBytes); err != nil {
		return err
	}
	if _, err := f.WriteAt(c.raw, 0); err != nil {
		return err
	}
	in, out := tag+"-in", tag+"-out"
	for _, r := range []struct {
		name         string
		offset, size int64
	}{{in, 0, int64(len(c.raw))}, {out, outAt, c.outBytes}} {
		body := fmt.Sprintf(`{"key":%q,"offset":%d,"byte_size":%d}`, c.region, r.offset, r.size)
		if err := post(base+"/v2/systemsharedmemory/region/"+r.name+"/register", body); err != nil {
			return err
		}
	}

	shape, _ := json.Marshal(c.shape)
	hdr := fmt.Sprintf(`{"inputs":[{"name":%q,"datatype":%q,"shape":%s,"parameters":{"binary_data_size":%d}}],"outputs":[{"name":%q,"parameters":{"binary_data":true}}]}`,
		c.input, c.datatype, shape, len(c.raw), c.output)
	if c.httpBinary, err = wrkScript(dir, c.model+"-binary", append([]byte(hdr), c.raw...),
		map[string]string{"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": strconv.Itoa(len(hdr))}); err != nil {
		return err
	}
	shm := fmt.Sprintf(`{"inputs":[{"name":%q,"datatype":%q,"shape":%s,"parameters":{"shared_memory_region":%q,"shared_memory_byte_size":%d}}],"outputs":[{"name":%q,"parameters":{"shared_memory_region":%q,"shared_memory_byte_size":%d}}]}`,
		c.input, c.datatype, shape, in, len(c.raw), c.output, out, c.outBytes)
	if c.httpShm, err = wrkScript(dir, c.model+"-shm", []byte(shm), map[string]string{"Content-Type": "application/json"}); err != nil {
		return err
	}

	tensor := &pb.ModelInferRequest_InferInputTensor{Name: c.input, Datatype: c.datatype, Shape: c.shape}
	req := &pb.ModelInferRequest{ModelName: c.model, Inputs: []*pb.ModelInferRequest_InferInputTensor{tensor},
		Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: c.output}}, RawInputContents: [][]byte{c.raw}}
	if c.grpcRaw, err = writeProto(dir, c.model+"-raw.pb", req); err != nil {
		return err
	}
	str := func(s string) *pb.InferParameter {
		return &pb.InferParameter{ParameterChoice: &pb.InferParameter_StringParam{StringParam: s}}
	}
	i64 := func(n int64) *pb.InferParameter {
		return &pb.InferParameter{ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: n}}
	}
	tensor = &pb.ModelInferRequest_InferInputTensor{Name: c.input, Datatype: c.datatype, Shape: c.shape,
		Parameters: map[string]*pb.InferParameter{"shared_memory_region": str(in), "shared_memory_byte_size": i64(int64(len(c.raw)))}}
	req = &pb.ModelInferRequest{ModelName: c.model, Inputs: []*pb.ModelInferRequest_InferInputTensor{tensor},
		Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: c.output,
			Parameters: map[string]*pb.InferParameter{"shared_memory_region": str(out), "shared_memory_byte_size": i64(c.outBytes)}}}}
	c.grpcShm, err = writeProto(dir, c.model+"-shm.pb", req)
	return err
}

// cleanup unregisters c's regions and removes its shared-memory object.
func (c *largeCase) cleanup(base string) {
	if c.region == "" {
		return
	}
	tag := strings.TrimPrefix(c.region, "/")
	for _, r := range []string{tag + "-in", tag + "-out"} {
		post(base+"/v2/systemsharedmemory/region/"+r+"/unregister", "")
	}
	os.Remove(filepath.Join("/dev/shm", tag))
}

func post(url, body string) error {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// wrkScript writes body to a file and a wrk script that posts it with
// headers.
func wrkScript(dir, name string, body []byte, headers map[string]string) (string, error) {
	bodyPath := filepath.Join(dir, name+".body")
	if err := os.WriteFile(bodyPath, body, 0o644); err != nil {
		return "", err
	}
	var lua strings.Builder
	fmt.Fprintf(&lua, "wrk.method = \"POST\"\nlocal f = io.open(%q, \"rb\")\nwrk.body = f:read(\"*all\")\nf:close()\n", bodyPath)
	for k, v := range headers {
		fmt.Fprintf(&lua, "wrk.headers[%q] = %q\n", k, v)
	}
	script := filepath.Join(dir, name+".lua")
	return script, os.WriteFile(script, []byte(lua.String()), 0o644)
}

func writeProto(dir, name string, m proto.Message) (string, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", err
	}
	// As gRPC sends it: no compression, the length (big endian), the message.
	framed := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b)))
	return path, os.WriteFile(path+".grpc", append(framed, b...), 0o644)
}

// reportLarge is section 1c: each large case over HTTP binary tensors,
// gRPC raw contents and shared memory (HTTP and gRPC), interleaved, with
// the server's CPU per request.
func reportLarge(r *report, dir, base, grpcAddr string, pid int) error {
	r.line("## 1c. Large inputs: HTTP binary tensors, gRPC raw contents and system shared memory")
	r.line("")
	r.line("The same request four ways, interleaved round by round on the server of section 1: HTTP binary tensors (Triton's binary extension; wrk), gRPC `raw_input_contents` (h2load, and the Go client `bench/grpcload`, all streams on one connection, as in section 1b), and the input read from and the output written to a registered system shared-memory region (Triton's extension) over HTTP (wrk) and over gRPC (h2load), where the message carries only the region's name and size. Requests in flight: 16 for digits, 4 for the encoder (a request is a whole step of 64 texts). Server CPU per request is the server process's CPU time over the requests answered, counted until the server is idle again after each round.")
	r.line("")
	r.line("| request | transport | throughput, latency | server CPU per request | throughput / HTTP binary | server CPU / HTTP binary |")
	r.line("|---|---|---|---|---|---|")
	for _, c := range largeCases() {
		fmt.Fprintf(os.Stderr, "large inputs: %s\n", c.model)
		err := c.prepare(dir, base)
		if err != nil {
			c.cleanup(base)
			return fmt.Errorf("large inputs, %s: %w", c.model, err)
		}
		url := base + "/v2/models/" + c.model + "/infer"
		rs := interleaved(c.conns, target{url: url, script: c.httpBinary, pid: pid},
			target{grpc: grpcAddr, h2: c.grpcRaw + ".grpc", metrics: base, pid: pid},
			target{grpc: grpcAddr, request: c.grpcRaw, pid: pid},
			target{url: url, script: c.httpShm, pid: pid},
			target{grpc: grpcAddr, h2: c.grpcShm + ".grpc", metrics: base, pid: pid})
		c.cleanup(base)
		hb := rs[0]
		for i, name := range []string{"HTTP binary tensors", "gRPC raw_input_contents (h2load)", "gRPC raw_input_contents (grpcload, Go)", "HTTP, shared memory", "gRPC, shared memory (h2load)"} {
			cpu := fmt.Sprintf("%.1f µs", rs[i].serverCPU)
			if rs[i].serverCPU >= 10000 {
				cpu = fmt.Sprintf("%.1f ms", rs[i].serverCPU/1000)
			}
			r.line("| %s | %s | %s | %s | %.2fx | %.2fx |", c.name, name, rs[i], cpu, rs[i].rps/hb.rps, rs[i].serverCPU/hb.serverCPU)
		}
	}
	r.line("")
	return nil
}
