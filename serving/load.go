package serving

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/stepserve/stepserve/models"
)

// LoadAll loads every model of the repository onto its engine, without
// warming it up: a server answers liveness while [Set.Warmup] compiles.
// A bad model fails the whole load, naming every model that failed, so
// that a server never starts with part of what it was asked to serve;
// with KeepGoing the others are served and the failed ones listed
// UNAVAILABLE with their reasons. Each model is checked and bounded as
// [Set.Load] does. It honours ctx.
func (s *Set) LoadAll(ctx context.Context) error {
	names, err := models.List(s.opts.Repository)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("models: repository %s holds no model (no <name>/%s, and no Hugging Face folder <name>/%s)", s.opts.Repository, models.ConfigFile, models.HFConfigFile)
	}
	var failed []error
	for _, name := range names {
		err := s.add(ctx, name)
		switch {
		case errors.Is(err, ErrEngineUnavailable):
			s.logger.Warn("model skipped: its engine cannot run on this machine", "model", name, "err", err)
			s.mu.Lock()
			s.failed[name] = err.Error()
			s.mu.Unlock()
		case err != nil && (ctx.Err() != nil || s.stopping.Err() != nil):
			return fmt.Errorf("model repository %s: %w", s.opts.Repository, err)
		case err != nil:
			failed = append(failed, s.startFailure(name, err))
		}
	}
	if len(failed) > 0 && !s.opts.KeepGoing {
		return fmt.Errorf("model repository %s: %d of %d models failed to load (models.exit_on_error: false serves the others):\n%w",
			s.opts.Repository, len(failed), len(names), errors.Join(failed...))
	}
	return nil
}

// startFailure records that name failed at start, and returns err naming
// it; with KeepGoing it is logged, and the set serves on without it.
func (s *Set) startFailure(name string, err error) error {
	s.mu.Lock()
	s.failed[name] = err.Error()
	s.startFailed[name] = true
	s.mu.Unlock()
	if s.opts.KeepGoing {
		s.logger.Error("model failed at start; serving the others (models.exit_on_error false)", "model", name, "err", err)
	}
	if strings.HasPrefix(err.Error(), "model "+name+":") {
		return err // it names the model already
	}
	return fmt.Errorf("model %s: %w", name, err)
}

// add reads name and serves it, not yet warmed up (not ready). It
// replaces nothing: a model of that name must not be served already.
func (s *Set) add(ctx context.Context, name string) error {
	ctx, cancel := s.loadContext(ctx)
	defer cancel()
	if err := s.lock(ctx, name); err != nil {
		return err
	}
	defer s.unlock()
	if _, ok := s.Model(name); ok {
		return fmt.Errorf("serving: model %s is already served; Load replaces it", name)
	}
	return s.guard(ctx, name, func() error {
		sm, err := s.loader.read(ctx, name, nil)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.served[name] = sm
		delete(s.failed, name)
		s.mu.Unlock()
		return nil
	})
}

// Warmup warms up every served model that is not warm yet, in name order,
// and returns the first failure.
func (s *Set) Warmup(ctx context.Context) error {
	ctx, cancel := s.untilStopping(ctx)
	defer cancel()
	for _, m := range s.Models() {
		err := s.warmup(ctx, m)
		if err == nil {
			continue
		}
		if ctx.Err() != nil || !s.opts.KeepGoing {
			return err
		}
		// Served no more: listed UNAVAILABLE with why; the others go on.
		name := m.model.Name
		s.mu.Lock()
		cur, ok := s.served[name]
		if ok && cur == m {
			delete(s.served, name)
		}
		s.mu.Unlock()
		if ok && cur == m {
			s.loader.retire(m, true)
		}
		s.startFailure(name, err)
	}
	return nil
}

// warmup warms m while no load or unload runs, unless it is warm already
// or no longer served (unloaded or replaced meanwhile).
func (s *Set) warmup(ctx context.Context, m *Model) error {
	if err := s.lock(ctx, m.model.Name); err != nil {
		return err
	}
	defer s.unlock()
	if cur, ok := s.Model(m.model.Name); !ok || cur != m || m.warmed.Load() {
		return nil
	}
	return m.Warmup(ctx)
}

// Load loads name from the repository, warms it up and serves it; it
// returns when the model is ready. A model already served goes on serving
// until the new one is ready, then drains its queue and is closed. A load
// cancelled through ctx (its client went away, the server is stopping) or
// out of time (Options.LoadTimeout) leaves the served model as it was.
// Errors wrap [ErrUnknownModel] (no such model directory) or
// [ErrBadModel]; a load waiting for another past its context returns the
// context's error.
func (s *Set) Load(ctx context.Context, name string) error {
	return s.LoadWith(ctx, name, nil)
}

// Override changes a model's configuration, as read from its model.yaml,
// before it loads; the result is validated as model.yaml is. Errors it
// returns should wrap [models.ErrConfig].
type Override func(*models.Config) error

// LoadWith is [Set.Load] with the model's configuration changed by
// override (nil: none): the repository API's load with a config.
func (s *Set) LoadWith(ctx context.Context, name string, override Override) error {
	if !models.ValidName(name) {
		return fmt.Errorf("%w: %q is not a valid model name", ErrUnknownModel, name)
	}
	ctx, cancel := s.loadContext(ctx)
	defer cancel()
	if err := s.lock(ctx, name); err != nil {
		return err
	}
	defer s.unlock()

	err := s.guard(ctx, name, func() error {
		sm, err := s.loader.read(ctx, name, override)
		if err != nil {
			return err
		}
		installed := false
		defer func() { // on every failure, a panic included
			if !installed {
				sm.drain(context.Background())
				sm.Close()
			}
		}()
		if err := s.replace(ctx, sm); err != nil {
			return err
		}
		installed = true
		return nil
	})
	if errors.Is(err, models.ErrNoModel) {
		return fmt.Errorf("%w: the repository has no %s/%s", ErrUnknownModel, name, models.ConfigFile)
	}
	if err != nil && s.stopping.Err() != nil {
		return fmt.Errorf("%w: the load of %s was cancelled: %w", ErrStopping, name, err)
	}
	if err != nil {
		s.mu.Lock()
		s.failed[name] = err.Error()
		_, served := s.served[name]
		s.mu.Unlock()
		if !served {
			s.loader.forget(name) // the series its runners created
		}
		return fmt.Errorf("%w: %w", ErrBadModel, err)
	}
	s.mu.Lock()
	delete(s.startFailed, name) // loaded at last: ready again, where it was all that was missing
	s.mu.Unlock()
	return nil
}

// loadContext is ctx bounded by the load timeout, and cancelled when the
// set starts draining.
func (s *Set) loadContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, stop := s.untilStopping(ctx)
	d := s.opts.LoadTimeout
	ctx, cancel := context.WithTimeoutCause(ctx, d,
		fmt.Errorf("the load did not finish within models.load_timeout (%v): %w", d, context.DeadlineExceeded))
	return ctx, func() { cancel(); stop() }
}

// lock waits for the load or unload in progress, if any, until ctx ends.
func (s *Set) lock(ctx context.Context, name string) error {
	if s.stopping.Err() != nil {
		return fmt.Errorf("%w: %s is neither loaded nor unloaded now", ErrStopping, name)
	}
	select {
	case s.changing <- struct{}{}:
		return nil
	default:
	}
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	select {
	case s.changing <- struct{}{}:
		return nil
	case <-ctx.Done():
		if s.stopping.Err() != nil {
			return fmt.Errorf("%w: %s is neither loaded nor unloaded now", ErrStopping, name)
		}
		return fmt.Errorf("serving: %s: another load or unload is still running: %w", name, context.Cause(ctx))
	}
}

func (s *Set) unlock() { <-s.changing }

// Waiting counts the loads and unloads waiting for another load or unload
// to finish (they run one at a time).
func (s *Set) Waiting() int { return int(s.waiting.Load()) }

// guard runs one model's load, turning a panic in it (a bug in a loader
// or an engine, met on a file nobody foresaw) into the load's error, so
// that no model file takes the server down; the stack goes to the log. An
// error after ctx ended says why it ended.
func (s *Set) guard(ctx context.Context, name string, load func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("model load panicked", "model", name, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("model %s: the load failed on an internal error (logged)", name)
		}
		if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
	}()
	return load()
}

// replace warms up a new version of a model before it takes over.
func (s *Set) replace(ctx context.Context, sm *Model) error {
	if err := sm.Warmup(ctx); err != nil {
		return err
	}
	name := sm.model.Name
	s.mu.Lock()
	if s.stopping.Err() != nil { // Drain has taken its list of models
		s.mu.Unlock()
		return ErrStopping
	}
	old := s.served[name]
	s.served[name] = sm
	delete(s.failed, name)
	s.mu.Unlock()
	if old != nil {
		s.loader.retire(old, false)
	}
	return nil
}

// Unload stops serving name: from now on it is not found, it runs what it
// has queued within the drain grace, and its metric series are deleted.
func (s *Set) Unload(ctx context.Context, name string) error {
	if err := s.lock(ctx, name); err != nil {
		return err
	}
	defer s.unlock()
	s.mu.Lock()
	m, ok := s.served[name]
	delete(s.served, name)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q is not loaded", ErrUnknownModel, name)
	}
	s.loader.retire(m, true)
	return nil
}

// untilStopping is ctx, cancelled also when the set starts draining.
func (s *Set) untilStopping(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(s.stopping, cancel)
	return ctx, func() { unhook(); cancel() }
}
