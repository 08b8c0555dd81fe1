package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/serving"
)

// StatusClientClosed is nginx's status for a client that went away before
// the answer; it is logged and counted, never seen by the client.
const StatusClientClosed = 499

// StatusOf maps an error from a model's Infer to a status code.
func StatusOf(err error) int {
	var ae *apierr.Error
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

// modelNotFound names the model asked for, without echoing unbounded
// input. It begins with Triton's words, which Triton's clients and tests
// match on.
func modelNotFound(name string) *apierr.Error {
	if !validName(name) {
		return apierr.NotFound("Request for unknown model; model names are letters, digits, '_', '.' and '-'")
	}
	return apierr.NotFound("Request for unknown model: " + QuoteModel(name) + " is not found")
}

// versionNotFound is modelNotFound for a version m does not serve.
func versionNotFound(m *serving.Model, v string) *apierr.Error {
	return apierr.NotFound(fmt.Sprintf("Request for unknown model: %s version %s is not found; it serves version %s",
		QuoteModel(m.Model().Name), quoteVersion(v), m.Model().Version))
}

// QuoteModel writes a model name as Triton's messages do ('name'), or
// quoted and clipped when it is not a valid name, so that no message
// echoes unbounded or unprintable input.
func QuoteModel(name string) string {
	if validName(name) {
		return "'" + name + "'"
	}
	return strconv.Quote(apierr.ClipName(name))
}

// quoteVersion writes a version from a request as Triton does (bare), or
// quoted and clipped when it is not a plain name.
func quoteVersion(v string) string {
	if validName(v) {
		return v
	}
	return strconv.Quote(apierr.ClipName(v))
}

func validName(s string) bool { return len(s) <= 128 && models.ValidName(s) }

// LoadFailed is a failed load's error: Triton's words ("failed to load
// 'name', ...", which Triton's clients and tests match on), then why. A
// model the repository does not have is, in Triton's words, one it
// failed to poll. The status stays err's.
func LoadFailed(name string, err error) error {
	if errors.Is(err, serving.ErrUnknownModel) {
		return fmt.Errorf("failed to load %s, failed to poll from model repository: %w", QuoteModel(name), err)
	}
	return fmt.Errorf("failed to load %s, %w", QuoteModel(name), err)
}
