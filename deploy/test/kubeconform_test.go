package test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chartCombinations are the chart's documented values combinations, each
// rendered and validated against the real schemas (TestChartValidates):
// a row is a name and the --set arguments that make it.
var chartCombinations = []struct {
	name string
	sets []string
}{
	{"defaults", nil},
	{"cpu-only", []string{"npu.count=0"}},
	{"monitoring", []string{"serviceMonitor.enabled=true,prometheusRule.enabled=true,grafanaAlerts.enabled=true"}},
	{"autoscaling", []string{"autoscaling.enabled=true,podDisruptionBudget.enabled=true"}},
	{"models-image", []string{"models.source=image,models.image.repository=registry.example/models"}},
	{"models-hostPath", []string{"models.source=hostPath"}},
	{"rsd-groups", []string{`npu.count=2,npu.visibleDevices=0\,1,config.rbln.npus_per_device=2`}},
	{"models-storageUri", []string{"models.source=storageUri,models.storageUri.uri=s3://models/repository"}},
	{"gateway", []string{"inferenceGateway.enabled=true,inferenceGateway.httpRoute.enabled=true"}},
	{"hpa-queueDepth", []string{"autoscaling.enabled=true", "autoscaling.signals={queueDepth}"}},
	{"hpa-requestsWaiting", []string{"autoscaling.enabled=true", "autoscaling.signals={requestsWaiting}"}},
	{"hpa-kvCacheUsage", []string{"autoscaling.enabled=true", "autoscaling.signals={kvCacheUsage}"}},
	{"keda-queueDepth", []string{"autoscaling.enabled=true,autoscaling.driver=keda", "autoscaling.signals={queueDepth}"}},
	{"keda-requestsWaiting", []string{"autoscaling.enabled=true,autoscaling.driver=keda", "autoscaling.signals={requestsWaiting}"}},
	{"keda-kvCacheUsage", []string{"autoscaling.enabled=true,autoscaling.driver=keda", "autoscaling.signals={kvCacheUsage}"}},
	{"everything", []string{"serviceMonitor.enabled=true,prometheusRule.enabled=true,grafanaAlerts.enabled=true,podDisruptionBudget.enabled=true",
		"inferenceGateway.enabled=true,inferenceGateway.httpRoute.enabled=true",
		"autoscaling.enabled=true,autoscaling.driver=keda", "autoscaling.signals={requestsWaiting,kvCacheUsage,queueDepth}"}},
}

// helms are the Helm releases the chart must render with: make chart-test
// sets both to its pinned builds.
var helms = []struct{ name, env string }{
	{"helm-3.22", "HELM"},
	{"helm-3.19", "HELM_COMPAT"},
}

// TestChartValidates renders every combination with each Helm, as a
// cluster with every CRD the schemas hold installed (so nothing optional
// is left out for want of its API), and validates every object strictly:
// an unknown field, a wrong type, a missing required field or a kind with
// no schema fails.
func TestChartValidates(t *testing.T) {
	v := newValidator(t)
	var apis []string
	for _, k := range loadSchemas(t).crdKinds {
		apis = append(apis, "--api-versions", k)
	}
	for _, h := range helms {
		t.Run(h.name, func(t *testing.T) {
			bin := os.Getenv(h.env)
			if bin == "" {
				if h.env != "HELM" {
					t.Skipf("%s is not set (make chart-test sets it)", h.env)
				}
				bin = "helm"
			}
			for _, c := range chartCombinations {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					args := append([]string{"template", "rel", chart}, apis...)
					for _, s := range c.sets {
						args = append(args, "--set", s)
					}
					cmd := exec.Command(bin, args...)
					var stderr bytes.Buffer
					cmd.Stderr = &stderr
					out, err := cmd.Output()
					require.NoError(t, err, "%s %v: %s", bin, c.sets, stderr.String())
					problems, n := validate(v, c.name, out)
					assert.Empty(t, problems, "%s --set %v", h.name, c.sets)
					assert.Positive(t, n)
				})
			}
		})
	}
}

// TestKServeManifestsValidate: every manifest of deploy/kserve is one
// KServe's CRDs accept.
func TestKServeManifestsValidate(t *testing.T) {
	v := newValidator(t)
	files, err := filepath.Glob("../kserve/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		problems, n := validate(v, filepath.Base(f), b)
		assert.Empty(t, problems)
		assert.Positive(t, n, f)
	}
}

// TestSchemasBite: the harness fails what the API server would refuse,
// naming the field, and a kind it has no schema for.
func TestSchemasBite(t *testing.T) {
	v := newValidator(t)
	for name, c := range map[string]struct{ manifest, want string }{
		"misspelt Deployment field": {`apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  replica: 2
  selector: {matchLabels: {app: d}}
  template:
    metadata: {labels: {app: d}}
    spec: {containers: [{name: c, image: i}]}
`, "replica"},
		"misspelt field in a container": {`apiVersion: v1
kind: Pod
metadata: {name: p}
spec: {containers: [{name: c, image: i, imagePullPolicy: Always, portz: []}]}
`, "portz"},
		"InferencePool port of the wrong type": {`apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: p}
spec:
  selector: {matchLabels: {app: d}}
  targetPorts: [{number: eighty}]
  endpointPickerRef: {name: epp, port: {number: 9002}}
`, "/spec/targetPorts/0/number"},
		"ServiceMonitor unknown field": {`apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: m}
spec:
  selector: {}
  endpoints: [{port: metrics, intervall: 15s}]
`, "intervall"},
		"metadata of a custom resource": {`apiVersion: serving.kserve.io/v1alpha1
kind: ServingRuntime
metadata: {name: r, labelz: {a: b}}
spec: {containers: [{name: c, image: i}]}
`, "labelz"},
		"kind without a schema": {`apiVersion: example.com/v1
kind: Widget
metadata: {name: w}
`, "could not find schema for Widget"},
	} {
		problems, _ := validate(v, name, []byte(c.manifest))
		require.NotEmpty(t, problems, name)
		assert.Contains(t, strings.Join(problems, "\n"), c.want, name)
	}

	// A valid one passes, so the ones above fail for the reason given.
	problems, n := validate(v, "pool", []byte(`apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: p}
spec:
  selector: {matchLabels: {app: d}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: epp, port: {number: 9002}}
`))
	assert.Empty(t, problems)
	assert.Equal(t, 1, n)

	_, err := moduleDir("example.com/absent@v1.0.0")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "run make deps: example.com/absent@v1.0.0 is not in the module cache")
}
