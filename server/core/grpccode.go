package core

import (
	"errors"
	"net/http"

	"github.com/stepserve/stepserve/internal/clip"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// grpcCode maps the HTTP status an error maps to ([statusOf]) to its gRPC
// code, so that both protocols answer a condition alike.
func grpcCode(httpStatus int) codes.Code {
	switch httpStatus {
	case http.StatusOK:
		return codes.OK
	case http.StatusBadRequest:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusRequestTimeout, http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case StatusClientClosed:
		return codes.Canceled
	case http.StatusNotImplemented:
		return codes.Unimplemented
	case http.StatusServiceUnavailable:
		return codes.Unavailable // retry: queue full, model not ready, budget spent, draining
	}
	if httpStatus < 500 {
		return codes.InvalidArgument
	}
	return codes.Internal
}

// maxGRPCMessage bounds an error's message: it travels in a trailer, and
// a client refuses trailers over its header list limit (16 KiB in
// grpc-go), which would turn a 400 into a transport error.
const maxGRPCMessage = 4 << 10

// GRPCError is err as a gRPC status: a status as it is, any other error
// with the code of the HTTP status it maps to.
func GRPCError(err error) error {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return err
	}
	if errors.Is(err, ErrBusy) {
		// Others hold the memory: gRPC's code for a resource to retry for.
		return status.Error(codes.ResourceExhausted, clip.Clip(err.Error(), maxGRPCMessage))
	}
	return status.Error(grpcCode(StatusOf(err)), clip.Clip(err.Error(), maxGRPCMessage))
}
