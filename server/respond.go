package server

import (
	"encoding/json"
	"net/http"

	"github.com/stepserve/stepserve/internal/clip"
)

// apiFunc is a handler of a route off the inference path: it returns the
// value to answer with, or an error that [statusOf] maps to a status code.
// The hot inference route keeps its own codec.
type apiFunc func(r *http.Request) (any, error)

// api adapts an apiFunc: one place writes every such response, the JSON
// body or the mapped error.
func api(f apiFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := f(r)
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

func writeErr(w http.ResponseWriter, err error) {
	writeError(w, statusOf(err), err.Error())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// clipName keeps a user-supplied name in a message short.
func clipName(s string) string { return clip.Clip(s, 64) }
