package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server"
)

// repository is the set of models being served, loaded from the model
// repository directory. It is the server's [server.Repository] and, when
// model control is enabled, its [server.ModelControl].
type repository struct {
	root  string
	sh    *shared
	grace time.Duration // how long an unload waits for the model's queue

	mu      sync.RWMutex
	served  map[string]*servedModel
	failed  map[string]string // why a model last failed to load
	loading sync.Mutex        // one load or unload at a time
}

func newRepository(root string, sh *shared, grace time.Duration) *repository {
	return &repository{root: root, sh: sh, grace: grace, served: map[string]*servedModel{}, failed: map[string]string{}}
}

// Model implements [server.Repository].
func (r *repository) Model(name string) (server.Model, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, ok := r.served[name]
	if !ok {
		return nil, false // not a typed nil inside the interface
	}
	return s, true
}

// Models implements [server.Repository].
func (r *repository) Models() []server.Model {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]server.Model, 0, len(r.served))
	for _, s := range r.served {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model().Name < out[j].Model().Name })
	return out
}

func (r *repository) all() []*servedModel {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*servedModel, 0, len(r.served))
	for _, s := range r.served {
		out = append(out, s)
	}
	return out
}

// add starts serving a loaded model (not yet warmed up) under its name.
func (r *repository) add(m *models.Model) (*servedModel, error) {
	s, err := newServedModel(m, r.sh)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.served[m.Name] = s
	delete(r.failed, m.Name)
	r.mu.Unlock()
	return s, nil
}

// Index implements [server.ModelControl]: every model directory in the
// repository, loaded or not.
func (r *repository) Index(ctx context.Context) ([]server.IndexEntry, error) {
	entries, err := os.ReadDir(r.root)
	if err != nil {
		return nil, fmt.Errorf("model repository: %w", err)
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []server.IndexEntry
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(r.root, e.Name(), models.ConfigFile)); err != nil {
			continue
		}
		ie := server.IndexEntry{Name: e.Name(), State: "UNAVAILABLE", Reason: "unloaded"}
		if s, ok := r.served[e.Name()]; ok {
			ie.Version = s.model.Version
			ie.State, ie.Reason = "LOADING", ""
			if s.Ready() {
				ie.State = "READY"
			}
		} else if why, ok := r.failed[e.Name()]; ok {
			ie.Reason = why
		}
		out = append(out, ie)
	}
	return out, nil
}

// Load implements [server.ModelControl]: it loads name from the repository
// directory, warms it up and serves it. A model already served is replaced
// once the new one is ready; the old one drains its queue first.
func (r *repository) Load(ctx context.Context, name string) error {
	if !models.ValidName(name) {
		return fmt.Errorf("%w: %q is not a valid model name", server.ErrUnknownModel, name)
	}
	dir := filepath.Join(r.root, name)
	if _, err := os.Stat(filepath.Join(dir, models.ConfigFile)); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: the repository has no %s/%s", server.ErrUnknownModel, name, models.ConfigFile)
	}
	r.loading.Lock()
	defer r.loading.Unlock()

	m, err := models.Load(dir)
	if err == nil {
		err = r.replace(ctx, m)
	}
	if err != nil {
		r.mu.Lock()
		r.failed[name] = err.Error()
		r.mu.Unlock()
		return fmt.Errorf("%w: %v", server.ErrBadModel, err)
	}
	return nil
}

// replace warms up a new version of a model before it takes over.
func (r *repository) replace(ctx context.Context, m *models.Model) error {
	s, err := newServedModel(m, r.sh)
	if err != nil {
		return err
	}
	if err := s.Warmup(ctx); err != nil {
		s.Drain(ctx)
		s.Close()
		return err
	}
	r.mu.Lock()
	old := r.served[m.Name]
	r.served[m.Name] = s
	delete(r.failed, m.Name)
	r.mu.Unlock()
	if old != nil {
		r.retire(old, false)
	}
	return nil
}

// Unload implements [server.ModelControl]: the model stops taking requests
// (404 from then on), runs what is queued within the drain grace, and its
// series are deleted.
func (r *repository) Unload(ctx context.Context, name string) error {
	r.loading.Lock()
	defer r.loading.Unlock()
	r.mu.Lock()
	s, ok := r.served[name]
	delete(r.served, name)
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q is not loaded", server.ErrUnknownModel, name)
	}
	r.retire(s, true)
	return nil
}

// retire drains and closes a model no longer reachable by name; forget
// deletes its series too (not when a newer version took its name).
func (r *repository) retire(s *servedModel, forget bool) {
	ctx, cancel := context.WithTimeout(context.Background(), r.grace)
	defer cancel()
	if err := s.Drain(ctx); err != nil {
		r.sh.logger.Warn("unload: drain incomplete", "model", s.model.Name, "err", err)
	}
	s.Close()
	if forget {
		r.sh.steps.Forget(s.model.Name)
		r.sh.batching.Forget(s.model.Name)
	}
	r.sh.logger.Info("model unloaded", "model", s.model.Name, "replaced", !forget)
}
