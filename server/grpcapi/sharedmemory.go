package grpcapi

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/inferencepb"
	"github.com/stepserve/stepserve/server/shm"
)

// Triton's system shared-memory extension over gRPC: the HTTP endpoints'
// operations ([core.SharedMemory]), their checks and messages, and the
// same tokens ([core.Core.SharedMemoryTokens]). CUDA shared memory
// answers UNIMPLEMENTED naming the extension.

// SystemSharedMemoryStatus is every region, or the one named (NOT_FOUND
// when there is none), by name.
func (g *grpcServer) SystemSharedMemoryStatus(ctx context.Context, r *inferencepb.SystemSharedMemoryStatusRequest) (*inferencepb.SystemSharedMemoryStatusResponse, error) {
	regions, err := g.s.c.SharedMemory.Status(r.GetName())
	if err != nil {
		return nil, core.GRPCError(err)
	}
	out := &inferencepb.SystemSharedMemoryStatusResponse{Regions: make(map[string]*inferencepb.SystemSharedMemoryStatusResponse_RegionStatus, len(regions))}
	for _, st := range regions {
		out.Regions[st.Name] = &inferencepb.SystemSharedMemoryStatusResponse_RegionStatus{
			Name: st.Name, Key: st.Key, Offset: uint64(st.Offset), ByteSize: uint64(st.ByteSize)}
	}
	return out, nil
}

// SystemSharedMemoryRegister maps a range of a POSIX shared-memory object
// as a region: INVALID_ARGUMENT naming what is wrong, ALREADY_EXISTS for a
// name registered already.
func (g *grpcServer) SystemSharedMemoryRegister(ctx context.Context, r *inferencepb.SystemSharedMemoryRegisterRequest) (*inferencepb.SystemSharedMemoryRegisterResponse, error) {
	if err := g.s.c.SharedMemory.Register(r.GetName(), r.GetKey(), r.GetOffset(), r.GetByteSize()); err != nil {
		return nil, core.GRPCError(err)
	}
	return &inferencepb.SystemSharedMemoryRegisterResponse{}, nil
}

// SystemSharedMemoryUnregister unregisters the region named, or every
// region when the name is empty, and answers once no request holds them.
func (g *grpcServer) SystemSharedMemoryUnregister(ctx context.Context, r *inferencepb.SystemSharedMemoryUnregisterRequest) (*inferencepb.SystemSharedMemoryUnregisterResponse, error) {
	if err := g.s.c.SharedMemory.Unregister(ctx, r.GetName()); err != nil {
		return nil, core.GRPCError(err)
	}
	return &inferencepb.SystemSharedMemoryUnregisterResponse{}, nil
}

// errCUDASharedMemory refuses to register CUDA shared memory.
var errCUDASharedMemory = status.Error(codes.Unimplemented, "the cuda_shared_memory extension is not supported by stepserve; "+shm.CUDAInstead)

// CudaSharedMemoryStatus lists no region, as a Triton without GPUs
// answers; a region named is not found.
func (g *grpcServer) CudaSharedMemoryStatus(_ context.Context, r *inferencepb.CudaSharedMemoryStatusRequest) (*inferencepb.CudaSharedMemoryStatusResponse, error) {
	if r.GetName() != "" {
		return nil, status.Errorf(codes.NotFound, "Unable to find cuda shared memory region: %q", apierr.ClipName(r.GetName()))
	}
	return &inferencepb.CudaSharedMemoryStatusResponse{}, nil
}

func (g *grpcServer) CudaSharedMemoryRegister(context.Context, *inferencepb.CudaSharedMemoryRegisterRequest) (*inferencepb.CudaSharedMemoryRegisterResponse, error) {
	return nil, errCUDASharedMemory
}

// CudaSharedMemoryUnregister succeeds: no region is held (clients
// unregister everything at start and at exit).
func (g *grpcServer) CudaSharedMemoryUnregister(context.Context, *inferencepb.CudaSharedMemoryUnregisterRequest) (*inferencepb.CudaSharedMemoryUnregisterResponse, error) {
	return &inferencepb.CudaSharedMemoryUnregisterResponse{}, nil
}

// isSharedMemoryMethod reports whether method (of the inference service)
// is one of the shared-memory extensions'.
func isSharedMemoryMethod(method string) bool {
	switch method {
	case "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
		"CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister":
		return true
	}
	return false
}
