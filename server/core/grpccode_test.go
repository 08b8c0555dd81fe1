package core

import (
	"strings"
	"testing"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestGRPCCodes(t *testing.T) {
	for st, want := range map[int]codes.Code{
		200: codes.OK, 400: codes.InvalidArgument, 401: codes.Unauthenticated, 403: codes.PermissionDenied, 404: codes.NotFound,
		408: codes.DeadlineExceeded, 413: codes.ResourceExhausted, 429: codes.ResourceExhausted, 499: codes.Canceled,
		500: codes.Internal, 501: codes.Unimplemented, 503: codes.Unavailable, 504: codes.DeadlineExceeded, 431: codes.InvalidArgument, 502: codes.Internal,
	} {
		assert.Equal(t, want, grpcCode(st), "%d", st)
	}
	long := GRPCError(apierr.BadRequest(strings.Repeat("x", 100_000)))
	msg := status.Convert(long).Message()
	assert.LessOrEqual(t, len(msg), maxGRPCMessage+8, "a message fits a trailer")
}
