package main

import (
	"regexp"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/stepserve/stepserve/engine/cpufallback"
)

// newRegistry is the process's metrics registry, with the Go runtime's,
// the process's and the build's collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		// go_gc_heap_live_bytes beside the memstats: the heap the last
		// collection found live, which garbage (and so the GC's pacing,
		// internal/gcfloor) does not move.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newBuildInfo(version, cpufallback.BLAS(), cpufallback.Kernels()),
	)
	return reg
}

func newBuildInfo(version, blas, kernels string) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "stepserve_build_info",
		Help: "Always 1; the labels say which build is running, what runs the CPU engine's products (native: its own kernels; else the BLAS, openblas or gonum) and for which instruction set its kernels are (avx512, avx2 or go, chosen from cpuid or STEPSERVE_CPU_KERNELS).",
	}, []string{"version", "go_version", "blas", "kernels"})
	g.WithLabelValues(version, runtime.Version(), blas, kernels).Set(1)
	return g
}
