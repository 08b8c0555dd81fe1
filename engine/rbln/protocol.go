package rbln

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// protocolVersion is the control protocol both sides must speak; the
// worker announces its own in its hello.
const protocolVersion = 1

// maxFrame bounds a control message; a longer length prefix means a corrupt
// stream.
const maxFrame = 16 << 20

// ErrProtocol is wrapped by errors about a malformed message from a worker.
var ErrProtocol = errors.New("rbln: worker protocol error")

// message is every control message: its type, its request id, and the
// fields of its type.
type message struct {
	Type string `json:"type"`
	ID   uint64 `json:"id"`

	// hello
	Protocol int      `json:"protocol,omitempty"`
	PID      int      `json:"pid,omitempty"`
	Torch    string   `json:"torch,omitempty"`
	Device   string   `json:"device,omitempty"`
	Notes    []string `json:"notes,omitempty"`

	// result
	OK    bool   `json:"ok,omitempty"`
	Error string `json:"error,omitempty"`
	raw   []byte // the whole message, for typed decoding of results
}

// writeFrame writes one length-prefixed JSON message.
func writeFrame(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(body) > maxFrame {
		return fmt.Errorf("%w: message of %d bytes exceeds the %d-byte frame limit", ErrProtocol, len(body), maxFrame)
	}
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
	_, err = w.Write(append(frame, body...))
	return err
}

// readFrame reads one message. A short read is io.ErrUnexpectedEOF or
// io.EOF; bad content is ErrProtocol.
func readFrame(r io.Reader) (*message, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxFrame {
		return nil, fmt.Errorf("%w: frame length %d exceeds the %d-byte limit", ErrProtocol, n, maxFrame)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return decodeMessage(body)
}

func decodeMessage(body []byte) (*message, error) {
	var m message
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: %v (frame %q)", ErrProtocol, err, clip(body))
	}
	switch m.Type {
	case "hello", "result", "pong":
	default:
		return nil, fmt.Errorf("%w: unknown message type %q", ErrProtocol, m.Type)
	}
	m.raw = body
	return &m, nil
}

func clip(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}
