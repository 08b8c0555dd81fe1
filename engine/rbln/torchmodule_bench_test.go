package rbln

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/models"
)

// BenchmarkTorchModuleStep steps the shipped architecture torch example
// (model_repository/digits-cnn, one row) on the torch engine and, in the
// same run, times the same module called directly in torch (its forward
// under inference_mode, in a Python loop): what serving it through
// stepserve's step costs over calling it yourself.
func BenchmarkTorchModuleStep(b *testing.B) {
	m, err := models.Load("../../model_repository/digits-cnn")
	require.NoError(b, err)
	env := map[string]string{}
	if v := os.Getenv("BENCH_WORKER_THREADS"); v != "" {
		env["OMP_NUM_THREADS"] = v
	}
	e, err := New(Options{Device: DeviceCPU, Python: python, Env: env})
	require.NoError(b, err)
	defer e.Close()
	prog, err := e.Load(context.Background(), m, []bucketing.Shape{{Batch: 1}})
	require.NoError(b, err)
	defer prog.Close()
	require.NoError(b, prog.Compile(context.Background(), 0))
	for range 2 {
		_, err := prog.Step(context.Background(), 0)
		require.NoError(b, err)
	}
	body0 := prog.(*program).bodyNS.Load()
	start := time.Now()
	n := 0
	for b.Loop() {
		if _, err := prog.Step(context.Background(), 0); err != nil {
			b.Fatal(err)
		}
		n++
	}
	served := float64(time.Since(start).Microseconds()) / float64(n)
	body := float64(prog.(*program).bodyNS.Load()-body0) / 1e3 / float64(n)

	dir, _ := filepath.Abs("../../model_repository/digits-cnn")
	worker, _ := filepath.Abs("worker")
	out, err := exec.Command(python, "-c", `
import sys, time, torch
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from stepserve_worker import usermodel
m = usermodel.import_file(__import__("pathlib").Path(sys.argv[1]) / "model.py", "bench").build({"channels": 16, "hidden": 64}).eval()
usermodel.load_weights(m, __import__("pathlib").Path(sys.argv[1]) / "weights.safetensors")
x = torch.zeros(1, 1, 8, 8)
with torch.inference_mode():
    for _ in range(200): m(x)
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < 1: m(x); n += 1
print((time.perf_counter() - t) / n * 1e6)
`, dir, worker).CombinedOutput()
	require.NoError(b, err, "%s", out)
	direct, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	require.NoError(b, err)
	b.ReportMetric(served, "served-µs/step")
	b.ReportMetric(direct, "direct-µs/call")
	b.ReportMetric(served/direct, "served/direct")
	b.ReportMetric(body, "body-µs/step")
}
