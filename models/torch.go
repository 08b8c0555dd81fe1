package models

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"unicode"

	"github.com/stepserve/stepserve/internal/clip"
)

// The datatypes an architecture torch model may take and give: every
// numeric one. Floating ones travel in the compute dtype; UINT16, UINT32
// and UINT64 in the next wider signed integer (torch computes with no
// wider unsigned type; UINT64 values from 2^63 saturate). BYTES cannot be
// a device tensor.
var (
	torchInputTypes  = []Datatype{FP32, FP16, BF16, FP64, INT64, INT32, INT16, INT8, UINT64, UINT32, UINT16, UINT8, BOOL}
	torchOutputTypes = torchInputTypes
)

// TorchEngines are the engines that run architecture torch: the Python
// worker, on the host CPU or an RBLN NPU. The Go CPU engine cannot.
var TorchEngines = []string{"torch", "rbln"}

func (c *Config) validateTorch(bad func(string, string, ...any) error) error {
	t := c.Torch
	if t == nil {
		return bad("torch", "is required for architecture torch; give module (a .py file in the model directory) and factory")
	}
	if c.MLP != nil || c.Encoder != nil {
		return bad("architecture", "torch takes a torch section only; remove mlp/encoder")
	}
	if err := relativeFile(t.Module); err != nil || !strings.HasSuffix(t.Module, ".py") {
		return bad("torch.module", "%q must be a .py file in the model directory (a relative path, no '..')", clip.Clip(t.Module, maxNameInError))
	}
	if t.Factory == "" {
		t.Factory = "build"
	}
	if !identifier(t.Factory) {
		return bad("torch.factory", "%q is not a Python identifier", clip.Clip(t.Factory, maxNameInError))
	}
	if t.Weights != "" {
		if err := relativeFile(t.Weights); err != nil || !strings.HasSuffix(t.Weights, ".safetensors") {
			return bad("torch.weights", "%q must be a .safetensors file in the model directory (a relative path, no '..')", clip.Clip(t.Weights, maxNameInError))
		}
	}
	if c.Engine == "cpu" {
		return bad("engine", "cpu (the Go engine) cannot run architecture torch; use %s", strings.Join(TorchEngines, " or "))
	}
	seq := false
	for i, s := range c.Inputs {
		at := fmt.Sprintf("inputs[%d]", i)
		if s.Datatype == BYTES {
			return bad(at+".datatype", "BYTES (strings) cannot be a tensor on the device; send numbers (token ids, for text) or serve text with architecture encoder")
		}
		if !slices.Contains(torchInputTypes, s.Datatype) {
			return bad(at+".datatype", "%s is not supported by architecture torch; want one of %v", s.Datatype, torchInputTypes)
		}
		if s.HasSeq() {
			seq = true
		} else if s.Pad != nil {
			return bad(at+".pad", "input %q has no variable dimension to pad", s.Name)
		}
	}
	for i, s := range c.Outputs {
		at := fmt.Sprintf("outputs[%d]", i)
		if s.Datatype == BYTES {
			return bad(at+".datatype", "BYTES (strings) cannot be a tensor on the device; give numbers")
		}
		if !slices.Contains(torchOutputTypes, s.Datatype) {
			return bad(at+".datatype", "%s is not supported by architecture torch; want one of %v", s.Datatype, torchOutputTypes)
		}
		if s.HasSeq() {
			return bad(at+".shape", "%v: an output's dimensions after the batch must be fixed", clipInts(s.Shape))
		}
		if s.Pad != nil {
			return bad(at+".pad", "outputs are not padded")
		}
	}
	switch {
	case seq && len(c.Buckets.Seq) == 0:
		return bad("buckets.seq", "an input has a variable second dimension (-1): list its bucket sizes here")
	case !seq && len(c.Buckets.Seq) > 0:
		return bad("buckets.seq", "no input has a variable second dimension (-1); remove buckets.seq")
	}
	return nil
}

// relativeFile checks p names a file inside the model directory.
func relativeFile(p string) error {
	if p == "" || path.IsAbs(p) || strings.Contains(p, "\\") || path.Clean(p) != p || p == "." ||
		strings.HasPrefix(p, "../") || p == ".." {
		return fmt.Errorf("not a relative path inside the model directory")
	}
	return nil
}

func identifier(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || unicode.IsLetter(r) || i > 0 && unicode.IsDigit(r)) || r > unicode.MaxASCII {
			return false
		}
	}
	return true
}
