package test

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/stepserve/stepserve/config"
)

// kserveFile decodes a manifest of deploy/kserve: its kind and spec, with
// the containers and ports it holds decoded strictly into Kubernetes types.
func kserveFile(t *testing.T, name string, spec any) string {
	t.Helper()
	b, err := os.ReadFile("../kserve/" + name)
	require.NoError(t, err)
	var doc struct {
		APIVersion string `json:"apiVersion"`
		Kind       string
		Spec       any
	}
	require.NoError(t, yaml.Unmarshal(b, &doc), name)
	raw, err := yaml.Marshal(doc.Spec)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, spec), name)
	return doc.Kind
}

// TestKServeRuntime: the ServingRuntime advertises the v2 protocol over REST
// and gRPC (grpc-v2), its arguments are a configuration stepserve accepts
// with gRPC on, and the example InferenceServices name the ports it serves
// each protocol on.
func TestKServeRuntime(t *testing.T) {
	var rt struct {
		ProtocolVersions []string           `json:"protocolVersions"`
		Containers       []corev1.Container `json:"containers"`
	}
	require.Equal(t, "ServingRuntime", kserveFile(t, "servingruntime.yaml", &rt))
	assert.ElementsMatch(t, []string{"v2", "grpc-v2"}, rt.ProtocolVersions)
	require.Len(t, rt.Containers, 1)
	c := rt.Containers[0]
	args := make([]string, 0, len(c.Args))
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--model_repository=") {
			a = "--model_repository=" + t.TempDir() // /mnt/models, in the pod
		}
		args = append(args, a)
	}
	cfg, err := config.Load(args)
	require.NoError(t, err, "stepserve rejects the runtime's arguments %v", c.Args)
	_, httpPort, _ := net.SplitHostPort(cfg.Server.Addr)
	_, grpcPort, _ := net.SplitHostPort(cfg.Server.GRPCAddr)
	assert.Equal(t, "8080", httpPort)
	assert.Equal(t, "9000", grpcPort)
	require.Len(t, c.Ports, 1, "KServe routes one port per predictor")
	assert.Equal(t, "h1", c.Ports[0].Name)
	assert.Equal(t, httpPort, itoa(c.Ports[0].ContainerPort))

	for file, want := range map[string]struct{ protocol, port, portName string }{
		"inferenceservice.yaml":      {"v2", "", ""},
		"inferenceservice-grpc.yaml": {"grpc-v2", grpcPort, "h2c"},
	} {
		var is struct {
			Predictor struct {
				Model struct {
					Runtime         string                 `json:"runtime"`
					ProtocolVersion string                 `json:"protocolVersion"`
					Ports           []corev1.ContainerPort `json:"ports"`
				} `json:"model"`
			} `json:"predictor"`
		}
		require.Equal(t, "InferenceService", kserveFile(t, file, &is))
		m := is.Predictor.Model
		assert.Equal(t, "stepserve", m.Runtime, file)
		assert.Equal(t, want.protocol, m.ProtocolVersion, file)
		if want.port == "" {
			assert.Empty(t, m.Ports, "%s: the runtime's h1 port", file)
			continue
		}
		require.Len(t, m.Ports, 1, file)
		assert.Equal(t, want.portName, m.Ports[0].Name, file)
		assert.Equal(t, want.port, itoa(m.Ports[0].ContainerPort), "%s: the port the runtime serves gRPC on", file)
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }
