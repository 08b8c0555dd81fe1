package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
)

// TestCheckFiniteNamesTheElement: a NaN or an infinity anywhere in an
// FP32 or FP64 tensor, of any length (the FP32 check reads two elements
// at a time), is refused naming its element; finite extremes pass.
func TestCheckFiniteNamesTheElement(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 8} {
		for at := range n {
			for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
				f32 := make([]byte, 4*n)
				f64 := make([]byte, 8*n)
				for i := range n {
					binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(math.MaxFloat32))
					binary.LittleEndian.PutUint64(f64[8*i:], math.Float64bits(-math.MaxFloat64))
				}
				require.NoError(t, checkFinite(f32, models.FP32))
				require.NoError(t, checkFinite(f64, models.FP64))
				binary.LittleEndian.PutUint32(f32[4*at:], math.Float32bits(float32(bad)))
				binary.LittleEndian.PutUint64(f64[8*at:], math.Float64bits(bad))
				want := fmt.Sprintf("element %d is %v; values must be finite", at, bad)
				assert.EqualError(t, checkFinite(f32, models.FP32), want, "FP32, %d elements", n)
				assert.EqualError(t, checkFinite(f64, models.FP64), want, "FP64, %d elements", n)
			}
		}
	}
}
