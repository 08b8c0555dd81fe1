package core

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/stats"

	"github.com/prometheus/client_golang/prometheus"
)

// ConnLimitOptions configure a [ConnLimit].
type ConnLimitOptions struct {
	// Max is the most connections open at once; it must be positive.
	Max int
	// Listener names the listener in the metrics' listener label and the
	// log: api, metrics.
	Listener string
	// Key is the configuration key that sets Max, named in the 503 and
	// the log; empty when no key does.
	Key        string
	Logger     *slog.Logger          // nil discards
	Registerer prometheus.Registerer // nil registers no metrics
}

// ConnLimit bounds the connections one listener holds open, so that
// clients cannot take every file descriptor and leave none for the
// process's other listeners, files and workers.
//
// A connection that arrives at the limit takes the place of the one that
// has waited longest without a request in progress (an idle keep-alive
// connection, or one that has sent nothing yet): its client reconnects
// when it next needs to, as after an idle timeout. nginx reuses its
// keep-alive connections the same way. Only when every connection is busy
// with a request is the newcomer refused: answered 503 at once and closed.
// Accept never waits for a free slot: a connection left in the kernel's
// backlog looks to its client, and to a health probe, like a server that
// hangs.
//
// A ConnLimit serves one [http.Server] ([ConnLimit.Serve]) and, sharing
// the same bound, a gRPC server's listener ([ConnLimit.Listen]): one
// budget of connections for both doors, so that neither can take the
// descriptors the other needs. A gRPC connection is busy while it has a
// call in progress ([ConnLimit.GRPCStats] tells the limit); one refused
// is closed at once (HTTP/2 has no answer to give before its preface).
type ConnLimit struct {
	opts   ConnLimitOptions
	logger *slog.Logger
	// refusal is the whole HTTP response a refused connection gets.
	refusal string

	mu   sync.Mutex
	open int
	// waiting holds the open connections with no request in progress,
	// longest-waiting first.
	waiting  idleList
	lastWarn time.Time
	// grpc is the open gRPC connections by remote address, for the stats
	// handler to find the connection a call runs on.
	grpc map[string]*limitedConn

	closedIdle, refused prometheus.Counter
}

// NewConnLimit makes the limit opts describe and registers its metrics:
// stepserve_connections_open, stepserve_connections_max,
// stepserve_connections_closed_idle_total and
// stepserve_connections_refused_total, labelled with the listener.
func NewConnLimit(opts ConnLimitOptions) (*ConnLimit, error) {
	if opts.Max < 1 {
		return nil, fmt.Errorf("server: ConnLimitOptions.Max is %d; want at least 1", opts.Max)
	}
	l := &ConnLimit{opts: opts, logger: opts.Logger, grpc: map[string]*limitedConn{}}
	if l.logger == nil {
		l.logger = slog.New(slog.DiscardHandler)
	}
	key := ""
	if opts.Key != "" {
		key = " (" + opts.Key + ")"
	}
	body := fmt.Sprintf(`{"error":"the server has %d connections open, every one busy with a request%s; retry shortly"}`+"\n", opts.Max, key)
	l.refusal = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body

	labels := prometheus.Labels{"listener": opts.Listener}
	l.closedIdle = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "stepserve_connections_closed_idle_total", ConstLabels: labels,
		Help: "Connections without a request in progress closed to make room for a new one at the connection limit.",
	})
	l.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "stepserve_connections_refused_total", ConstLabels: labels,
		Help: "Connections answered 503 and closed at the connection limit because every open one was busy with a request.",
	})
	collectors := []prometheus.Collector{
		l.closedIdle, l.refused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "stepserve_connections_open", ConstLabels: labels,
			Help: "Client connections open on the listener.",
		}, func() float64 { l.mu.Lock(); defer l.mu.Unlock(); return float64(l.open) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "stepserve_connections_max", ConstLabels: labels,
			Help: "The most client connections the listener holds open.",
		}, func() float64 { return float64(opts.Max) }),
	}
	if opts.Registerer != nil {
		for _, c := range collectors {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return l, nil
}

// Serve serves hs on ln within the limit; it returns as hs.Serve does. It
// sets hs.ConnState, which tells the limit which connections are busy.
//
// With hs.TLSConfig set it serves TLS: the handshake runs on the
// connection's own goroutine, above the limit, and a connection refused
// is closed (a client waiting for a TLS handshake cannot read a 503).
func (l *ConnLimit) Serve(hs *http.Server, ln net.Listener) error {
	hs.ConnState = l.track
	if hs.TLSConfig != nil {
		return hs.Serve(tls.NewListener(&limitListener{Listener: ln, limit: l, closeRefused: true}, hs.TLSConfig))
	}
	return hs.Serve(&limitListener{Listener: ln, limit: l})
}

// Listen is ln within the limit, for a gRPC server: the limit counts its
// connections with the HTTP server's, and closes one refused without an
// answer. Install [ConnLimit.GRPCStats] on the server, which tells the
// limit which of its connections are busy.
func (l *ConnLimit) Listen(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, limit: l, grpc: true, closeRefused: true}
}

type limitListener struct {
	net.Listener
	limit *ConnLimit
	grpc  bool // a gRPC server's
	// closeRefused: refusals are closed, not answered (gRPC, TLS).
	closeRefused bool
}

// Accept returns the next connection admitted; it answers and closes the
// ones refused itself.
func (ln *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc := ln.limit.admit(c, ln.grpc); lc != nil {
			return lc, nil
		}
		if ln.closeRefused {
			ln.limit.refused.Inc()
			c.Close()
			ln.limit.warn("connection limit reached with every connection busy: closing new connections")
			continue
		}
		ln.limit.refuse(c)
	}
}

// limitedConn is an admitted connection; closing it frees its slot.
type limitedConn struct {
	net.Conn
	limit *ConnLimit
	// Under limit.mu: its links in limit.waiting and whether it is in it
	// (not while a request is in progress); and whether its slot is free.
	prev, next *limitedConn
	idle       bool
	released   bool
	// grpcKey is its remote address when it is a gRPC connection, the key
	// of limit.grpc; empty otherwise.
	grpcKey string
}

// idleList is the connections without a request in progress, longest
// idle first, linked through the connections themselves: a connection
// goes in and out of it with every request, so it must not allocate.
type idleList struct {
	head, tail *limitedConn
	n          int
}

func (q *idleList) push(c *limitedConn) {
	if c.idle {
		return
	}
	c.idle, c.prev, c.next = true, q.tail, nil
	if q.tail != nil {
		q.tail.next = c
	} else {
		q.head = c
	}
	q.tail = c
	q.n++
}

func (q *idleList) remove(c *limitedConn) {
	if !c.idle {
		return
	}
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		q.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		q.tail = c.prev
	}
	c.idle, c.prev, c.next = false, nil, nil
	q.n--
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.limit.release(c)
	return err
}

// admit counts c in, first closing the longest-waiting connection if the
// limit is reached; it returns nil if every open connection is busy.
func (l *ConnLimit) admit(c net.Conn, grpc bool) *limitedConn {
	l.mu.Lock()
	if l.open >= l.opts.Max {
		victim := l.waiting.head
		if victim == nil {
			l.mu.Unlock()
			return nil
		}
		l.waiting.remove(victim)
		l.mu.Unlock()
		victim.Close() // frees its slot: open < Max from here
		l.closedIdle.Inc()
		l.warn("connection limit reached: closing the longest-idle connections to make room")
		l.mu.Lock()
	}
	l.open++
	lc := &limitedConn{Conn: c, limit: l}
	if grpc {
		lc.grpcKey = c.RemoteAddr().String()
		l.grpc[lc.grpcKey] = lc
	}
	l.waiting.push(lc) // no request yet
	l.mu.Unlock()
	return lc
}

// refuse answers c 503 and closes it. The write goes to a new socket's
// empty send buffer, so it does not wait; the deadline is a safeguard for
// the accept loop it runs on.
func (l *ConnLimit) refuse(c net.Conn) {
	l.refused.Inc() // first: counted by the time the client reads the answer
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	io.WriteString(c, l.refusal)
	c.Close()
	l.warn("connection limit reached with every connection busy: refusing new connections with 503")
}

func (l *ConnLimit) release(c *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.released {
		return
	}
	c.released = true
	l.open--
	l.waiting.remove(c)
	if c.grpcKey != "" && l.grpc[c.grpcKey] == c {
		delete(l.grpc, c.grpcKey)
	}
}

// track keeps l.waiting to the connections without a request in progress.
func (l *ConnLimit) track(c net.Conn, state http.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case http.StateIdle: // between requests
		if !lc.released {
			l.waiting.push(lc)
		}
	case http.StateActive, http.StateHijacked, http.StateClosed:
		l.waiting.remove(lc)
	}
}

// GRPCStats is the stats handler that tells the limit which gRPC
// connections have a call in progress: a connection is busy from a call's
// first header to its end, and waits (may be closed to make room) only
// between calls.
func (l *ConnLimit) GRPCStats() stats.Handler { return grpcConnStats{l} }

type grpcConnStats struct{ l *ConnLimit }

type grpcConnKey struct{}

// grpcConn is a gRPC connection as its calls see it: the limit's record
// and how many calls are in progress on it.
type grpcConn struct {
	lc     *limitedConn
	active int // under lc.limit.mu
	// atEnd run once the connection has closed (under lc.limit.mu);
	// ended says it has. closeIdle: close it once no call is in
	// progress.
	atEnd     []func()
	ended     bool
	closeIdle bool
}

// CloseGRPCConn closes the gRPC connection ctx's call runs on: every call
// on it ends, and whatever gRPC's transport holds for them (responses a
// client does not read, data sent on streams the server has ended) goes
// with it, as net/http closes a connection whose client does not read
// within the write timeout. It reports false where ctx's call runs on no
// connection of a ConnLimit.
func CloseGRPCConn(ctx context.Context) bool {
	gc, ok := ctx.Value(grpcConnKey{}).(*grpcConn)
	if !ok {
		return false
	}
	gc.lc.Close()
	return true
}

// GRPCConnCalls is how many calls are in progress on the gRPC connection
// ctx's call runs on (that call included); -1 where it runs on no
// connection of a ConnLimit.
func GRPCConnCalls(ctx context.Context) int {
	gc, ok := ctx.Value(grpcConnKey{}).(*grpcConn)
	if !ok {
		return -1
	}
	gc.lc.limit.mu.Lock()
	defer gc.lc.limit.mu.Unlock()
	return gc.active
}

// AtGRPCConnEnd runs f once the gRPC connection ctx's call runs on has
// closed (at once if it has), and returns how many functions wait for it
// so. It reports false, and does not run f, where the call runs on no
// connection of a ConnLimit.
func AtGRPCConnEnd(ctx context.Context, f func()) (waiting int, ok bool) {
	gc, ok := ctx.Value(grpcConnKey{}).(*grpcConn)
	if !ok {
		return 0, false
	}
	l := gc.lc.limit
	l.mu.Lock()
	if !gc.ended {
		gc.atEnd = append(gc.atEnd, f)
		n := len(gc.atEnd)
		l.mu.Unlock()
		return n, true
	}
	l.mu.Unlock()
	f()
	return 0, true
}

// CloseGRPCConnWhenIdle closes the gRPC connection ctx's call runs on once
// no call is in progress on it (that call's end included), as
// keepalive's MaxConnectionIdle would later. It reports false where the
// call runs on no connection of a ConnLimit.
func CloseGRPCConnWhenIdle(ctx context.Context) bool {
	gc, ok := ctx.Value(grpcConnKey{}).(*grpcConn)
	if !ok {
		return false
	}
	l := gc.lc.limit
	l.mu.Lock()
	gc.closeIdle = true
	idle := gc.active == 0
	l.mu.Unlock()
	if idle {
		gc.closeWhenIdle()
	}
	return true
}

// closeIdleGrace is how long a connection to be closed once idle stays
// idle first: the ends of its last calls reach their client, and a call
// that begins meanwhile keeps it open.
const closeIdleGrace = time.Second

// closeWhenIdle closes gc after closeIdleGrace if no call is in progress
// on it then.
func (gc *grpcConn) closeWhenIdle() {
	time.AfterFunc(closeIdleGrace, func() {
		l := gc.lc.limit
		l.mu.Lock()
		idle := gc.active == 0
		l.mu.Unlock()
		if idle {
			gc.lc.Close()
		}
	})
}

func (h grpcConnStats) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if info.RemoteAddr == nil {
		return ctx
	}
	h.l.mu.Lock()
	lc := h.l.grpc[info.RemoteAddr.String()]
	h.l.mu.Unlock()
	if lc == nil {
		return ctx
	}
	return context.WithValue(ctx, grpcConnKey{}, &grpcConn{lc: lc})
}

func (h grpcConnStats) HandleConn(ctx context.Context, st stats.ConnStats) {
	if _, ok := st.(*stats.ConnEnd); !ok {
		return
	}
	gc, ok := ctx.Value(grpcConnKey{}).(*grpcConn)
	if !ok {
		return
	}
	h.l.mu.Lock()
	gc.ended = true
	fs := gc.atEnd
	gc.atEnd = nil
	h.l.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

func (grpcConnStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (h grpcConnStats) HandleRPC(ctx context.Context, st stats.RPCStats) {
	var delta int
	switch st.(type) {
	case *stats.Begin:
		delta = 1
	case *stats.End:
		delta = -1
	default:
		return
	}
	gc, ok := ctx.Value(grpcConnKey{}).(*grpcConn)
	if !ok {
		return
	}
	h.l.mu.Lock()
	gc.active += delta
	switch {
	case gc.active > 0:
		h.l.waiting.remove(gc.lc)
	case !gc.lc.released:
		h.l.waiting.push(gc.lc)
	}
	closing := gc.active == 0 && gc.closeIdle
	h.l.mu.Unlock()
	if closing {
		gc.closeWhenIdle()
	}
}

// warnEvery spaces the limit's warnings: the counters say how often it acts.
const warnEvery = 10 * time.Second

func (l *ConnLimit) warn(msg string) {
	l.mu.Lock()
	now := time.Now()
	quiet := now.Sub(l.lastWarn) < warnEvery
	if !quiet {
		l.lastWarn = now
	}
	l.mu.Unlock()
	if !quiet {
		l.logger.Warn(msg, "listener", l.opts.Listener, "max_connections", l.opts.Max)
	}
}

// connReserve is the descriptors the default connection limit leaves for
// everything else: model files being read, the device workers' sockets and
// pipes, the metrics listener and its [MetricsConns] connections, and the
// runtime's own.
const connReserve = 256

// MetricsConns bounds the metrics listener's connections: health probes
// and a scraper or two need few.
const MetricsConns = 64

// maxDefaultConns bounds the default connection limit by memory: an idle
// connection holds about 16 KiB (its goroutine's stack and its buffers), so
// that idle connections alone take at most 256 MiB, where a descriptor
// limit of a million would let them take 16 GiB.
const maxDefaultConns = 16384

// ConnectionCap is the connection limit for the API listener: configured
// when it is positive; otherwise what the descriptor limit leaves after a
// reserve (at least half of it), and at most [maxDefaultConns]. The
// descriptor limit is RLIMIT_NOFILE's soft limit, which the Go runtime
// raises to the hard limit at start. A configured limit above what the
// descriptors leave is kept, with a warning: accept would then fail for
// want of descriptors before the limit is reached, the failure the limit
// is there to prevent.
func ConnectionCap(configured int, logger *slog.Logger) int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		if configured > 0 {
			return configured
		}
		logger.Warn("reading RLIMIT_NOFILE failed; limiting connections to 1024 (server.max_connections)", "err", err)
		return 1024
	}
	files := int(min(rl.Cur, 1<<24))
	room := max(files-connReserve, files/2)
	if configured > room {
		logger.Warn("server.max_connections is above what the descriptor limit leaves for connections; raise the limit (ulimit -n) or lower the key",
			"max_connections", configured, "rlimit_nofile", files, "room", room)
	}
	if configured > 0 {
		return configured
	}
	return min(room, maxDefaultConns)
}
