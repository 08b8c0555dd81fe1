package bucketing

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAdviseCostIsBounded: advice is served to any inference client
// (GET /v2/models/{m}/buckets/advice?max_buckets=K), so its cost must not
// grow with the grid or K without bound. Traffic that touched every size of
// a large grid (any client can send it) with K = 4096 once cost minutes of
// CPU per call (found by the red-team pass). The search now thins its
// candidates and tries only the splits of K that change the seq list: the
// dynamic programs' cells are counted, not timed, and stay under a fixed
// bound; the advice stays no worse than the current lists.
func TestAdviseCostIsBounded(t *testing.T) {
	const bound = 20_000_000 // cells: well under a second on any machine
	for _, g := range []struct{ rows, seq, k int }{
		{256, 2048, 4096}, {1024, 4096, 4096}, {1024, 4096, 7}, {1 << 16, 0, 4096}, {4096, 0, 100},
	} {
		tr := NewTraffic(g.rows, g.seq, 0)
		now := time.Now()
		for r := 1; r <= min(g.rows, 4096); r++ {
			if g.seq == 0 {
				tr.Record(r, 0, r, now)
				continue
			}
			for s := seqMultiple; s <= g.seq; s += seqMultiple {
				tr.Record(r, s, r*s/2+(r*7+s)%13, now)
			}
		}
		h := tr.Snapshot()
		var batch, seq []int
		for b := 1; b <= g.rows; b *= 2 {
			batch = append(batch, b)
		}
		if batch[len(batch)-1] != g.rows {
			batch = append(batch, g.rows)
		}
		for s := seqMultiple; s <= g.seq; s *= 2 {
			seq = append(seq, s)
		}
		a, err := Advise(h, batch, seq, g.k)
		require.NoError(t, err)
		t.Logf("batch up to %d x seq up to %d, max_buckets %d: %d cells, %d programs, work %.3fx today's", g.rows, g.seq, g.k, a.ops, a.Programs, a.WorkRatio)
		assert.LessOrEqual(t, a.ops, int64(bound), "batch up to %d x seq up to %d, max_buckets %d", g.rows, g.seq, g.k)
		assert.LessOrEqual(t, a.Programs, g.k)
		if len(batch)*max(len(seq), 1) <= g.k {
			assert.LessOrEqual(t, a.WorkRatio, 1.0+1e-12, "never worse than the current lists when they fit")
		}
	}
}
