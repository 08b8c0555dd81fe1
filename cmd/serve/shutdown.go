package main

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/stepserve/stepserve/server"
	"github.com/stepserve/stepserve/serving"
)

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
