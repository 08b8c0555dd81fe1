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
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/config"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/internal/tlsfiles"
	"github.com/stepserve/stepserve/server"
	"github.com/stepserve/stepserve/serving"
	"github.com/stepserve/stepserve/steps"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

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

func serve(cfg *config.Config, logger *slog.Logger, logLevel *slog.LevelVar) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1) // from the start: SIGHUP's default is to exit
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	// The certificate first: a wrong file is said before models load.
	var tlsPair *tlsfiles.Pair
	if cfg.Server.TLSCertFile != "" {
		var err error
		if tlsPair, err = tlsfiles.Load(cfg.Server.TLSCertFile, cfg.Server.TLSKeyFile, logger); err != nil {
			return fmt.Errorf("server.tls_cert_file, server.tls_key_file: %w", err)
		}
	}
	cpuThreads := cpufallback.SetThreads(cfg.Engine.CPUThreads)
	reg := newRegistry()
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
		VLLMMetrics:     cfg.Server.VLLMMetrics,
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

	mem, inflight, stopGCFloor := limitMemory(cfg)
	defer stopGCFloor()
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
		TLS:                    grpcTLS(tlsPair),
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
	httpServer := newHTTPServer(cfg, logger, api)
	if tlsPair != nil {
		httpServer.TLSConfig = tlsPair.Config("h2", "http/1.1")
	}
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
		metricsServer := newHTTPServer(cfg, logger, api.MetricsHandler())
		go func() { serveErr <- mconns.Serve(metricsServer, mln) }()
		// The metrics listener outlives the API's drain, so the drain
		// itself can be watched; it closes when serve returns.
		defer metricsServer.Close()
		logger.Info("serving metrics", "addr", mln.Addr().String())
	}
	logger.Info("serving", "addr", ln.Addr().String(), "version", version, "go", runtime.Version(),
		"blas", cpufallback.BLAS(), "kernels", cpufallback.Kernels(), "cpu_threads", cpuThreads,
		"tls", tlsPair != nil, "models", len(set.Models()), "model_control", cfg.Server.EnableModelControl, "max_connections", maxConns, "config", cfg.File,
		"max_inflight_bytes", inflight, "memory_limit", mem.Bytes, "memory_limit_from", mem.Source)

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

// grpcTLS is the gRPC listener's TLS configuration: the pair, with ALPN
// h2 (gRPC clients require it); nil without TLS.
func grpcTLS(p *tlsfiles.Pair) *tls.Config {
	if p == nil {
		return nil
	}
	return p.Config("h2")
}
