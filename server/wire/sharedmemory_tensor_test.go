package wire

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
