package main

import (
	"log/slog"
	"net/http"

	"github.com/stepserve/stepserve/config"
)

// newHTTPServer serves h with server.*'s timeouts and header bound, and
// logs the connection errors net/http reports as warnings.
func newHTTPServer(cfg *config.Config, logger *slog.Logger, h http.Handler) *http.Server {
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
