// Package grpcapi is the gRPC door: Triton's and KServe's
// inference.GRPCInferenceService, and the standard grpc.health.v1 service
// for Kubernetes gRPC probes, on a listener of their own
// (server.grpc_addr). It serves the same models through the same checks,
// budget, tokens and metrics as HTTP: a request's protobuf is bounded
// before it is decoded (limits.go), translated into the checked request
// of [wire.InferRequest], and run as every request is.
package grpcapi

import "github.com/stepserve/stepserve/server/core"

// API is the gRPC door over the core it is built on.
type API struct {
	c *core.Core
	grpcState
	probes chan struct{} // probe messages being read (gate.go)
}

// New builds the gRPC API over c; [API.Server] builds its server.
func New(c *core.Core) *API {
	return &API{c: c, probes: make(chan struct{}, probeSlots)}
}
