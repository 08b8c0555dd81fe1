package wire

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
)

// Every integer datatype is returned as JSON numbers, at the ends of its
// range, within the bytes the response estimate allows a value.
func TestAppendJSONDataIntegers(t *testing.T) {
	le := binary.LittleEndian
	for _, tc := range []struct {
		dt   models.Datatype
		data []byte
		want string
	}{
		{models.INT8, []byte{0x80, 0x7f}, "[-128,127]"},
		{models.UINT8, []byte{0, 255}, "[0,255]"},
		{models.INT16, le.AppendUint16(le.AppendUint16(nil, 0x8000), 0x7fff), "[-32768,32767]"},
		{models.UINT16, le.AppendUint16(nil, 65535), "[65535]"},
		{models.UINT32, le.AppendUint32(nil, 4294967295), "[4294967295]"},
		{models.UINT64, le.AppendUint64(nil, 18446744073709551615), "[18446744073709551615]"},
	} {
		got, err := AppendJSONData(nil, tc.data, tc.dt)
		require.NoError(t, err, tc.dt)
		assert.Equal(t, tc.want, string(got), tc.dt)
		assert.LessOrEqual(t, len(got), 2+len(tc.data)/tc.dt.Size()*jsonValueBytes(tc.dt), "%s within its estimate", tc.dt)
	}
}
