package grpcapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/inferencepb"
	"github.com/stepserve/stepserve/server/triton"
	"github.com/stepserve/stepserve/serving"
)

// Triton's model configuration and statistics over gRPC. Each is a
// document the HTTP API serves in Triton's JSON form, which is the
// protobuf JSON mapping of the messages gRPC sends (inference.ModelConfig,
// inference.ModelStatisticsResponse): gRPC parses the same document into
// the message, so that the two protocols cannot disagree and one function
// builds both.

// tritonConfigJSON is model m's configuration in Triton's JSON form (GET
// /v2/models/{m}/config).
func tritonConfigJSON(s *core.Core, m *serving.Model) ([]byte, error) {
	return json.Marshal(triton.TritonConfig(m))
}

// tritonStatsJSON is the statistics of the model named (every model when
// name is empty) in Triton's JSON form, {"model_stats": [...]} (GET
// /v2/models[/{m}]/stats); its errors are the HTTP API's (unknown model:
// 404).
func tritonStatsJSON(s *core.Core, name, version string) ([]byte, error) {
	ms, err := s.StatsModels(name, version)
	if err != nil {
		return nil, err
	}
	return json.Marshal(triton.TritonStats(ms...))
}

// tritonJSON parses a Triton JSON document into msg. Fields the message
// does not have are left out (stepserve's own additions); a field of the
// wrong type is the server's bug: Internal.
func tritonJSON(doc []byte, msg proto.Message) error {
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(doc, msg); err != nil {
		return &apierr.Error{Status: http.StatusInternalServerError, Msg: fmt.Sprintf("the server's %s document does not parse as Triton's: %v", msg.ProtoReflect().Descriptor().Name(), err)}
	}
	return nil
}

func (g *grpcServer) ModelConfig(ctx context.Context, r *inferencepb.ModelConfigRequest) (*inferencepb.ModelConfigResponse, error) {
	m, err := g.s.c.Lookup(r.GetName(), r.GetVersion())
	if err != nil {
		return nil, core.GRPCError(err)
	}
	doc, err := tritonConfigJSON(g.s.c, m)
	if err != nil {
		return nil, core.GRPCError(err)
	}
	cfg := &inferencepb.ModelConfig{}
	if err := tritonJSON(doc, cfg); err != nil {
		return nil, core.GRPCError(err)
	}
	return &inferencepb.ModelConfigResponse{Config: cfg}, nil
}

func (g *grpcServer) ModelStatistics(ctx context.Context, r *inferencepb.ModelStatisticsRequest) (*inferencepb.ModelStatisticsResponse, error) {
	if r.GetName() != "" {
		if _, err := g.s.c.Lookup(r.GetName(), r.GetVersion()); err != nil {
			return nil, core.GRPCError(err)
		}
	}
	doc, err := tritonStatsJSON(g.s.c, r.GetName(), r.GetVersion())
	if err != nil {
		return nil, core.GRPCError(err)
	}
	stats := &inferencepb.ModelStatisticsResponse{}
	if err := tritonJSON(doc, stats); err != nil {
		return nil, core.GRPCError(err)
	}
	return stats, nil
}
