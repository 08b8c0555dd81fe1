package core

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/stepserve/stepserve/serving"
	"github.com/stretchr/testify/assert"
)

// Every error a model's Infer returns maps to one status and outcome.
func TestStatusOfModelErrors(t *testing.T) {
	for _, tt := range []struct {
		err     error
		status  int
		outcome string
	}{
		{errors.New("device on fire"), 500, "error"},
		{serving.ErrQueueFull, 503, "rejected"},
		{serving.ErrDraining, 503, "rejected"},
		{serving.ErrUnavailable, 503, "rejected"},
		{serving.ErrDeadline, 504, "timeout"},
		{context.Canceled, 499, "cancelled"},
		{serving.ErrBadParameter, 400, "invalid"},
		{context.DeadlineExceeded, 504, "timeout"},
		{fmt.Errorf("load x: %w", serving.ErrUnknownModel), 404, "invalid"},
		{fmt.Errorf("load x: %w", serving.ErrBadModel), 400, "invalid"},
	} {
		st := StatusOf(fmt.Errorf("wrapped: %w", tt.err))
		assert.Equal(t, tt.status, st, tt.err.Error())
		assert.Equal(t, tt.outcome, outcome(st), tt.err.Error())
	}
	// A client that went away gets nothing written.
	w := httptest.NewRecorder()
	WriteErr(w, context.Canceled)
	assert.Empty(t, w.Body.String())
}
