package bucketing

import (
	"testing"
	"time"
)

// TestAdviseCostIsBounded: GET /v2/models/{m}/buckets/advice?max_buckets=K
// runs Advise on every call, behind only the inference token, with no
// cache, no concurrency bound and no cancellation. On a model with a
// large grid whose traffic touched many sizes (any client can make such
// traffic: requests of every row count and length), the alternating
// search costs about sum over kb of 50 x (kb x rows^2 + K/kb x seqs^2):
// 4.3 s for a batch 256 x seq 2048 grid and over a minute for 1024 x
// 4096, per request (found on a 2-core machine). A handful of concurrent
// advice calls would take the server's CPUs from inference. One call must
// take well under a second (the bound here is generous for a loaded CI
// machine).
func TestAdviseCostIsBounded(t *testing.T) {
	for _, g := range []struct {
		rows, seq, k int
		limit        time.Duration
	}{
		{256, 2048, 4096, 2 * time.Second},
		{1024, 4096, 4096, 5 * time.Second},
	} {
		tr := NewTraffic(g.rows, g.seq, 0)
		now := time.Now()
		for r := 1; r <= g.rows; r++ {
			for s := seqMultiple; s <= g.seq; s += seqMultiple {
				tr.Record(r, s, r*s/2+(r*7+s)%13, now)
			}
		}
		h := tr.Snapshot()
		var batch, seq []int
		for b := 1; b <= g.rows; b *= 2 {
			batch = append(batch, b)
		}
		for s := seqMultiple; s <= g.seq; s *= 2 {
			seq = append(seq, s)
		}
		began := time.Now()
		done := make(chan error, 1)
		go func() { _, err := Advise(h, batch, seq, g.k); done <- err }()
		select {
		case err := <-done:
			took := time.Since(began)
			t.Logf("batch up to %d x seq up to %d (%d x %d cells), max_buckets %d: %v", g.rows, g.seq, len(h.Rows), len(h.Seq), g.k, took)
			if err != nil {
				t.Fatal(err)
			}
			if took > g.limit {
				t.Errorf("batch up to %d x seq up to %d, max_buckets %d: one advice took %v, above %v", g.rows, g.seq, g.k, took, g.limit)
			}
		case <-time.After(g.limit + 10*time.Second):
			t.Fatalf("batch up to %d x seq up to %d, max_buckets %d: one advice still running after %v", g.rows, g.seq, g.k, g.limit+10*time.Second)
		}
	}
}
