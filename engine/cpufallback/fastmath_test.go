package cpufallback

import (
	"math"
	"testing"
)

func TestFastMathAccuracy(t *testing.T) {
	worstExp, worstErf := 0.0, 0.0
	for x := -30.0; x <= 30; x += 0.001 {
		want := math.Exp(x)
		got := float64(exp32(float32(x)))
		worstExp = math.Max(worstExp, math.Abs(got-want)/want)
		worstErf = math.Max(worstErf, math.Abs(float64(erf32(float32(x)))-math.Erf(x)))
	}
	// The polynomials' own errors (3e-6, 1.5e-7) plus float32 rounding.
	if worstExp > 1e-5 {
		t.Errorf("exp32 relative error %.2e, want < 1e-5", worstExp)
	}
	if worstErf > 2e-6 {
		t.Errorf("erf32 absolute error %.2e, want < 2e-6", worstErf)
	}
	if exp32(-100) != 0 || !math.IsInf(float64(exp32(100)), 1) {
		t.Error("exp32 does not saturate")
	}
	t.Logf("exp32 max relative error %.2e, erf32 max absolute error %.2e", worstExp, worstErf)
}
