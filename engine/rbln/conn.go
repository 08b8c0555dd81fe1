// The control connection to one worker process: requests written over the
// inherited socket, results matched to their callers by id, what the worker
// was last heard saying (for the liveness rule), and every call in flight
// failed at once when the socket breaks.

package rbln

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/stepserve/stepserve/engine"
)

// conn is the control channel to one process. Its methods may be called
// from several goroutines.
type conn struct {
	nc net.Conn
	// late is told the kind of each result that came after its caller had
	// given up; nil to ignore them.
	late func(kind string)
	// bell is the life's binary step path; nil in tests of the socket
	// alone.
	bell *doorbell

	wmu     sync.Mutex // one writer at a time
	mu      sync.Mutex
	next    uint64
	pending map[uint64]*pendingCall
	heard   time.Time // when the worker last sent anything
	pingID  uint64    // the unanswered ping's id; 0 when none
	pinged  time.Time // when it was sent
	// building is the request the worker said it is building a graph for;
	// nil when none.
	building *pendingCall
	dead     chan struct{} // closed with err set once the connection fails
	err      error
}

// pendingCall is a request that awaits its result.
type pendingCall struct {
	req       request
	ch        chan *message // buffered; nil for pings, which nobody waits on
	abandoned bool          // its caller gave up: the result is late
	since     time.Time     // when the worker started building for it
}

// newConn takes over nc and starts reading results from it.
func newConn(nc net.Conn, late func(kind string)) *conn {
	c := &conn{nc: nc, late: late, pending: map[uint64]*pendingCall{}, heard: time.Now(), dead: make(chan struct{})}
	go c.read()
	return c
}

// errSocketClosed is the connection's error when the worker's end closed:
// it is exiting (or died), and its exit status says more.
var errSocketClosed = errors.New("control socket closed")

// read delivers results to their callers until the stream ends or breaks.
func (c *conn) read() {
	r := bufio.NewReader(c.nc)
	for {
		m, err := readFrame(r)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
				err = fmt.Errorf("%w: %w", errWorkerDown, errSocketClosed)
			}
			c.close(err)
			return
		}
		now := time.Now()
		c.mu.Lock()
		c.heard = now
		pc := c.pending[m.ID]
		if pc != nil && m.Type == "building" {
			pc.since = now
			c.building = pc
			c.mu.Unlock()
			continue
		}
		delete(c.pending, m.ID)
		if c.building == pc {
			c.building = nil
		}
		if m.ID == c.pingID {
			c.pingID = 0
		}
		abandoned := pc != nil && pc.abandoned
		c.mu.Unlock()
		switch {
		case pc == nil:
			c.close(fmt.Errorf("%w: %s for unknown request %d", ErrProtocol, m.Type, m.ID))
			return
		case abandoned:
			// Expected (a compile outlived a load request's client, a
			// memory poll waited behind a compile holding the
			// interpreter), counted, and never worth a restart.
			if c.late != nil {
				c.late(pc.req.kind())
			}
		case pc.ch != nil:
			pc.ch <- m
		}
	}
}

// call sends req with a fresh id and waits for the message that answers
// it, the connection's failure, or ctx. A request may be sent only once.
// A caller that gives up on a device request the worker has not started
// makes the worker skip it.
func (c *conn) call(ctx context.Context, req request) (*message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	pc := &pendingCall{req: req, ch: make(chan *message, 1)}
	id, err := c.send(req, pc)
	if err != nil {
		return nil, err
	}
	select {
	case m := <-pc.ch:
		return m, nil
	case <-c.dead:
		if req.kind() == "step" {
			// Sent, and the worker went down under it.
			return nil, fmt.Errorf("%w: %w", engine.ErrStepLost, c.err)
		}
		return nil, c.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	_, waiting := c.pending[id]
	pc.abandoned = waiting
	c.mu.Unlock()
	if !waiting { // answered meanwhile
		select {
		case m := <-pc.ch:
			return m, nil
		case <-c.dead:
			return nil, c.err
		}
	}
	// The entry stays until the worker answers, so that the answer is
	// known for a late one and not taken for a protocol error.
	if queued(req) {
		go c.notify(&cancelRequest{Target: id}) // not to wait on a full socket
	}
	return nil, ctx.Err()
}

// send registers pc under a fresh id and writes req with it.
func (c *conn) send(req request, pc *pendingCall) (uint64, error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return 0, c.err
	}
	c.next++
	id := c.next
	c.pending[id] = pc
	c.mu.Unlock()
	req.address(req.kind(), id)
	if err := c.write(req); err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return 0, err
	}
	return id, nil
}

// ping sends a ping unless one is unanswered; the pong is read, not waited
// for (see health).
func (c *conn) ping() {
	c.mu.Lock()
	if c.err != nil || c.pingID != 0 {
		c.mu.Unlock()
		return
	}
	c.next++
	c.pingID, c.pinged = c.next, time.Now()
	req := &pingRequest{}
	req.address(req.kind(), c.pingID)
	c.pending[c.pingID] = &pendingCall{req: req}
	c.mu.Unlock()
	c.write(req)
}

// notify sends a request that has no answer (cancel, shutdown).
func (c *conn) notify(req request) {
	req.address(req.kind(), 0)
	c.write(req)
}

// write sends one frame, with its request's descriptors if it has any. A
// request that cannot be encoded, or whose descriptors are gone, fails
// alone; a socket that fails to write fails the connection.
func (c *conn) write(req request) error {
	frame, err := encodeFrame(req)
	if err != nil {
		return err
	}
	var files []*os.File
	if r, ok := req.(interface{ files() []*os.File }); ok {
		files = r.files()
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	err = withFDs(files, nil, func(fds []int) error {
		if len(fds) == 0 {
			_, err := c.nc.Write(frame)
			return err
		}
		uc, ok := c.nc.(*net.UnixConn)
		if !ok {
			return fmt.Errorf("rbln: descriptors need a unix socket, not %T", c.nc)
		}
		n, _, err := uc.WriteMsgUnix(frame, syscall.UnixRights(fds...), nil)
		if err == nil && n < len(frame) {
			// sendmsg may take part of a large frame; the descriptors went
			// with its first byte, the rest follows as plain data.
			_, err = c.nc.Write(frame[n:])
		}
		return err
	})
	var unusable *fdError
	if errors.As(err, &unusable) {
		return err
	}
	if err != nil {
		c.close(fmt.Errorf("%w: writing to the control socket: %v", errWorkerDown, err))
		return c.err
	}
	return nil
}

// fdError says a descriptor to send could not be had (its file is closed).
type fdError struct{ err error }

func (e *fdError) Error() string { return "rbln: staging descriptor: " + e.err.Error() }

// withFDs runs fn with the descriptors of files, each held open until fn
// returns.
func withFDs(files []*os.File, fds []int, fn func([]int) error) error {
	if len(files) == 0 {
		return fn(fds)
	}
	rc, err := files[0].SyscallConn()
	if err != nil {
		return &fdError{err}
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = withFDs(files[1:], append(fds, int(fd)), fn) }); err != nil {
		return &fdError{err}
	}
	return ferr
}

// health is what the connection has seen of its worker, for the liveness
// rule ([health.verdict]).
func (c *conn) health() health {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := health{heard: c.heard}
	if c.pingID != 0 {
		h.pinged = c.pinged
	}
	if c.building != nil {
		h.building, h.buildingSince = describe(c.building.req), c.building.since
	} else if c.bell != nil {
		if ok, since := c.bell.building(); ok {
			h.building, h.buildingSince = "a step that builds a graph (a recompile)", since
		}
	}
	return h
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
	if c.bell != nil {
		c.bell.kill()
	}
}

// errOr is the connection's failure, or err while it has none.
func (c *conn) errOr(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	return err
}
