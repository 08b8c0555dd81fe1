// Package apierr is the refusal every part of the server returns: an
// error with the HTTP status it maps to. The core's error taxonomy
// (core.StatusOf, core.GRPCError) maps it, and the errors of the layers
// below, to HTTP and gRPC statuses from one table; the doors write it in
// their protocol's shape. It imports nothing of the module, so that the
// wire formats, the shared-memory registry and the core all refuse alike.
package apierr

import (
	"net/http"

	"github.com/stepserve/stepserve/internal/clip"
)

// Error is an error with the HTTP status it maps to.
type Error struct {
	Status int
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// BadRequest is a 400: the request is wrong, and msg says how.
func BadRequest(msg string) *Error { return &Error{http.StatusBadRequest, msg} }

// NotFound is a 404.
func NotFound(msg string) *Error { return &Error{http.StatusNotFound, msg} }

// ClipName keeps a user-supplied name in a message short.
func ClipName(s string) string { return clip.Clip(s, 64) }
