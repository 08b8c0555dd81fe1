package main

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepserve/stepserve/config"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/rbln"
	"github.com/stepserve/stepserve/serving"
)

// engines are the engines a model may name: the CPU engine in process, and
// the Python worker engines, rbln (on an NPU) and torch (on the host CPU),
// whose workers start when a model first needs one.
func engines(cfg *config.Config, logger *slog.Logger, reg prometheus.Registerer) map[string]serving.Engine {
	r := cfg.RBLN
	workers := func(device string, devices []string, n int) serving.Engine {
		return serving.Engine{StrictWarmup: r.StrictWarmup, Start: func() (engine.Engine, error) {
			if device == rbln.DeviceCPU {
				// On a machine without torch the torch engine's models are
				// skipped, not fatal: make run serves the others.
				if err := rbln.CheckPython(r.Python); err != nil {
					return nil, fmt.Errorf("%w: %w", serving.ErrEngineUnavailable, err)
				}
			}
			return rbln.New(rbln.Options{
				Device: device, Python: r.Python, Devices: devices, Workers: n, NPUsPerDevice: r.NPUsPerDevice, Env: workerEnv(cfg), CompileCacheDir: r.CompileCacheDir,
				TorchCompile: r.TorchCompile, StrictWarmup: r.StrictWarmup,
				StallTimeout: r.StallTimeout, PingInterval: r.StallTimeout / 4, CompileTimeout: r.CompileTimeout,
				LogLevel: rbln.LogLevel(cfg.Log.Level), Logger: logger, Registerer: reg,
			})
		}}
	}
	return map[string]serving.Engine{
		"cpu":   {Engine: cpufallback.Engine{}, StrictWarmup: true},
		"rbln":  workers(rbln.DeviceRBLN, r.Devices, 0),
		"torch": workers(rbln.DeviceCPU, nil, r.TorchWorkers),
	}
}

// failoverEngine maps engine.failover to the engine that takes over.
func failoverEngine(f string) string {
	switch f {
	case "cpufallback":
		return "cpu"
	case "torch":
		return "torch"
	}
	return ""
}
