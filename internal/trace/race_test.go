package trace

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSettingsChangeUnderLoad changes the global and per-model settings,
// forgets models and lists and opens files while requests are traced on
// several models at once: run with -race. The directory keeps to
// MaxFiles and every file listed opens.
func TestSettingsChangeUnderLoad(t *testing.T) {
	tr := New(Options{Dir: t.TempDir(), MaxFiles: 4, MaxBytes: 16 << 10, Wait: 20 * time.Millisecond})
	defer tr.Close()
	models := []string{"a", "b", "c"}
	deadline := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			m := models[w%len(models)]
			for time.Now().Before(deadline) {
				r := tr.Sample(m)
				if r == nil {
					continue
				}
				r.Stamp(Decoded)
				r.Stamp(Prepared)
				st := r.BeginStep()
				if st != nil {
					st.Start = time.Now()
					st.InferStart, st.InferEnd, st.End = st.Start, st.Start, st.Start
					r.Attach(st)
					st.Finish()
				}
				r.Done(200)
			}
		})
	}
	wg.Go(func() {
		levels := []string{"OFF", "TIMESTAMPS", "PROFILE"}
		for i := 0; time.Now().Before(deadline); i++ {
			m := []string{"", "a", "b", "c"}[i%4]
			body := fmt.Sprintf(`{"trace_level":["%s"],"trace_rate":"%d","trace_count":"%d","log_frequency":"%d","trace_file":"f%d"}`,
				levels[i%3], 1+i%2, []int{-1, 0, 3}[i%3], i%3, i%2)
			_, err := tr.Update(m, []byte(body))
			assert.NoError(t, err)
			if i%7 == 0 {
				tr.Forget(models[i%3])
			}
			if i%5 == 0 && m != "" {
				_, err := tr.Update(m, []byte(`{"trace_level":null,"trace_file":null}`))
				assert.NoError(t, err)
			}
			tr.Settings(m)
		}
	})
	wg.Go(func() {
		for time.Now().Before(deadline) {
			files, err := tr.Files().List()
			assert.NoError(t, err)
			for _, f := range files {
				if fh, _, err := tr.Files().Open(f.Name); err == nil {
					fh.Close()
				}
			}
		}
	})
	wg.Wait()
	_, err := tr.Update("", []byte(`{"trace_level":["OFF"]}`))
	require.NoError(t, err)
	files, err := tr.Files().List()
	require.NoError(t, err)
	assert.LessOrEqual(t, len(files), 4, "trace.max_files holds")
}
