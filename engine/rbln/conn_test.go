package rbln

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/stepserve/stepserve/engine"
)

// readRequest reads one request as the worker sees it.
func readRequest(r io.Reader) (map[string]any, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	var req map[string]any
	return req, json.Unmarshal(body, &req)
}

// TestConnMatchesResultsToCalls has a fake worker answer concurrent calls
// in reverse order: each caller gets the result of its own request.
func TestConnMatchesResultsToCalls(t *testing.T) {
	ours, theirs := net.Pipe()
	c := newConn(ours)
	defer c.close(fmt.Errorf("test over"))

	const n = 5
	go func() {
		var reqs []map[string]any
		for range n {
			req, err := readRequest(theirs)
			if !assert.NoError(t, err) {
				return
			}
			reqs = append(reqs, req)
		}
		for i := n - 1; i >= 0; i-- {
			writeFrame(theirs, map[string]any{"type": "result", "id": reqs[i]["id"], "ok": true, "model": reqs[i]["model"]})
		}
	}()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			model := fmt.Sprintf("m%d", i)
			m, err := c.call(context.Background(), &unloadRequest{Model: model})
			if !assert.NoError(t, err) {
				return
			}
			var r struct {
				Model string `json:"model"`
			}
			assert.NoError(t, m.decode("unload result", &r))
			assert.Equal(t, model, r.Model, "the result of another call")
		})
	}
	wg.Wait()
}

// TestConnFailsCallsInFlightWhenTheSocketCloses: a worker that goes away
// fails the call waiting on it at once, as unavailable.
func TestConnFailsCallsInFlightWhenTheSocketCloses(t *testing.T) {
	ours, theirs := net.Pipe()
	c := newConn(ours)
	go func() {
		readRequest(theirs)
		theirs.Close()
	}()
	_, err := c.call(context.Background(), &stepRequest{Model: "digits"})
	assert.ErrorIs(t, err, engine.ErrUnavailable)
	assert.ErrorContains(t, err, "control socket closed")
	_, err = c.call(context.Background(), &pingRequest{})
	assert.ErrorIs(t, err, engine.ErrUnavailable, "and every call after it")
}

// TestConnLateAnswerIsNotAProtocolError: the answer to a call whose caller
// gave up arrives later; the connection takes it and goes on serving.
func TestConnLateAnswerIsNotAProtocolError(t *testing.T) {
	ours, theirs := net.Pipe()
	c := newConn(ours)
	defer c.close(fmt.Errorf("test over"))
	late := make(chan map[string]any, 1)
	go func() {
		req, err := readRequest(theirs)
		if !assert.NoError(t, err) {
			return
		}
		late <- req
	}()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-time.After(10 * time.Millisecond); cancel() }()
	_, err := c.call(ctx, &memoryRequest{})
	assert.ErrorIs(t, err, context.Canceled)

	req := <-late
	go func() {
		writeFrame(theirs, map[string]any{"type": "result", "id": req["id"], "ok": true})
		next, err := readRequest(theirs)
		if assert.NoError(t, err) {
			writeFrame(theirs, map[string]any{"type": "result", "id": next["id"], "ok": true})
		}
	}()
	_, err = c.call(context.Background(), &pingRequest{})
	assert.NoError(t, err, "the late answer did not break the connection")
}
