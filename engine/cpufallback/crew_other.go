//go:build !cgo || purego

package cpufallback

import "github.com/stepserve/stepserve/models"

// nativeCrew is absent from builds without the native kernels: beginCrew
// returns no crew (products.isa is 0 there).
type nativeCrew struct{}

func newNativeCrew() *nativeCrew { return nil }

func (*nativeCrew) begin(int)               {}
func (*nativeCrew) end()                    {}
func (*nativeCrew) helped() int             { return 0 }
func (*nativeCrew) linear(*linearTask, int) { panic("cpufallback: no native crew in this build") }
func (*nativeCrew) attention(*attnTask, int, int, int, int, []float32, []float32, []float32, []float32, []float32, int) {
	panic("cpufallback: no native crew in this build")
}
func (*nativeCrew) norm([]float32, []float32, []float32, models.Norm, float64, int) {
	panic("cpufallback: no native crew in this build")
}
