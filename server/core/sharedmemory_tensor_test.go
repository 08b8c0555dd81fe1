package core

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stepserve/stepserve/server/shm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestSharedMemoryParameters(t *testing.T) {
	params := func(js string) WireParams {
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(js), &m))
		return WireParams{m: m}
	}
	got, err := shmParams(params(`{"shared_memory_region":"r","shared_memory_byte_size":12,"shared_memory_offset":4}`))
	require.NoError(t, err)
	assert.Equal(t, &ShmTensor{Region: "r", ByteSize: 12, Offset: 4}, got)
	got, err = shmParams(params(`{"shared_memory_region":"r","shared_memory_byte_size":12}`))
	require.NoError(t, err)
	assert.Equal(t, int64(0), got.Offset, "the offset is 0 when left out")
	got, err = shmParams(params(`{"binary_data_size":12}`))
	require.NoError(t, err)
	assert.Nil(t, got)
	for js, want := range map[string]string{
		`{"shared_memory_byte_size":12}`:                                                     "needs shared_memory_region",
		`{"shared_memory_offset":0}`:                                                         "needs shared_memory_region",
		`{"shared_memory_region":"r"}`:                                                       "shared_memory_byte_size is required",
		`{"shared_memory_region":["r"],"shared_memory_byte_size":1}`:                         "must be a string",
		`{"shared_memory_region":"r","shared_memory_byte_size":1.5}`:                         "must be a non-negative integer",
		`{"shared_memory_region":"r","shared_memory_byte_size":"12"}`:                        "must be a non-negative integer",
		`{"shared_memory_region":"r","shared_memory_byte_size":1,"shared_memory_offset":-1}`: "must be a non-negative integer",
		`{"shared_memory_region":"r","shared_memory_byte_size":99999999999999999999}`:        "of at most 281474976710656",
	} {
		_, err := shmParams(params(js))
		if assert.Error(t, err, js) {
			assert.Contains(t, err.Error(), want, js)
		}
	}
}

// A shared-memory refusal keeps its status through the error taxonomy,
// over HTTP and gRPC.
func TestSharedMemoryRefusalsKeepTheirStatus(t *testing.T) {
	err := fmt.Errorf("registering: %w", &shm.Error{Status: http.StatusBadRequest, Msg: "no room"})
	assert.Equal(t, http.StatusBadRequest, StatusOf(err))
	assert.Equal(t, codes.InvalidArgument, status.Code(GRPCError(err)))
	assert.Equal(t, http.StatusNotImplemented, StatusOf(&shm.Error{Status: http.StatusNotImplemented, Msg: "off"}))
}
