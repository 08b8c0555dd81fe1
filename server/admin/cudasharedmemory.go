package admin

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/shm"
)

// Triton's CUDA shared-memory extension, as a Triton without GPUs answers
// it: there is no CUDA memory to hold, so the status lists no region and
// unregistering succeeds (clients unregister everything at start and at
// exit); registering is refused, naming what to use instead.
//
//	GET  /v2/cudasharedmemory[/region/{name}]/status
//	POST /v2/cudasharedmemory[/region/{name}]/unregister
//	POST /v2/cudasharedmemory/region/{name}/register   501
func (s *API) cudaSharedMemoryRoutes(r chi.Router) {
	r.Group(func(r chi.Router) {
		r.Use(s.c.SharedMemoryAuth)
		const cuda = "/v2/cudasharedmemory"
		r.Get(cuda+"/status", core.API(s.cudaStatus))
		r.Get(cuda+"/region/{name}/status", core.API(s.cudaStatus))
		r.Post(cuda+"/unregister", core.API(s.cudaUnregister))
		r.Post(cuda+"/region/{name}/unregister", core.API(s.cudaUnregister))
		r.Post(cuda+"/region/{name}/register", notImplemented("cuda_shared_memory", shm.CUDAInstead))
		r.HandleFunc(cuda, notImplemented("cuda_shared_memory", shm.CUDAInstead))
		r.HandleFunc(cuda+"/*", notImplemented("cuda_shared_memory", shm.CUDAInstead))
	})
}

// cudaStatus is no region; a region named is not found.
func (s *API) cudaStatus(r *http.Request) (any, error) {
	name, err := regionName(r)
	if err != nil {
		return nil, err
	}
	if name != "" {
		return nil, apierr.NotFound(fmt.Sprintf("Unable to find cuda shared memory region: %s", strconv.Quote(clip.Clip(name, 64))))
	}
	return []any{}, nil
}

// cudaUnregister succeeds: no region is held.
func (s *API) cudaUnregister(r *http.Request) (any, error) {
	if _, err := regionName(r); err != nil {
		return nil, err
	}
	return map[string]any{}, nil
}
