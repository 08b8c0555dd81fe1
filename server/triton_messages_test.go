package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// TestTritonErrorTexts: the errors Triton's clients and tests match on
// begin with Triton's words, over HTTP and gRPC alike, statuses unchanged:
// "Request for unknown model" for an inference or metadata request naming
// a model or version the server does not have, "failed to load 'name'"
// for a load that fails (no such model, a bad model, a bad configuration).
func TestTritonErrorTexts(t *testing.T) {
	f := newSumMax(t)
	broken := filepath.Join(f.repo, "broken")
	require.NoError(t, os.MkdirAll(broken, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(broken, models.ConfigFile), []byte(enginetest.SumMaxYAML), 0o644)) // no weights
	s, _ := controlServer(t, f)
	c, _ := grpcClients(t, s)
	ctx := context.Background()
	infer := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`)

	for _, tc := range []struct {
		method, path string
		body         []byte
		status       int
		want         string
	}{
		{"POST", "/v2/models/nope/infer", infer, 404, "Request for unknown model: 'nope' is not found"},
		{"GET", "/v2/models/nope", nil, 404, "Request for unknown model: 'nope' is not found"},
		{"GET", "/v2/models/summax/versions/9", nil, 404, "Request for unknown model: 'summax' version 9 is not found; it serves version 1"},
		{"POST", "/v2/models/a%20b/infer", infer, 404, "Request for unknown model; model names are letters, digits"},
		{"POST", "/v2/repository/models/nope/load", nil, 404, "failed to load 'nope', failed to poll from model repository: "},
		{"POST", "/v2/repository/models/broken/load", nil, 400, "failed to load 'broken', serving: model failed to load: "},
		{"POST", "/v2/repository/models/summax/load", loadBody(t, `{"max_batch_size":"many"}`), 400, "failed to load 'summax', load config: max_batch_size: "},
		{"POST", "/v2/repository/models/summax/load", []byte(`{"parameters":{"file:1/model.onnx":"AAAA"}}`), 400, "failed to load 'summax', load parameter \"file:1/model.onnx\": "},
	} {
		w := do(t, s, tc.method, tc.path, tc.body)
		assert.Equal(t, tc.status, w.Code, "%s %s", tc.method, tc.path)
		msg := errorOf(t, w)
		assert.True(t, strings.HasPrefix(msg, tc.want), "%s %s: %s", tc.method, tc.path, msg)
	}

	req := typedX([]int64{1, 3}, 1, 2, 3)
	req.ModelName = "nope"
	_, err := c.ModelInfer(ctx, req)
	code, msg := codeOf(err)
	assert.Equal(t, codes.NotFound, code)
	assert.Equal(t, "Request for unknown model: 'nope' is not found", msg)
	_, err = c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "summax", Version: "9"})
	code, msg = codeOf(err)
	assert.Equal(t, codes.NotFound, code)
	assert.Equal(t, "Request for unknown model: 'summax' version 9 is not found; it serves version 1", msg)

	str := func(s string) map[string]*pb.ModelRepositoryParameter {
		return map[string]*pb.ModelRepositoryParameter{"config": {ParameterChoice: &pb.ModelRepositoryParameter_StringParam{StringParam: s}}}
	}
	for _, tc := range []struct {
		req  *pb.RepositoryModelLoadRequest
		code codes.Code
		want string
	}{
		{&pb.RepositoryModelLoadRequest{ModelName: "nope"}, codes.NotFound, "failed to load 'nope', failed to poll from model repository: "},
		{&pb.RepositoryModelLoadRequest{ModelName: "broken"}, codes.InvalidArgument, "failed to load 'broken', serving: model failed to load: "},
		{&pb.RepositoryModelLoadRequest{ModelName: "summax", Parameters: str(`{"instance_group":[{"kind":"KIND_TPU"}]}`)}, codes.InvalidArgument,
			"failed to load 'summax', load config: instance_group[0].kind: want one of KIND_AUTO, KIND_GPU, KIND_CPU, KIND_MODEL (or its number)"},
	} {
		_, err := c.RepositoryModelLoad(ctx, tc.req)
		code, msg := codeOf(err)
		assert.Equal(t, tc.code, code, tc.req.ModelName)
		assert.True(t, strings.HasPrefix(msg, tc.want), "%s: %s", tc.req.ModelName, msg)
	}
}
