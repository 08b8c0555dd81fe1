package enginetest

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
)

// SumMaxYAML is the model.yaml of "summax", the model the fake engine's
// users serve: x (FP32 [-1, 3]) in, y (FP32 [-1, 2]) out, buckets of 1 and
// 4 rows. On the fake engine with [SumMax], y is each row's sum and max.
const SumMaxYAML = `architecture: mlp
mlp: {sizes: [3, 2]}
inputs: [{name: x, datatype: FP32, shape: [-1, 3]}]
outputs: [{name: y, datatype: FP32, shape: [-1, 2]}]
buckets: {batch: [1, 4]}
`

// WriteSumMax writes a summax model directory at dir: model.yaml and
// weights of the right shapes (zeros: the fake engine ignores them).
func WriteSumMax(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, models.ConfigFile), []byte(SumMaxYAML), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, models.WeightsFile))
	if err != nil {
		return err
	}
	err = models.WriteSafetensors(f, []*models.Tensor{
		{Name: "layers.0.weight", Shape: []int{2, 3}, Data: make([]float32, 6)},
		{Name: "layers.0.bias", Shape: []int{2}, Data: make([]float32, 2)},
	}, nil)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// SumMax is summax's step: y = [sum(x), max(x)] for every row of the
// bucket.
func SumMax(l engine.Layout, in, out []byte) error {
	for row := range l.Bucket.Batch {
		var sum float32
		mx := float32(math.Inf(-1))
		for k := range 3 {
			v := math.Float32frombits(binary.LittleEndian.Uint32(in[(row*3+k)*4:]))
			sum += v
			mx = max(mx, v)
		}
		binary.LittleEndian.PutUint32(out[row*8:], math.Float32bits(sum))
		binary.LittleEndian.PutUint32(out[row*8+4:], math.Float32bits(mx))
	}
	return nil
}
