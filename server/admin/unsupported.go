package admin

import (
	"fmt"
	"net/http"

	"github.com/stepserve/stepserve/server/core"
)

const traceInstead = "see the step metrics at /metrics, and GET /v2/models/{model}/stats, /buckets and /explain"

// notImplemented answers every request with 501, naming the extension and
// what to use instead: for the parts of Triton's extensions stepserve does
// not implement, rather than a 404 that reads like a typo.
func notImplemented(extension, instead string) http.HandlerFunc {
	msg := fmt.Sprintf("the %s extension is not supported by stepserve; %s", extension, instead)
	return func(w http.ResponseWriter, r *http.Request) {
		core.WriteError(w, http.StatusNotImplemented, msg)
	}
}
