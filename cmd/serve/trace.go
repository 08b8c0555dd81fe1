package main

import (
	"log/slog"
	"maps"
	"path/filepath"

	"github.com/stepserve/stepserve/config"
	"github.com/stepserve/stepserve/internal/trace"
)

// newTracer is the trace extension's tracer, writing under trace.dir.
func newTracer(cfg *config.Config, logger *slog.Logger) *trace.Tracer {
	return trace.New(trace.Options{Dir: cfg.Trace.Dir, MaxFiles: cfg.Trace.MaxFiles, MaxBytes: cfg.Trace.MaxBytes, Logger: logger})
}

// workerEnv is the environment rbln.env gives the workers, with, under
// rbln.profiler, RBLN_PROFILER=1 and RBLN_PROFILER_DIR (the runtime's own
// .pb profiles) in rbln-profiler under the trace directory: the runtime
// reads them when the worker starts.
func workerEnv(cfg *config.Config) map[string]string {
	if !cfg.RBLN.Profiler {
		return cfg.RBLN.Env
	}
	env := maps.Clone(cfg.RBLN.Env)
	if env == nil {
		env = map[string]string{}
	}
	env["RBLN_PROFILER"] = "1"
	if _, set := env["RBLN_PROFILER_DIR"]; !set {
		env["RBLN_PROFILER_DIR"] = filepath.Join(trace.DirOr(cfg.Trace.Dir), "rbln-profiler")
	}
	return env
}
