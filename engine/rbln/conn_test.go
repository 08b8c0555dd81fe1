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
	c := newConn(ours, nil)
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
	c := newConn(ours, nil)
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
// gave up arrives later; the connection counts it and goes on serving.
func TestConnLateAnswerIsNotAProtocolError(t *testing.T) {
	ours, theirs := net.Pipe()
	counted := make(chan string, 1)
	c := newConn(ours, func(kind string) { counted <- kind })
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
	assert.Equal(t, "memory", <-counted, "and was counted")
}

// TestConnCancelsAbandonedDeviceRequests: a caller that gives up on a step
// tells the worker, which can then skip it; the worker's answer that it
// did is a late one.
func TestConnCancelsAbandonedDeviceRequests(t *testing.T) {
	ours, theirs := net.Pipe()
	late := make(chan string, 1)
	c := newConn(ours, func(kind string) { late <- kind })
	defer c.close(fmt.Errorf("test over"))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		step, err := readRequest(theirs)
		if !assert.NoError(t, err) {
			return
		}
		cancel()
		next, err := readRequest(theirs)
		if assert.NoError(t, err) {
			assert.Equal(t, "cancel", next["type"])
			assert.Equal(t, step["id"], next["target"])
		}
		writeFrame(theirs, map[string]any{"type": "result", "id": step["id"], "ok": false, "error": "cancelled"})
	}()
	_, err := c.call(ctx, &stepRequest{Model: "m"})
	assert.ErrorIs(t, err, context.Canceled)
	select {
	case kind := <-late:
		assert.Equal(t, "step", kind)
	case <-time.After(5 * time.Second):
		t.Fatal("the skipped step's answer never came")
	}
}

// TestConnKnowsWhatTheWorkerBuilds: between its "building" word and the
// result, a request is what the liveness rule sees being built.
func TestConnKnowsWhatTheWorkerBuilds(t *testing.T) {
	ours, theirs := net.Pipe()
	c := newConn(ours, nil)
	defer c.close(fmt.Errorf("test over"))
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, err := readRequest(theirs)
		if !assert.NoError(t, err) {
			return
		}
		writeFrame(theirs, map[string]any{"type": "building", "id": req["id"]})
		assert.Eventually(t, func() bool { return c.health().building == "compile of m.1 bucket 2" }, 5*time.Second, time.Millisecond)
		go c.ping()
		ping, err := readRequest(theirs)
		assert.NoError(t, err)
		assert.Equal(t, "ping", ping["type"])
		assert.False(t, c.health().pinged.IsZero(), "a ping is out")
		writeFrame(theirs, map[string]any{"type": "result", "id": req["id"], "ok": true})
	}()
	_, err := c.call(context.Background(), &compileRequest{Model: "m.1", Bucket: 2})
	assert.NoError(t, err)
	<-done
	assert.Empty(t, c.health().building, "built")
}
