package core

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
)

// StatusClientClosed is nginx's status for a client that went away before
// the answer; it is logged and counted, never seen by the client.
const StatusClientClosed = 499

// Error is an error with the HTTP status it maps to. Every handler
// failure becomes one, and [writeError] is the only writer of error bodies.
type Error struct {
	Status int
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

func BadRequest(msg string) *Error { return &Error{http.StatusBadRequest, msg} }

func NotFound(msg string) *Error { return &Error{http.StatusNotFound, msg} }

// StatusOf maps an error from a model's Infer to a status code.
func StatusOf(err error) int {
	var ae *Error
	switch {
	case errors.As(err, &ae):
		return ae.Status
	case errors.Is(err, serving.ErrStopping):
		return http.StatusServiceUnavailable
	case errors.Is(err, serving.ErrUnknownModel):
		return http.StatusNotFound
	case errors.Is(err, serving.ErrBadModel), errors.Is(err, serving.ErrBadParameter), errors.Is(err, serving.ErrNotGenerative):
		return http.StatusBadRequest
	case errors.Is(err, models.ErrInput):
		return http.StatusBadRequest
	case errors.Is(err, serving.ErrQueueFull), errors.Is(err, serving.ErrDraining), errors.Is(err, serving.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, serving.ErrDeadline):
		return http.StatusGatewayTimeout
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	case errors.Is(err, context.Canceled):
		return StatusClientClosed
	default:
		return http.StatusInternalServerError
	}
}

// outcome is the requests_total label for a status code.
func outcome(status int) string { return OutcomeLabels[outcomeIndex(status)] }

// outcomeIndex is the index of status's outcome in outcomeLabels.
func outcomeIndex(status int) int {
	switch {
	case status < 300:
		return 0 // success
	case status == StatusClientClosed:
		return 3 // cancelled
	case status == http.StatusServiceUnavailable:
		return 1 // rejected
	case status == http.StatusGatewayTimeout:
		return 2 // timeout
	case status < 500:
		return 4 // invalid
	default:
		return 5 // error
	}
}

// WriteError writes {"error": msg} with status, and Retry-After where the
// client should come back later.
func WriteError(w http.ResponseWriter, status int, msg string) {
	if status == StatusClientClosed {
		return // nobody is listening
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	w.Write(append(b, '\n'))
}

// modelNotFound names the model asked for, without echoing unbounded input.
func modelNotFound(name string) *Error {
	if len(name) > 128 || !models.ValidName(name) {
		return NotFound("unknown model; model names are letters, digits, '_', '.' and '-'")
	}
	return NotFound("unknown model " + strconv.Quote(name))
}
