package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
)

// statusClientClosed is nginx's status for a client that went away before
// the answer; it is logged and counted, never seen by the client.
const statusClientClosed = 499

// apiError is an error with the HTTP status it maps to. Every handler
// failure becomes one, and [writeError] is the only writer of error bodies.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(msg string) *apiError { return &apiError{http.StatusBadRequest, msg} }

func notFound(msg string) *apiError { return &apiError{http.StatusNotFound, msg} }

// statusOf maps an error from a model's Infer to a status code.
func statusOf(err error) int {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae.status
	case errors.Is(err, serving.ErrStopping):
		return http.StatusServiceUnavailable
	case errors.Is(err, serving.ErrUnknownModel):
		return http.StatusNotFound
	case errors.Is(err, serving.ErrBadModel), errors.Is(err, serving.ErrBadParameter):
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
		return statusClientClosed
	default:
		return http.StatusInternalServerError
	}
}

// outcome is the requests_total label for a status code.
func outcome(status int) string { return outcomeLabels[outcomeIndex(status)] }

// outcomeIndex is the index of status's outcome in outcomeLabels.
func outcomeIndex(status int) int {
	switch {
	case status < 300:
		return 0 // success
	case status == statusClientClosed:
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

// writeError writes {"error": msg} with status, and Retry-After where the
// client should come back later.
func writeError(w http.ResponseWriter, status int, msg string) {
	if status == statusClientClosed {
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
func modelNotFound(name string) *apiError {
	if len(name) > 128 || !models.ValidName(name) {
		return notFound("unknown model; model names are letters, digits, '_', '.' and '-'")
	}
	return notFound("unknown model " + strconv.Quote(name))
}
