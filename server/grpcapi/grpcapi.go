package grpcapi

import "github.com/stepserve/stepserve/server/core"

// API is the gRPC door over the core it is built on.
type API struct {
	c *core.Core
	grpcState
}

// New builds the gRPC API over c; [API.Server] builds its server.
func New(c *core.Core) *API { return &API{c: c} }
