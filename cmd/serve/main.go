// Command serve is the stepserve server: it reads the configuration, loads
// the model repository onto its engine, serves the Open Inference Protocol
// over HTTP and gRPC, and on SIGTERM or SIGINT stops accepting, finishes
// what is in flight within server.shutdown_grace, and exits 0. SIGHUP
// re-reads the token files.
//
// It is the only place that reads configuration and wires the parts
// together.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/config"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/rbln"
	"github.com/stepserve/stepserve/internal/gcfloor"
	"github.com/stepserve/stepserve/internal/memlimit"
	"github.com/stepserve/stepserve/server"
	"github.com/stepserve/stepserve/serving"
	"github.com/stepserve/stepserve/steps"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// gcFloor is the allocation the garbage collector lets pass between
// collections however small the live heap, unless GOGC is set.
const gcFloor = 64 << 20

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "advise" {
		return advise(args[1:], os.Stdout, stderr)
	}
	cfg, err := config.Load(args)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if errors.Is(err, config.ErrVersion) {
		fmt.Printf("stepserve %s (%s, blas %s, kernels %s)\n", version, runtime.Version(), cpufallback.BLAS(), cpufallback.Kernels())
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "stepserve:", err)
		return 2
	}
	logger, level := newLogger(cfg.Log, stderr)
	if err := serve(cfg, logger, level); err != nil {
		logger.Error("stepserve stopped", "err", err)
		return 1
	}
	return 0
}

// newLogger is the process's log, and its level, which the logging
// extension (POST /v2/logging) changes at run time.

func serve(cfg *config.Config, logger *slog.Logger, logLevel *slog.LevelVar) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1) // from the start: SIGHUP's default is to exit
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	cpuThreads := cpufallback.SetThreads(cfg.Engine.CPUThreads)
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
	stepMetrics, err := steps.NewMetrics(reg)
	if err != nil {
		return err
	}
	batchMetrics, err := batching.NewMetrics(reg)
	if err != nil {
		return err
	}
	set, err := serving.New(serving.Options{
		Repository:      cfg.ModelRepository,
		Engines:         engines(cfg, logger, reg),
		DefaultEngine:   cfg.Engine.Default,
		Failover:        failoverEngine(cfg.Engine.Failover),
		Batching:        cfg.Batching,
		DrainGrace:      cfg.Server.ShutdownGrace,
		MaxModelBytes:   cfg.Models.MaxModelBytes,
		LoadTimeout:     cfg.Models.LoadTimeout,
		KeepGoing:       !cfg.Models.ExitOnError,
		StrictReadiness: cfg.Server.StrictReadiness,
		StepMetrics:     stepMetrics,
		BatchMetrics:    batchMetrics,
		Registerer:      reg,
		Logger:          logger,
	})
	if err != nil {
		return err
	}
	defer set.Close()
	if err := set.LoadAll(ctx); err != nil {
		return err
	}

	mem := memlimit.Read()
	memLimit, memSource := mem.Bytes, mem.Source
	inflight := cfg.Server.MaxInflightBytes
	if inflight == 0 {
		inflight = memLimit / 2
	}
	if os.Getenv("GOMEMLIMIT") == "" && memLimit > 0 {
		// Near the limit the GC works harder, rather than let garbage
		// grow the heap past what the process may use.
		debug.SetMemoryLimit(memLimit * 3 / 4)
	}
	if os.Getenv("GOGC") == "" {
		// A small live heap is not collected a hundred times a second
		// under load (internal/gcfloor): 64 MiB between collections, less
		// under a small memory limit.
		floor := uint64(gcFloor)
		if memLimit > 0 {
			floor = min(floor, uint64(memLimit/16))
		}
		defer gcfloor.Start(floor).Stop()
	}
	// One budget of connections for the HTTP and gRPC listeners: idle
	// clients of either cannot take the descriptors the other needs.
	maxConns := server.ConnectionCap(cfg.Server.MaxConnections, logger)
	conns, err := server.NewConnLimit(server.ConnLimitOptions{Max: maxConns, Listener: "api", Key: "server.max_connections", Logger: logger, Registerer: reg})
	if err != nil {
		return err
	}
	api, err := server.New(server.Options{
		Models:                 set,
		Conns:                  conns,
		IdleTimeout:            cfg.Server.IdleTimeout,
		ReadTimeout:            cfg.Server.ReadTimeout,
		ModelControl:           cfg.Server.EnableModelControl,
		MaxBodyBytes:           cfg.Server.MaxBodyBytes,
		MaxRequestElements:     cfg.Server.MaxRequestElements,
		MaxResponseBytes:       cfg.Server.MaxResponseBytes,
		MaxSharedMemoryRegions: cfg.Server.MaxSharedMemoryRegions,
		MaxSharedMemoryBytes:   cfg.Server.MaxSharedMemoryBytes,
		NoSharedMemory:         !cfg.Server.SharedMemory,
		MaxInflightBytes:       inflight,
		InferenceTokens:        cfg.Auth.InferenceTokens,
		RepositoryTokens:       cfg.Auth.RepositoryTokens,
		RepositoryAnonymous:    cfg.Auth.RepositoryAnonymous,
		MetricsElsewhere:       cfg.Server.MetricsAddr != "",
		Version:                version,
		Logger:                 logger,
		LogLevel:               logLevel,
		LogFormat:              cfg.Log.Format,
		LogRequests:            cfg.Log.Requests,
		Tracer:                 newTracer(cfg, logger),
		Registerer:             reg,
		Gatherer:               reg,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Server.Addr)
	if err != nil {
		return err
	}
	newHTTPServer := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout,
			ReadTimeout:       cfg.Server.ReadTimeout,
			WriteTimeout:      cfg.Server.WriteTimeout,
			IdleTimeout:       cfg.Server.IdleTimeout,
			MaxHeaderBytes:    int(cfg.Server.MaxHeaderBytes),
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		}
	}
	httpServer := newHTTPServer(api)
	serveErr := make(chan error, 3)
	go func() { serveErr <- conns.Serve(httpServer, ln) }()
	if cfg.Server.GRPCAddr != "" {
		gln, err := net.Listen("tcp", cfg.Server.GRPCAddr)
		if err != nil {
			return fmt.Errorf("server.grpc_addr: %w", err)
		}
		go func() { serveErr <- api.ServeGRPC(gln) }()
		logger.Info("serving grpc", "addr", gln.Addr().String())
	}
	if cfg.Server.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.Server.MetricsAddr)
		if err != nil {
			return err
		}
		mconns, err := server.NewConnLimit(server.ConnLimitOptions{Max: server.MetricsConns, Listener: "metrics", Logger: logger, Registerer: reg})
		if err != nil {
			return err
		}
		metricsServer := newHTTPServer(api.MetricsHandler())
		go func() { serveErr <- mconns.Serve(metricsServer, mln) }()
		// The metrics listener outlives the API's drain, so the drain
		// itself can be watched; it closes when serve returns.
		defer metricsServer.Close()
		logger.Info("serving metrics", "addr", mln.Addr().String())
	}
	logger.Info("serving", "addr", ln.Addr().String(), "version", version, "go", runtime.Version(),
		"blas", cpufallback.BLAS(), "kernels", cpufallback.Kernels(), "cpu_threads", cpuThreads,
		"models", len(set.Models()), "model_control", cfg.Server.EnableModelControl, "max_connections", maxConns, "config", cfg.File,
		"max_inflight_bytes", inflight, "memory_limit", memLimit, "memory_limit_from", memSource)

	// Liveness answers from here on; readiness waits for every bucket of
	// every model to be compiled and warmed up.
	warm := make(chan error, 1)
	go func() { warm <- set.Warmup(ctx) }()
	for {
		select {
		case err := <-serveErr:
			return err
		case err := <-warm:
			if err != nil {
				return shutdown(httpServer, api, set, cfg.Server.ShutdownGrace, logger, err)
			}
			announce(os.Stderr, logger, cfg, set, ln.Addr())
			warm = nil // warmed up: keep serving until a signal
		case <-hup:
			if a, err := cfg.Auth.Reload(); err != nil {
				logger.Error("SIGHUP: token files not reloaded; the tokens in force stay", "err", err)
			} else {
				api.SetTokens(a.InferenceTokens, a.RepositoryTokens)
			}
		case <-ctx.Done():
			logger.Info("shutting down", "grace", cfg.Server.ShutdownGrace)
			return shutdown(httpServer, api, set, cfg.Server.ShutdownGrace, logger, nil)
		}
	}
}

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

// shutdown drains within grace: every model's batcher answers new requests
// with 503 (gRPC: UNAVAILABLE) and runs what it has queued, and in-flight
// requests get their answers. The HTTP listener stops accepting at once;
// gRPC's health answers NOT_SERVING at once while its listener stays open
// until the models have drained (a probe sees NOT_SERVING, not a refused
// connection), and then stops gracefully. What is left when grace ends is
// answered with 503 and the open connections are closed. cause is returned
// as is, so a failed warm-up still exits non-zero.
func shutdown(s *http.Server, api *server.Server, set *serving.Set, grace time.Duration, logger *slog.Logger, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	api.DrainGRPC()
	drained := make(chan struct{})
	go func() {
		set.Drain(ctx)
		api.StopGRPC(ctx)
		close(drained)
	}()
	if err := s.Shutdown(ctx); err != nil {
		logger.Warn("shutdown grace ran out; closing open connections", "err", err)
		s.Close()
	}
	<-drained
	api.CloseTracer()       // writes the traces being taken
	api.CloseSharedMemory() // unmaps the regions clients registered
	return cause
}

func newBuildInfo(version, blas, kernels string) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "stepserve_build_info",
		Help: "Always 1; the labels say which build is running, what runs the CPU engine's products (native: its own kernels; else the BLAS, openblas or gonum) and for which instruction set its kernels are (avx512, avx2 or go, chosen from cpuid or STEPSERVE_CPU_KERNELS).",
	}, []string{"version", "go_version", "blas", "kernels"})
	g.WithLabelValues(version, runtime.Version(), blas, kernels).Set(1)
	return g
}
