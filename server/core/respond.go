package core

import (
	"encoding/json"
	"net/http"
)

// APIFunc is a handler of a route off the inference path: it returns the
// value to answer with, or an error that [statusOf] maps to a status code.
// The hot inference route keeps its own codec.
type APIFunc func(r *http.Request) (any, error)

// API adapts an apiFunc: one place writes every such response, the JSON
// body or the mapped error.
func API(f APIFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := f(r)
		if err != nil {
			WriteErr(w, err)
			return
		}
		WriteJSON(w, http.StatusOK, v)
	}
}

func WriteErr(w http.ResponseWriter, err error) {
	WriteError(w, StatusOf(err), err.Error())
}

func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
