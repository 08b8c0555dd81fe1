package core

import (
	"context"
	"fmt"
	"net/http"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/serving"
)

// The repository API (Triton's model repository extension). It is off
// unless Options.ModelControl is set, since loading and unloading change
// what every client sees.

func (c *Core) Control() error {
	if !c.Opts.ModelControl {
		return &apierr.Error{Status: http.StatusForbidden, Msg: "model control is disabled; start the server with --server.enable_model_control to load and unload models"}
	}
	return nil
}

// Index lists the repository's models, or its ready ones only, for either
// protocol.
func (c *Core) Index(ctx context.Context, readyOnly bool) ([]serving.IndexEntry, error) {
	index, err := c.Opts.Models.Index(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]serving.IndexEntry, 0, len(index))
	for _, e := range index {
		if !readyOnly || e.State == "READY" {
			out = append(out, e)
		}
	}
	return out, nil
}

// Load loads or reloads a model, its configuration changed by override
// (nil: none), for either protocol.
func (c *Core) Load(ctx context.Context, name string, override serving.Override) error {
	if c.RepositoryTokens.None() && c.Opts.Models.RunsCode(name) {
		// A module is code the worker runs: whoever may load one may run
		// code on the server.
		return &apierr.Error{Status: http.StatusForbidden, Msg: fmt.Sprintf("model %s is architecture torch, Python code the server would run: "+
			"loading it through the repository API requires auth.repository.token (or token_file); "+
			"without one, put it in the repository before the server starts", apierr.ClipName(name))}
	}
	if err := c.Opts.Models.LoadWith(ctx, name, override); err != nil {
		return LoadFailed(name, err)
	}
	c.Metrics.AddModel(name)
	c.Logger.Info("model loaded through the repository API", "model", name)
	return nil
}

// Unload stops serving a model, for either protocol.
func (c *Core) Unload(ctx context.Context, name string) error {
	if err := c.Opts.Models.Unload(ctx, name); err != nil {
		return fmt.Errorf("unload %s: %w", apierr.ClipName(name), err)
	}
	c.Metrics.forget(name)
	c.Opts.Tracer.Forget(name) // its trace override, as Triton drops it with the model
	c.Logger.Info("model unloaded through the repository API", "model", name)
	return nil
}
