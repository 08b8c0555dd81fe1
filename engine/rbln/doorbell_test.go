package rbln

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine"
)

// TestDoorbellLayoutMatchesTheWorker has the worker's own Doorbell (in a
// real Python process, given the block and eventfds as the supervisor
// gives them) read a request written here and write reports, which are
// read back here: the two ends agree on every offset.
func TestDoorbellLayoutMatchesTheWorker(t *testing.T) {
	requireTorch(t)
	d, err := newDoorbell()
	require.NoError(t, err)
	defer d.close()
	binary.LittleEndian.PutUint32(d.block[offSlot:], 7)
	binary.LittleEndian.PutUint32(d.block[offBucket:], 3)
	binary.LittleEndian.PutUint32(d.block[offLane:], 1)
	atomic.StoreUint64(d.word(offReqSeq), 1)

	src, _ := filepath.Abs("worker")
	cmd := exec.Command(python, "-c", `
import json, sys
from stepserve_worker.doorbell import Doorbell, FLAG_MEASURED, FLAG_EXTRAS
b = Doorbell.from_arg(sys.argv[1])
req = b.request()
assert req == (1, 7, 3, 1), req
assert b.request() is None, "a request is seen once"
extras = json.dumps({"reasons": ["cpu_fallback: aten::nonzero"], "cpu_fallback_by_op": {"aten::nonzero": 2}, "report": "[overhead]"}).encode()
b.report(1, 0, FLAG_MEASURED | FLAG_EXTRAS, (2, 0, 0, 0, 1, 1, 5000, 100, 200, -1, 0, 7, 5, 900, 4000, -1), 1234, extras)
`, d.childArg(3))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
	cmd.ExtraFiles = d.files
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	require.Equal(t, uint64(1), atomic.LoadUint64(d.word(offDoneSeq)))
	x, body, err := d.report()
	require.NoError(t, err)
	assert.Equal(t, int64(1234), body)
	assert.True(t, x.Measured)
	assert.False(t, x.Clean)
	assert.Equal(t, engine.Count(2), x.CPUFallbacks)
	assert.Equal(t, [2]engine.Count{1, 1}, [2]engine.Count{x.H2D, x.D2H})
	assert.Equal(t, engine.Count(5000), x.WallNS)
	assert.Equal(t, engine.Unknown, x.V2V, "-1 on the wire is unknown")
	assert.Equal(t, engine.Count(0), x.V2VSlow)
	require.NotNil(t, x.Dispatch, "the dispatch detail")
	assert.Equal(t, engine.Dispatch{Total: 7, WarmHits: 5, CPUFallbackNS: 900, RuntimeNS: 4000, V2VNS: engine.Unknown}, *x.Dispatch)
	assert.Equal(t, []string{"cpu_fallback: aten::nonzero"}, x.Reasons)
	assert.Equal(t, map[string]int64{"aten::nonzero": 2}, x.CPUFallbackByOp)
	assert.Equal(t, "[overhead]", x.Report)

	// The same extras again are not decoded again, and a caller appending
	// to one step's reasons does not write into the next step's.
	x.Reasons = append(x.Reasons, "mine")
	y, _, err := d.report()
	require.NoError(t, err)
	assert.Equal(t, []string{"cpu_fallback: aten::nonzero"}, y.Reasons)

	// A failed step's report is its error.
	cmd = exec.Command(python, "-c", `
import sys
from stepserve_worker.doorbell import Doorbell
Doorbell.from_arg(sys.argv[1]).fail(2, "KeyError: model slot 9 is not loaded on this worker")
`, d.childArg(3))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
	d2, err := newDoorbell()
	require.NoError(t, err)
	defer d2.close()
	cmd.Args[len(cmd.Args)-1] = d2.childArg(3)
	cmd.ExtraFiles = d2.files
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, _, err = d2.report()
	assert.EqualError(t, err, "KeyError: model slot 9 is not loaded on this worker")
}

// A step whose report detail cannot be read (cut mid-JSON by an older
// worker) is not failed for it: its counters stand, and a note says what
// was lost. One the worker cut to fit says so too (issue 33, item 5).
func TestDoorbellUnreadableReportDoesNotFailTheStep(t *testing.T) {
	d, err := newDoorbell()
	require.NoError(t, err)
	defer d.close()
	write := func(text string) {
		binary.LittleEndian.PutUint32(d.block[offStatus:], statusDone)
		binary.LittleEndian.PutUint32(d.block[offFlags:], flagMeasured|flagExtras)
		binary.LittleEndian.PutUint64(d.block[offCounts:], 3) // CPU fallbacks
		copy(d.block[textOffset:], text)
		binary.LittleEndian.PutUint32(d.block[offTextLen:], uint32(len(text)))
	}
	write(`{"reasons":["cpu_fallback: aten::nonzero"],"cpu_fallback_by_op":{"aten::nonz`)
	x, _, err := d.report()
	require.NoError(t, err, "a computed step is not failed for its report")
	assert.Equal(t, engine.Count(3), x.CPUFallbacks)
	assert.False(t, x.Clean)
	require.Len(t, x.Notes, 1)
	assert.Contains(t, x.Notes[0], "could not be read")

	write(`{"reasons":["host_bounce"],"host_bounce_by_site":{"a":9},"truncated":["report","host_bounce_by_site"]}`)
	x, _, err = d.report()
	require.NoError(t, err)
	assert.Equal(t, []string{"host_bounce"}, x.Reasons)
	assert.Equal(t, map[string]int64{"a": 9}, x.HostBounceBySite)
	require.Len(t, x.Notes, 1)
	assert.Contains(t, x.Notes[0], "report, host_bounce_by_site shortened or left out")
}
