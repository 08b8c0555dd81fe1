package cpufallback

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/models"
)

// heldBytes is the size of every buffer a plan holds: the backing arrays
// of its slice fields, and of the slices in its slices of slices (not
// their headers). Shared fields (the resident weights) are named in
// skip. Reflection, so that a buffer added to a plan without
// adding it to planBytes fails TestResidentBytesIsWhatLoadAllocates.
func heldBytes(v reflect.Value, skip ...string) int64 {
	var n int64
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		v = v.Elem()
	}
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		if f.Kind() != reflect.Slice || slices.Contains(skip, name) {
			continue
		}
		if f.Type().Elem().Kind() != reflect.Slice {
			n += int64(f.Cap()) * int64(f.Type().Elem().Size())
			continue
		}
		for j := range f.Len() {
			n += int64(f.Index(j).Cap()) * int64(f.Type().Elem().Elem().Size())
		}
	}
	return n
}

// TestResidentBytesIsWhatLoadAllocates: the estimate made from model.yaml
// alone is what a load with every bucket compiled holds, slice headers
// aside.
func TestResidentBytesIsWhatLoadAllocates(t *testing.T) {
	for _, dir := range []string{"testdata/encoder", "../../model_repository/digits", "testdata/encoder:bfloat16"} {
		dir, dtype, _ := strings.Cut(dir, ":")
		m, err := models.Load(dir)
		require.NoError(t, err)
		if dtype != "" {
			m.Config.DeviceDtype = dtype // in bfloat16 where the CPU has it, else float32
		}
		grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, m.Config.Buckets.Seq)
		require.NoError(t, err)
		prog, err := Engine{}.Load(context.Background(), m, grid.Shapes())
		require.NoError(t, err)
		p := prog.(*program)
		var held int64
		for _, w := range p.weights {
			held += int64(cap(w.f32))*4 + int64(cap(w.bf16))*2
		}
		for i := range p.buckets {
			require.NoError(t, p.Compile(context.Background(), i))
			b := &p.buckets[i]
			held += int64(cap(b.in) + cap(b.out))
			held += heldBytes(reflect.ValueOf(b.plan), "w")
		}
		want := Engine{}.ResidentBytes(m.Config, grid.Shapes())
		assert.Equal(t, want, held, dir)
	}
}
