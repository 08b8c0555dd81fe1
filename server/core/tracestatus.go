package core

import "net/http"

// TraceStatus is the status a gRPC request's trace records.
func TraceStatus(err error) int {
	if err == nil {
		return http.StatusOK
	}
	return StatusOf(err)
}
