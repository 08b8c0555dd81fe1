package serving

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/stepserve/stepserve/engine"
)

// Engine is one engine the set can load models on.
type Engine struct {
	// Engine is the engine; nil when Start makes it.
	Engine engine.Engine
	// Start makes the engine on first use, for an engine that costs
	// something to have (the rbln engine starts device workers). It is
	// called at most once.
	Start func() (engine.Engine, error)
	// StrictWarmup refuses readiness unless every bucket's second warm-up
	// run is clean; otherwise a non-clean warm-up is logged.
	StrictWarmup bool
}

// engines is the registry of [Engine]s by name, each started on first use.
type engines struct {
	mu      sync.Mutex
	specs   map[string]Engine
	started map[string]engine.Engine
	errs    map[string]error
}

func newEngines(specs map[string]Engine) (*engines, error) {
	for name, s := range specs {
		if (s.Engine == nil) == (s.Start == nil) {
			return nil, fmt.Errorf("serving: engine %q: set exactly one of Engine and Start", name)
		}
	}
	return &engines{specs: specs, started: map[string]engine.Engine{}, errs: map[string]error{}}, nil
}

// get returns the named engine, starting it on first use. A failed start
// is remembered: the engine is not started twice.
func (e *engines) get(name string) (engine.Engine, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if eng, ok := e.started[name]; ok {
		return eng, nil
	}
	if err, ok := e.errs[name]; ok {
		return nil, err
	}
	spec, ok := e.specs[name]
	if !ok {
		return nil, fmt.Errorf("serving: no engine %q; this server has %v", name, e.names())
	}
	eng := spec.Engine
	if eng == nil {
		var err error
		if eng, err = spec.Start(); err != nil {
			err = fmt.Errorf("serving: starting engine %s: %w", name, err)
			e.errs[name] = err
			return nil, err
		}
	}
	e.started[name] = eng
	return eng, nil
}

func (e *engines) strictWarmup(name string) bool { return e.specs[name].StrictWarmup }

func (e *engines) names() []string {
	var out []string
	for n := range e.specs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// close closes every started engine that has a Close method.
func (e *engines) close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	for _, eng := range e.started {
		if c, ok := eng.(interface{ Close() error }); ok {
			errs = append(errs, c.Close())
		}
	}
	e.started = map[string]engine.Engine{}
	return errors.Join(errs...)
}
