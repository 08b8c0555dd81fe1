package admin

import (
	"fmt"
	"net/http"

	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/shm"
)

// unsupportedExtensions are the endpoints of Triton's extensions that
// stepserve does not implement: they answer 501 Not Implemented naming the
// extension, so that a client learns what is missing rather than guessing
// at a 404. (The trace extension answers 501 where the server has no
// tracer: it is routed with the logging extension, behind the repository
// token.)
var unsupportedExtensions = []struct {
	path, extension, instead string
}{
	{"/v2/cudasharedmemory", "cuda_shared_memory", shm.CUDAInstead},
	{"/v2/cudasharedmemory/*", "cuda_shared_memory", shm.CUDAInstead},
}

const traceInstead = "see the step metrics at /metrics, and GET /v2/models/{model}/stats, /buckets and /explain"

// notImplemented answers every request with 501, naming the extension and
// what to use instead.
func notImplemented(extension, instead string) http.HandlerFunc {
	msg := fmt.Sprintf("the %s extension is not supported by stepserve; %s", extension, instead)
	return func(w http.ResponseWriter, r *http.Request) {
		core.WriteError(w, http.StatusNotImplemented, msg)
	}
}
