package rbln

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/internal/half"
	"github.com/stepserve/stepserve/models"
)

// testProgram is a program of m's buckets with its buffers allocated as a
// load allocates them, and no worker.
func testProgram(t testing.TB, m *models.Model, floats dtype, shapes ...bucketing.Shape) *program {
	t.Helper()
	p := &program{model: m, key: "test-" + m.Name, shapes: shapes, floats: floats}
	require.NoError(t, p.allocate())
	t.Cleanup(func() { p.release() })
	return p
}

func loadEncoder(t testing.TB) *models.Model {
	m, err := models.Load("../../model_repository/tiny-encoder")
	require.NoError(t, err)
	return m
}

// TestBoundaryLayouts: the graph's input and output rows are multiples of
// 64 elements, in the compute dtype (token ids in int32), and the bytes a
// step moves follow.
func TestBoundaryLayouts(t *testing.T) {
	digits, encoder := loadDigits(t), loadEncoder(t)
	for _, tc := range []struct {
		name            string
		m               *models.Model
		shape           bucketing.Shape
		floats          dtype
		in, out         side // dt, cols and row only
		hostIn, hostOut int
		devIn, devOut   int
	}{
		{"digits b8 bfloat16", digits, bucketing.Shape{Batch: 8}, dtBFloat16,
			side{dt: dtBFloat16, cols: 64, row: 64}, side{dt: dtBFloat16, cols: 10, row: 64}, 2048, 320, 1024, 1024},
		{"digits b8 float32 (the torch engine)", digits, bucketing.Shape{Batch: 8}, dtFloat32,
			side{dt: dtFloat32, cols: 64, row: 64}, side{dt: dtFloat32, cols: 10, row: 64}, 2048, 320, 2048, 2048},
		{"tiny-encoder b1xs32 bfloat16", encoder, bucketing.Shape{Batch: 1, Seq: 32}, dtBFloat16,
			side{dt: dtInt32, cols: 96, row: 128}, side{dt: dtBFloat16, cols: 128, row: 128}, 768, 512, 512, 256},
		{"tiny-encoder b16xs64 float16", encoder, bucketing.Shape{Batch: 16, Seq: 64}, dtFloat16,
			side{dt: dtInt32, cols: 192, row: 192}, side{dt: dtFloat16, cols: 128, row: 128}, 24576, 8192, 12288, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := engine.NewLayout(tc.m.Config, tc.shape)
			b, err := newBoundary(l, tc.floats, false)
			require.NoError(t, err)
			for _, s := range []struct{ got, want side }{{b.in, tc.in}, {b.out, tc.out}} {
				assert.Equal(t, [3]any{s.want.dt, s.want.cols, s.want.row}, [3]any{s.got.dt, s.got.cols, s.got.row})
				assert.Zero(t, s.got.row%boundaryAlign)
			}
			assert.Equal(t, [4]int{tc.hostIn, tc.hostOut, tc.devIn, tc.devOut},
				[4]int{l.InBytes, l.OutBytes, b.in.bytes(b.batch), b.out.bytes(b.batch)})
			t.Logf("bytes a step moves: host layout %d in + %d out = %d; device staging %d + %d = %d",
				l.InBytes, l.OutBytes, l.InBytes+l.OutBytes, b.in.bytes(b.batch), b.out.bytes(b.batch), b.in.bytes(b.batch)+b.out.bytes(b.batch))
		})
	}
}

func TestBoundaryRefusesWhatItCannotStage(t *testing.T) {
	m := loadDigits(t)
	cfg := *m.Config
	cfg.Outputs = []models.TensorSpec{{Name: "y", Datatype: models.FP16, Shape: []int{-1, 10}}}
	_, err := newBoundary(engine.NewLayout(&cfg, bucketing.Shape{Batch: 1}), dtFloat16, false)
	assert.EqualError(t, err, `bucket b1 outputs: tensor "y" is FP16; the worker stages FP32, INT64 and INT32 tensors only`)
}

// TestPackAndUnpack: the encoder's three token tensors become one int32 row
// per sequence, padded with zeros whatever the staging held; outputs come
// back rounded to the compute dtype, without the padding.
func TestPackAndUnpack(t *testing.T) {
	m := loadEncoder(t)
	p := testProgram(t, m, dtBFloat16, bucketing.Shape{Batch: 2, Seq: 32})
	in, out := p.Staging(0)
	le := binary.LittleEndian
	for i := range 2 * 32 { // ids, mask, types: each [2, 32] int64
		le.PutUint64(in[8*i:], uint64(100+i))
		le.PutUint64(in[512+8*i:], 1)
		le.PutUint64(in[1024+8*i:], uint64(i%2))
	}
	dev := p.staging.buffer(p.lanes[0].in[0])
	require.Len(t, dev, 2*128*4, "two rows of 128 int32")
	for i := range dev {
		dev[i] = 0xff // whatever a previous step or a stray write left
	}
	p.lanes[0].pack(0)
	for r := range 2 {
		for j := range 128 {
			got := int32(le.Uint32(dev[4*(128*r+j):]))
			var want int32
			switch {
			case j < 32:
				want = int32(100 + 32*r + j)
			case j < 64:
				want = 1
			case j < 96:
				want = int32((32*r + j - 64) % 2)
			}
			require.Equal(t, want, got, "row %d element %d", r, j)
		}
	}

	devOut := p.staging.buffer(p.lanes[0].out[0])
	require.Len(t, devOut, 2*128*2, "two rows of 128 bfloat16")
	for i := range 2 * 128 {
		le.PutUint16(devOut[2*i:], half.BFloat16FromFloat32(float32(i)+0.5))
	}
	p.lanes[0].unpack(0)
	for i := range 2 * 128 {
		assert.Equal(t, half.BFloat16ToFloat32(half.BFloat16FromFloat32(float32(i)+0.5)), math.Float32frombits(le.Uint32(out[4*i:])), "element %d", i)
	}
}

// TestUnpackSlicesThePadding: digits' 10 probabilities per row come back
// from a 64-wide device row, and nothing of the padding reaches the host.
func TestUnpackSlicesThePadding(t *testing.T) {
	p := testProgram(t, loadDigits(t), dtFloat16, bucketing.Shape{Batch: 3})
	_, out := p.Staging(0)
	require.Len(t, out, 3*10*4)
	dev := p.staging.buffer(p.lanes[0].out[0])
	le := binary.LittleEndian
	for r := range 3 {
		for j := range 64 {
			v := float32(r) + float32(j)/16
			if j >= 10 {
				v = float32(math.NaN()) // padding the host must never see
			}
			le.PutUint16(dev[2*(64*r+j):], half.FromFloat32(v))
		}
	}
	p.lanes[0].unpack(0)
	for r := range 3 {
		for j := range 10 {
			assert.Equal(t, float32(r)+float32(j)/16, math.Float32frombits(le.Uint32(out[4*(10*r+j):])), "row %d class %d", r, j)
		}
	}
}

// TestPackAndUnpackAllocateNothing: they run on every step.
func TestPackAndUnpackAllocateNothing(t *testing.T) {
	p := testProgram(t, loadEncoder(t), dtFloat16, bucketing.Shape{Batch: 4, Seq: 64})
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		p.lanes[0].pack(0)
		p.lanes[0].unpack(0)
	}))
}

// TestResidentBytesIsWhatLoadAllocates: the server's budget counts the
// host buffers and the shared staging a load allocates.
func TestResidentBytesIsWhatLoadAllocates(t *testing.T) {
	m := loadEncoder(t)
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, m.Config.Buckets.Seq)
	require.NoError(t, err)
	for _, opts := range []Options{{Device: DeviceRBLN}, {Device: DeviceCPU}, {Device: DeviceCPU, Env: map[string]string{cpuDtypeEnv: "device"}}} {
		e := &Engine{opts: opts}
		floats, err := computeDtype(&e.opts, m.Config)
		require.NoError(t, err)
		p := testProgram(t, m, floats, grid.Shapes()...)
		host := 0
		for i := range p.shapes {
			in, out := p.Staging(i)
			host += len(in) + len(out)
		}
		assert.Equal(t, int64(host+len(p.staging.data)), e.ResidentBytes(m.Config, grid.Shapes()), "%s computing in %s", e.Name(), floats)
	}
}

// BenchmarkPackUnpack is the conversion a step adds, per bucket, in
// bfloat16.
func BenchmarkPackUnpack(b *testing.B) {
	for _, tc := range []struct {
		m     *models.Model
		shape bucketing.Shape
	}{
		{loadDigits(b), bucketing.Shape{Batch: 8}},
		{loadDigits(b), bucketing.Shape{Batch: 32}},
		{loadEncoder(b), bucketing.Shape{Batch: 1, Seq: 32}},
		{loadEncoder(b), bucketing.Shape{Batch: 64, Seq: 128}},
	} {
		p := testProgram(b, tc.m, dtBFloat16, tc.shape)
		b.Run(tc.m.Name+"/"+tc.shape.Label(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p.lanes[0].pack(0)
				p.lanes[0].unpack(0)
			}
		})
	}
}
