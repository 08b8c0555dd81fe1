// The control connection to one worker process: requests written over the
// inherited socket, results matched to their callers by id, and every call
// in flight failed at once when the socket breaks.

package rbln

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/stepserve/stepserve/engine"
)

// conn is the control channel to one process. Its methods may be called
// from several goroutines.
type conn struct {
	nc net.Conn

	wmu     sync.Mutex // one writer at a time
	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan *message
	dead    chan struct{} // closed with err set once the connection fails
	err     error
}

// newConn takes over nc and starts reading results from it.
func newConn(nc net.Conn) *conn {
	c := &conn{nc: nc, pending: map[uint64]chan *message{}, dead: make(chan struct{})}
	go c.read()
	return c
}

// read delivers results to their callers until the stream ends or breaks.
func (c *conn) read() {
	r := bufio.NewReader(c.nc)
	for {
		m, err := readFrame(r)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
				err = fmt.Errorf("%w: control socket closed", errWorkerDown)
			}
			c.close(err)
			return
		}
		c.mu.Lock()
		ch := c.pending[m.ID]
		delete(c.pending, m.ID)
		c.mu.Unlock()
		if ch == nil {
			c.close(fmt.Errorf("%w: result for unknown request %d", ErrProtocol, m.ID))
			return
		}
		ch <- m
	}
}

// call sends req with a fresh id and waits for the message that answers
// it, the connection's failure, or ctx. A request may be sent only once.
func (c *conn) call(ctx context.Context, req request) (*message, error) {
	ch := make(chan *message, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.next++
	id := c.next
	c.pending[id] = ch
	c.mu.Unlock()
	req.address(req.kind(), id)

	c.wmu.Lock()
	err := writeFrame(c.nc, req)
	c.wmu.Unlock()
	if err != nil {
		c.close(fmt.Errorf("%w: writing to the control socket: %v", errWorkerDown, err))
		return nil, c.err
	}
	select {
	case m := <-ch:
		return m, nil
	case <-c.dead:
		return nil, c.err
	case <-ctx.Done():
		// The entry stays until the worker answers: a late answer to a
		// call its caller gave up on is expected (a compile that outlived
		// a load request's client), not a protocol error, and must never
		// cost a restart. ch is buffered, so nobody waits on it.
		return nil, ctx.Err()
	}
}

// close fails every call in flight with err (wrapped as unavailable) and
// closes the socket.
func (c *conn) close(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	if !errors.Is(err, engine.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", errWorkerDown, err)
	}
	c.err = err
	close(c.dead)
	c.nc.Close()
}
