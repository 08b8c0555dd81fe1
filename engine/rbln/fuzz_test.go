package rbln

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/stepserve/stepserve/engine"
)

// FuzzReadFrame feeds arbitrary bytes from a "worker": the supervisor must
// never panic, and must refuse anything but well-formed messages of the
// known types.
func FuzzReadFrame(f *testing.F) {
	frame := func(s string) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s...)
	}
	f.Add(frame(`{"type":"hello","protocol":1,"pid":7,"torch":"2.5","device":"rbln:0"}`))
	f.Add(frame(`{"type":"result","id":3,"ok":true,"explain":{"measured":true,"clean":true,"h2d":1,"d2h":1}}`))
	f.Add(frame(`{"type":"pong","id":1}`))
	f.Add(frame(`{"type":"result","id":1,"ok":false,"error":"RuntimeError: x"}`))
	f.Add(frame(`not json`))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			m, err := readFrame(r)
			if err != nil {
				if !errors.Is(err, ErrProtocol) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				return
			}
			switch m.Type {
			case "hello", "result", "pong":
			default:
				t.Fatalf("accepted type %q", m.Type)
			}
			// Whatever a result holds, a decoded count is measured (>= 0)
			// or Unknown: never some other negative number.
			var r stepReply
			if m.decode("step result", &r) == nil {
				x := r.Explain
				for _, c := range []engine.Count{x.CPUFallbacks, x.Recompiles, x.HostBounces, x.HostBounceBytes, x.H2D, x.D2H, x.WallNS} {
					if c < engine.Unknown {
						t.Fatalf("count decoded as %d", c)
					}
				}
			}
			var hi hello
			_ = m.decode("hello", &hi)
		}
	})
}
