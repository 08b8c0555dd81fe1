package grpcapi

import (
	"context"
	"fmt"
	"net"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/inferencepb"
	"github.com/stepserve/stepserve/server/triton"
	"github.com/stepserve/stepserve/serving"
)

// RPCs the server does not implement (CUDA shared memory) answer
// Unimplemented.

// grpcMaxStreams bounds the requests one gRPC connection may have in
// flight: far above what a client pipelines (the benchmark runs 64), so
// that one connection cannot hold a goroutine per stream without bound.
const grpcMaxStreams = 1024

// grpcServer is the GRPCInferenceService of a [Server].
type grpcServer struct {
	inferencepb.UnimplementedGRPCInferenceServiceServer
	s      *API
	health *grpcHealth
}

// grpcState is what [Server.ServeGRPC] starts and [Server.StopGRPC] stops.
type grpcState struct {
	mu     sync.Mutex
	server *grpc.Server
	health *grpcHealth
}

// Server builds the gRPC server of the API: the inference service and
// the health service, with s's limits, tokens and metrics. Requests over
// gRPC are counted with protocol="grpc" from now on. Serve it with
// [API.Serve], or on a listener of the caller's own (tests).
func (s *API) Server() *grpc.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.server != nil {
		return s.server
	}
	s.c.Metrics.Serve(core.ProtocolGRPC)
	h := newGRPCHealth(s.c)
	opts := []grpc.ServerOption{
		// A message is a request body: the same bound.
		grpc.MaxRecvMsgSize(int(min(s.c.Opts.MaxBodyBytes, 1<<31-1))),
		// Responses are bounded before they run (server.max_response_bytes,
		// from their shapes); the rest are small.
		grpc.MaxSendMsgSize(int(min(max(s.c.Opts.MaxResponseBytes, 4<<20)+64<<10, 1<<31-1))),
		grpc.MaxConcurrentStreams(grpcMaxStreams),
		// Fixed windows, each stream's charged to the budget (gate.go).
		grpc.InitialWindowSize(grpcStreamWindow),
		grpc.InitialConnWindowSize(grpcConnWindow),
		grpc.InTapHandle(s.tapStream),
		grpc.NumStreamWorkers(grpcStreamWorkers),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Every method is served as a stream (gate.go): the stream
		// interceptors are every call's.
		grpc.ForceServerCodecV2(grpcCodec{CodecV2: encoding.GetCodecV2(protoenc.Name), api: s}),
		grpc.ChainStreamInterceptor(s.grpcRecoverStream, s.grpcAuthStream),
	}
	if s.c.Opts.IdleTimeout > 0 {
		// A connection with no call in progress is closed after the idle
		// timeout, as HTTP's keep-alive connections are: idle clients do
		// not hold descriptors for ever.
		opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: s.c.Opts.IdleTimeout}))
	}
	if s.c.Opts.Conns != nil {
		opts = append(opts, grpc.StatsHandler(s.c.Opts.Conns.GRPCStats()))
	}
	if s.c.Opts.TLS != nil {
		// The handshake runs on the connection's own goroutine, under
		// the connection limit's listener.
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.c.Opts.TLS)))
	}
	gs := grpc.NewServer(opts...)
	gs.RegisterService(s.gated(grpcServiceDesc()), &grpcServer{s: s, health: h})
	gs.RegisterService(s.gated(&healthpb.Health_ServiceDesc), healthpb.HealthServer(h))
	s.server, s.health = gs, h
	return gs
}

// Serve serves the gRPC API on ln until [API.Stop]; it returns
// as [grpc.Server.Serve] does.
func (s *API) Serve(ln net.Listener) error {
	if s.c.Opts.Conns != nil {
		ln = s.c.Opts.Conns.Listen(ln)
	}
	return s.Server().Serve(ln)
}

// Stop stops the gRPC API gracefully: the health service answers
// NOT_SERVING, new streams are refused, and requests in flight are
// answered. When ctx ends first, the connections are closed. It does
// nothing when the gRPC API is not served.
func (s *API) Stop(ctx context.Context) {
	s.mu.Lock()
	gs, h := s.server, s.health
	s.mu.Unlock()
	if gs == nil {
		return
	}
	h.shutdown()
	if ctx.Err() != nil {
		gs.Stop() // the grace is spent: no graceful stop to wait for
		return
	}
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.c.Logger.Warn("shutdown grace ran out; closing open gRPC connections")
		gs.Stop()
		<-done
	}
}

// Drain begins a shutdown: the health service answers NOT_SERVING from
// now on, on the connections open and on new ones, while the listener
// stays open and the requests in flight finish. [API.Stop] ends it.
func (s *API) Drain() {
	s.mu.Lock()
	h := s.health
	s.mu.Unlock()
	if h != nil {
		h.shutdown()
	}
}

// grpcHealth is grpc.health.v1 answering from the model set's readiness,
// as GET /v2/health/ready does: the services "" (the server),
// "inference.GRPCInferenceService" and "ready" are SERVING when every
// model has loaded and warmed up; "live" is SERVING while the process
// runs (for a liveness probe). During a shutdown every service is
// NOT_SERVING. Check reads readiness at each call; a Watch stream follows
// it within a second, and ends once it has said NOT_SERVING at a
// shutdown, so that it does not hold the graceful stop.
type grpcHealth struct {
	*health.Server
	s    *core.Core
	stop chan struct{} // closed at shutdown
	mu   sync.Mutex
	down bool
}

// grpcHealthReady are the services whose status is the server's readiness.
var grpcHealthReady = []string{"", inferencepb.GRPCInferenceService_ServiceDesc.ServiceName, "ready"}

func newGRPCHealth(s *core.Core) *grpcHealth {
	h := &grpcHealth{Server: health.NewServer(), s: s, stop: make(chan struct{})}
	h.SetServingStatus("live", healthpb.HealthCheckResponse_SERVING)
	h.refresh()
	return h
}

// refresh sets the readiness services' status from the model set.
func (h *grpcHealth) refresh() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down {
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok, _ := h.s.Opts.Models.Ready(); ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range grpcHealthReady {
		h.SetServingStatus(name, st)
	}
}

func (h *grpcHealth) shutdown() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down {
		h.down = true
		close(h.stop)
		h.Shutdown()
	}
}

// Check answers from readiness as it is at the call.
func (h *grpcHealth) Check(ctx context.Context, in *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.refresh()
	return h.Server.Check(ctx, in)
}

// watchEvery is how often a Watch stream reads readiness.
const watchEvery = time.Second

// Watch sends the service's status, then each change of it, as
// health.Server's Watch does, reading readiness every watchEvery; at a
// shutdown it sends NOT_SERVING and ends.
func (h *grpcHealth) Watch(in *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	last := healthpb.HealthCheckResponse_ServingStatus(-1)
	for {
		st := healthpb.HealthCheckResponse_SERVICE_UNKNOWN
		if r, err := h.Check(stream.Context(), in); err == nil {
			st = r.Status
		}
		if st != last {
			if err := stream.Send(&healthpb.HealthCheckResponse{Status: st}); err != nil {
				return err
			}
			last = st
		}
		select {
		case <-h.stop:
			if st == healthpb.HealthCheckResponse_NOT_SERVING || st == healthpb.HealthCheckResponse_SERVICE_UNKNOWN {
				return nil
			}
		case <-stream.Context().Done():
			return status.FromContextError(stream.Context().Err()).Err()
		case <-t.C:
		}
	}
}

// grpcScope is the tokens that guard an RPC, as they guard its HTTP
// endpoint: the repository scope's for Repository*, TraceSetting and
// LogSettings; for RepositoryIndex, which only reads, the inference
// scope's while model control is off and the repository scope has no
// token ([core.IndexAuth]); for the shared-memory RPCs the repository
// scope's, closed with the administrator's while only inference has
// tokens ([core.Core.SharedMemoryTokens]); the inference scope's for the
// service's other RPCs; none for ServerLive, ServerReady, ServerMetadata
// and health.
func (s *API) grpcScope(fullMethod string) *core.Tokens {
	service, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok || service != inferencepb.GRPCInferenceService_ServiceDesc.ServiceName {
		return nil
	}
	switch {
	case method == "ServerLive" || method == "ServerReady" || method == "ServerMetadata":
		return nil
	case method == "RepositoryIndex" && !s.c.Opts.ModelControl && s.c.RepositoryTokens.None():
		return s.c.InferenceTokens
	case isSharedMemoryMethod(method):
		return s.c.SharedMemoryTokens()
	case strings.HasPrefix(method, "Repository") || adminMethod(fullMethod):
		return s.c.RepositoryTokens
	}
	return s.c.InferenceTokens
}

// adminMethod reports whether fullMethod is one of the administrator's
// RPCs (TraceSetting, LogSettings): behind the repository token, and
// closed while only inference has tokens, as their HTTP endpoints are.
func adminMethod(fullMethod string) bool {
	return fullMethod == inferencepb.GRPCInferenceService_TraceSetting_FullMethodName ||
		fullMethod == inferencepb.GRPCInferenceService_LogSettings_FullMethodName ||
		isSharedMemoryMethod(strings.TrimPrefix(fullMethod, "/"+inferencepb.GRPCInferenceService_ServiceDesc.ServiceName+"/"))
}

// grpcAuthorize requires one of the scope's tokens as "authorization:
// Bearer <token>" metadata, as the HTTP API requires the header.
func grpcAuthorize(ctx context.Context, t *core.Tokens) error {
	if t.None() {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var given string
	var ok bool
	if v := md.Get("authorization"); len(v) > 0 {
		given, ok = core.BearerToken(v[0])
	}
	switch {
	case !ok:
		return status.Error(codes.Unauthenticated, "missing bearer token: send authorization: Bearer <token> metadata")
	case !t.Match(given):
		return status.Error(codes.Unauthenticated, "invalid bearer token")
	}
	return nil
}

// grpcAuthStream requires the token of the call's scope before the call's
// handler runs (and so before its message is read), and keeps
// TraceSetting and LogSettings closed while the administrator's endpoints
// are (as HTTP's trace and logging endpoints).
func (s *API) grpcAuthStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if adminMethod(info.FullMethod) && s.c.AdminClosed() {
		return status.Error(codes.PermissionDenied, core.AdminClosedMsg)
	}
	if err := grpcAuthorize(ss.Context(), s.grpcScope(info.FullMethod)); err != nil {
		return err
	}
	return handler(srv, ss)
}

// grpcRecoverStream answers a handler's panic with Internal, as net/http
// survives one in an HTTP handler: the server keeps serving.

func (s *API) grpcRecoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer s.recoverGRPC(info.FullMethod, &err)
	return handler(srv, ss)
}

func (s *API) recoverGRPC(method string, err *error) {
	if p := recover(); p != nil {
		s.c.Logger.Error("gRPC handler panicked", "method", method, "panic", p, "stack", string(debug.Stack()))
		*err = status.Error(codes.Internal, "internal error")
	}
}

func (g *grpcServer) ServerLive(context.Context, *inferencepb.ServerLiveRequest) (*inferencepb.ServerLiveResponse, error) {
	return &inferencepb.ServerLiveResponse{Live: true}, nil
}

func (g *grpcServer) ServerReady(context.Context, *inferencepb.ServerReadyRequest) (*inferencepb.ServerReadyResponse, error) {
	ok, _ := g.s.c.Opts.Models.Ready()
	return &inferencepb.ServerReadyResponse{Ready: ok}, nil
}

// ServerMetadata answers what GET /v2 answers.
func (g *grpcServer) ServerMetadata(context.Context, *inferencepb.ServerMetadataRequest) (*inferencepb.ServerMetadataResponse, error) {
	v, err := g.s.c.ServerMetadata(nil)
	if err != nil {
		return nil, core.GRPCError(err)
	}
	md, _ := v.(map[string]any)
	ext, _ := md["extensions"].([]string)
	return &inferencepb.ServerMetadataResponse{Name: "stepserve", Version: g.s.c.Opts.Version, Extensions: ext}, nil
}

// ModelReady is ready: false for a model that is loading or whose device
// is down, and, as Triton answers, for one the repository holds that is
// not loaded (unloaded, or failed to load); NotFound for a name the
// repository does not hold.
func (g *grpcServer) ModelReady(ctx context.Context, r *inferencepb.ModelReadyRequest) (*inferencepb.ModelReadyResponse, error) {
	m, err := g.s.c.Lookup(r.GetName(), r.GetVersion())
	if err != nil {
		if index, ierr := g.s.c.Index(ctx, false); ierr == nil && slices.ContainsFunc(index, func(e serving.IndexEntry) bool {
			return e.Name == r.GetName() && (r.GetVersion() == "" || e.Version == "" || e.Version == r.GetVersion())
		}) {
			return &inferencepb.ModelReadyResponse{Ready: false}, nil
		}
		return nil, core.GRPCError(err)
	}
	return &inferencepb.ModelReadyResponse{Ready: m.Ready()}, nil
}

func (g *grpcServer) ModelMetadata(ctx context.Context, r *inferencepb.ModelMetadataRequest) (*inferencepb.ModelMetadataResponse, error) {
	m, err := g.s.c.Lookup(r.GetName(), r.GetVersion())
	if err != nil {
		return nil, core.GRPCError(err)
	}
	mm := m.Model()
	tensors := func(specs []models.TensorSpec) []*inferencepb.ModelMetadataResponse_TensorMetadata {
		out := make([]*inferencepb.ModelMetadataResponse_TensorMetadata, len(specs))
		for i, sp := range specs {
			shape := make([]int64, len(sp.Shape))
			for d, n := range sp.Shape {
				shape[d] = int64(n)
			}
			out[i] = &inferencepb.ModelMetadataResponse_TensorMetadata{Name: sp.Name, Datatype: string(sp.Datatype), Shape: shape}
		}
		return out
	}
	return &inferencepb.ModelMetadataResponse{
		Name:     mm.Name,
		Versions: []string{mm.Version},
		Platform: mm.Platform(),
		Inputs:   tensors(mm.Config.Inputs),
		Outputs:  tensors(mm.Config.Outputs),
	}, nil
}

// checkRepository refuses a repository other than the one stepserve
// serves from: it has one, which an empty name means.
func checkRepository(name string) error {
	if name != "" {
		return apierr.BadRequest(fmt.Sprintf("repository_name %q: stepserve serves one model repository; leave repository_name empty", apierr.ClipName(name)))
	}
	return nil
}

// RepositoryIndex lists the repository's models. It only reads, so it
// answers with model control off too, as Triton's does and the HTTP
// index does.
func (g *grpcServer) RepositoryIndex(ctx context.Context, r *inferencepb.RepositoryIndexRequest) (*inferencepb.RepositoryIndexResponse, error) {
	if err := checkRepository(r.GetRepositoryName()); err != nil {
		return nil, core.GRPCError(err)
	}
	index, err := g.s.c.Index(ctx, r.GetReady())
	if err != nil {
		return nil, core.GRPCError(err)
	}
	out := &inferencepb.RepositoryIndexResponse{Models: make([]*inferencepb.RepositoryIndexResponse_ModelIndex, len(index))}
	for i, e := range index {
		out.Models[i] = &inferencepb.RepositoryIndexResponse_ModelIndex{Name: e.Name, Version: e.Version, State: e.State, Reason: e.Reason}
	}
	return out, nil
}

// RepositoryModelLoad loads a model from its model.yaml, with the
// scheduling keys of a "config" parameter applied over it as the HTTP
// load does; file: parameters and any other are refused, named.
func (g *grpcServer) RepositoryModelLoad(ctx context.Context, r *inferencepb.RepositoryModelLoadRequest) (*inferencepb.RepositoryModelLoadResponse, error) {
	if err := g.s.c.Control(); err != nil {
		return nil, core.GRPCError(err)
	}
	if err := checkRepository(r.GetRepositoryName()); err != nil {
		return nil, core.GRPCError(err)
	}
	var override serving.Override
	for key, p := range r.GetParameters() {
		switch {
		case key == "config":
			var err error
			if override, err = triton.ConfigOverride(p.GetStringParam(), r.GetModelName()); err != nil {
				return nil, core.GRPCError(err)
			}
		case strings.HasPrefix(key, "file:"):
			return nil, core.GRPCError(apierr.BadRequest(fmt.Sprintf("failed to load %s, load parameter %q: model files sent with the load are not supported; put them in the model repository", core.QuoteModel(r.GetModelName()), apierr.ClipName(key))))
		default:
			return nil, core.GRPCError(apierr.BadRequest(fmt.Sprintf("failed to load %s, load parameter %q is not supported; want config", core.QuoteModel(r.GetModelName()), apierr.ClipName(key))))
		}
	}
	if err := g.s.c.Load(ctx, r.GetModelName(), override); err != nil {
		return nil, core.GRPCError(err)
	}
	return &inferencepb.RepositoryModelLoadResponse{}, nil
}

// RepositoryModelUnload unloads a model. unload_dependents, which
// Triton's client always sends, is accepted: stepserve models have no
// dependents.
func (g *grpcServer) RepositoryModelUnload(ctx context.Context, r *inferencepb.RepositoryModelUnloadRequest) (*inferencepb.RepositoryModelUnloadResponse, error) {
	if err := g.s.c.Control(); err != nil {
		return nil, core.GRPCError(err)
	}
	if err := checkRepository(r.GetRepositoryName()); err != nil {
		return nil, core.GRPCError(err)
	}
	for key, p := range r.GetParameters() {
		if _, isBool := p.GetParameterChoice().(*inferencepb.ModelRepositoryParameter_BoolParam); key != "unload_dependents" || !isBool {
			return nil, core.GRPCError(apierr.BadRequest(fmt.Sprintf("unload parameter %q is not supported; only unload_dependents (bool) is", apierr.ClipName(key))))
		}
	}
	if err := g.s.c.Unload(ctx, r.GetModelName()); err != nil {
		return nil, core.GRPCError(err)
	}
	return &inferencepb.RepositoryModelUnloadResponse{}, nil
}

// rawInfer is a ModelInfer message as it arrived, before decoding: the
// handler bounds and charges what it decodes to first (grpc_limits.go).
type rawInfer struct {
	// mu guards buf and held: a read past server.read_timeout ends the
	// handler (which frees the message) while the read goes on, and the
	// gate frees what it brings once it ends (gate.go).
	mu   sync.Mutex
	buf  mem.Buffer
	held *core.Charge // what the undecoded message holds of the budget, given back with it
}

func (r *rawInfer) bytes() []byte {
	if r.buf == nil {
		return nil
	}
	return r.buf.ReadOnlyData()
}

// free gives the message's buffer back to gRPC's pool, once.
func (r *rawInfer) free() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.freeLocked()
}

func (r *rawInfer) freeLocked() {
	if r.buf != nil {
		r.buf.Free()
		r.buf = nil
	}
	if r.held != nil {
		r.held.Release()
		r.held = nil
	}
}

// grpcCodec is gRPC's protobuf codec but for rawInfer, whose bytes it
// keeps undecoded, and for outgoing messages, which it charges to the
// budget until gRPC has written them (outbound.go).
type grpcCodec struct {
	encoding.CodecV2
	api *API
}

func (c grpcCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*rawInfer); ok {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.freeLocked() // a second message on a unary call replaces the first
		r.buf = data.MaterializeToBuffer(mem.DefaultBufferPool())
		return nil
	}
	return c.CodecV2.Unmarshal(data, v)
}

// grpcServiceDesc is the inference service with its ModelInfer handler
// taking the message undecoded.
func grpcServiceDesc() *grpc.ServiceDesc {
	d := inferencepb.GRPCInferenceService_ServiceDesc
	d.Methods = slices.Clone(d.Methods)
	for i := range d.Methods {
		if d.Methods[i].MethodName == "ModelInfer" {
			d.Methods[i].Handler = grpcModelInferHandler
		}
	}
	return &d
}

// grpcModelInferHandler is the generated ModelInfer handler, but reading
// the message as rawInfer: the interceptors (recovery, tokens) see it
// before anything is decoded.
func grpcModelInferHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(rawInfer)
	defer in.free() // when an interceptor refuses the call before the handler runs
	if err := dec(in); err != nil {
		return nil, err
	}
	handle := func(ctx context.Context, req any) (any, error) {
		return srv.(*grpcServer).modelInferRaw(ctx, req.(*rawInfer))
	}
	if interceptor == nil {
		return handle(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: inferencepb.GRPCInferenceService_ModelInfer_FullMethodName}
	return interceptor(ctx, in, info, handle)
}

// grpcStreamWorkers are the goroutines kept to run calls. A call that
// finds every one busy runs on a goroutine of its own, whose stack starts
// small and is copied as it grows through the call (the handler's depth:
// interceptors, the gate, the request path): with two workers and 64
// calls in flight, stack growth was 23% of the server's CPU. A worker's
// stack stays grown between calls; 256 of them hold the calls in flight
// of most clients (each waits on its step, so a worker serves one call at
// a time) for a few MiB.
const grpcStreamWorkers = 256
