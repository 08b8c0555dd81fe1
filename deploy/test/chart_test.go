package test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	gaiev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gaiev1alpha2 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/stepserve/stepserve/config"
)

const chart = "../helm/stepserve"

// helm is the pinned Helm binary make chart-test built (HELM), or helm on
// PATH.
func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	bin := os.Getenv("HELM")
	if bin == "" {
		bin = "helm"
	}
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "helm %v: %s", args, stderr.String())
	return out
}

// rendered is one `helm template` run, decoded strictly: an unknown field
// anywhere in a manifest fails the test.
type rendered struct {
	configMaps map[string]*corev1.ConfigMap
	deployment *appsv1.Deployment
	service    *corev1.Service
	monitor    *monitoringv1.ServiceMonitor
	rule       *monitoringv1.PrometheusRule
	hpa        *autoscalingv2.HorizontalPodAutoscaler
	pdb        *policyv1.PodDisruptionBudget
	// The inference gateway's objects (inferenceGateway.enabled) and the
	// KEDA ScaledObject, by kind; the picker's Deployment and Service are
	// in others too, under their names.
	pool       *gaiev1.InferencePool
	objectives []*gaiev1alpha2.InferenceObjective
	route      *gatewayv1.HTTPRoute
	scaled     map[string]any
	others     map[string][]byte // "Kind/name": the manifest
	kinds      []string
}

func render(t *testing.T, args ...string) *rendered {
	t.Helper()
	out := helm(t, append([]string{"template", "rel", chart}, args...)...)
	r := &rendered{configMaps: map[string]*corev1.ConfigMap{}, others: map[string][]byte{}}
	for _, doc := range strings.Split(string(out), "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(doc), "---")) == "" {
			continue
		}
		var head struct {
			Kind     string
			Metadata struct{ Name string }
		}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &head))
		r.kinds = append(r.kinds, head.Kind)
		// The chart's own Deployment and Service are rel-stepserve; the
		// picker's are others.
		if (head.Kind == "Deployment" || head.Kind == "Service") && head.Metadata.Name != "rel-stepserve" {
			r.others[head.Kind+"/"+head.Metadata.Name] = []byte(doc)
			continue
		}
		strict := func(v any) {
			require.NoError(t, yaml.UnmarshalStrict([]byte(doc), v), "%s:\n%s", head.Kind, doc)
		}
		switch head.Kind {
		case "ConfigMap":
			var cm corev1.ConfigMap
			strict(&cm)
			r.configMaps[cm.Name] = &cm
		case "Deployment":
			r.deployment = &appsv1.Deployment{}
			strict(r.deployment)
		case "Service":
			r.service = &corev1.Service{}
			strict(r.service)
		case "ServiceMonitor":
			r.monitor = &monitoringv1.ServiceMonitor{}
			strict(r.monitor)
		case "PrometheusRule":
			r.rule = &monitoringv1.PrometheusRule{}
			strict(r.rule)
		case "HorizontalPodAutoscaler":
			r.hpa = &autoscalingv2.HorizontalPodAutoscaler{}
			strict(r.hpa)
		case "PodDisruptionBudget":
			r.pdb = &policyv1.PodDisruptionBudget{}
			strict(r.pdb)
		case "InferencePool":
			r.pool = &gaiev1.InferencePool{}
			strict(r.pool)
		case "InferenceObjective":
			o := &gaiev1alpha2.InferenceObjective{}
			strict(o)
			r.objectives = append(r.objectives, o)
		case "HTTPRoute":
			r.route = &gatewayv1.HTTPRoute{}
			strict(r.route)
		case "ScaledObject":
			require.NoError(t, yaml.Unmarshal([]byte(doc), &r.scaled))
		case "ServiceAccount", "Role", "RoleBinding":
			r.others[head.Kind+"/"+head.Metadata.Name] = []byte(doc)
		default:
			t.Fatalf("unexpected kind %q", head.Kind)
		}
	}
	return r
}

func TestChartLint(t *testing.T) {
	helm(t, "lint", "--strict", chart)
	var sets []string // lint takes the values, not --api-versions
	for i := 0; i < len(everything); i += 2 {
		if everything[i] == "--set" {
			sets = append(sets, everything[i:i+2]...)
		}
	}
	helm(t, append([]string{"lint", "--strict", chart}, sets...)...)
}

// everything turns on every optional part, with the CRDs available.
var everything = []string{
	"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
	"--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
	"--set", "serviceMonitor.enabled=true,serviceMonitor.additionalLabels.release=kps",
	"--set", "prometheusRule.enabled=true",
	"--set", "autoscaling.enabled=true,podDisruptionBudget.enabled=true",
	"--set", "models.source=image,models.image.repository=registry.example/models,models.image.tag=v3",
}

func TestDefaults(t *testing.T) {
	r := render(t)
	assert.ElementsMatch(t, []string{"ConfigMap", "ConfigMap", "Service", "Deployment"}, r.kinds,
		"defaults: config, dashboard, service, deployment; nothing optional")
	d := r.deployment
	require.NotNil(t, d)
	pod := d.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]

	// Probes: liveness and readiness on the OIP health endpoints, a startup
	// probe long enough for compile-at-load, all on the metrics listener,
	// whose connections are its own: a full API port does not fail them.
	assert.Equal(t, "/v2/health/live", c.LivenessProbe.HTTPGet.Path)
	assert.Equal(t, "/v2/health/ready", c.ReadinessProbe.HTTPGet.Path)
	assert.Equal(t, "/v2/health/ready", c.StartupProbe.HTTPGet.Path)
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		assert.Equal(t, "metrics", p.HTTPGet.Port.StrVal)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	assert.Equal(t, map[string]int32{"http": 8000, "grpc": 8001, "metrics": 9090}, ports)
	assert.GreaterOrEqual(t, c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold, int32(300))

	// NPUs through the device plugin's extended resource, on NPU nodes.
	npu := corev1.ResourceName("rebellions.ai/ATOM")
	assert.True(t, c.Resources.Limits[npu].Equal(resource.MustParse("1")))
	assert.True(t, c.Resources.Requests[npu].Equal(resource.MustParse("1")))
	assert.Equal(t, map[string]string{"rebellions.ai/npu.present": "true"}, pod.NodeSelector)
	assert.Contains(t, c.Env, corev1.EnvVar{Name: "RBLN_VISIBLE_DEVICES", Value: "0"})

	// Non-root, read-only root filesystem, writable /tmp and /dev/shm.
	require.NotNil(t, pod.SecurityContext.RunAsNonRoot)
	assert.True(t, *pod.SecurityContext.RunAsNonRoot)
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = !m.ReadOnly
	}
	assert.True(t, mounts["/tmp"] && mounts["/dev/shm"], "the worker needs writable /tmp and /dev/shm")
	for _, v := range pod.Volumes {
		if v.Name == "shm" {
			assert.Equal(t, corev1.StorageMediumMemory, v.EmptyDir.Medium)
		}
	}

	// The drain fits in the grace period: preStop pause + shutdown_grace.
	require.NotNil(t, c.Lifecycle.PreStop.Sleep)
	assert.Greater(t, *pod.TerminationGracePeriodSeconds, int64(30)+c.Lifecycle.PreStop.Sleep.Seconds)

	// Selectors agree.
	assert.Equal(t, d.Spec.Selector.MatchLabels, r.service.Spec.Selector)
	for k, v := range d.Spec.Selector.MatchLabels {
		assert.Equal(t, v, d.Spec.Template.Labels[k])
	}
	assert.Equal(t, "http", r.service.Spec.Ports[0].TargetPort.StrVal)
	svcPorts := map[string]int32{}
	for _, p := range r.service.Spec.Ports {
		svcPorts[p.TargetPort.StrVal] = p.Port
	}
	assert.Equal(t, map[string]int32{"http": 8000, "grpc": 8001, "metrics": 9090}, svcPorts, "the Service exposes gRPC")

	// The rendered configuration is one stepserve itself accepts.
	cm := r.configMaps["rel-stepserve"]
	require.NotNil(t, cm)
	path := filepath.Join(t.TempDir(), "stepserve.yaml")
	require.NoError(t, os.WriteFile(path, []byte(cm.Data["stepserve.yaml"]), 0o644))
	cfg, err := config.Load([]string{"--config", path, "--model_repository", t.TempDir()})
	require.NoError(t, err, "stepserve rejects the chart's config:\n%s", cm.Data["stepserve.yaml"])
	assert.Equal(t, ":8000", cfg.Server.Addr)
	assert.Equal(t, ":9090", cfg.Server.MetricsAddr, "the probes' port is the one the server serves health on")
	assert.Equal(t, ":8001", cfg.Server.GRPCAddr, "the grpc port is the one the server serves gRPC on")
	assert.Equal(t, "rbln", cfg.Engine.Default)
	assert.Nil(t, cfg.RBLN.Devices, "the workers take the pod's RBLN_VISIBLE_DEVICES, one each")

	dash := r.configMaps["rel-stepserve-dashboard"]
	require.NotNil(t, dash)
	assert.Equal(t, "1", dash.Labels["grafana_dashboard"])
	assert.Contains(t, dash.Data["stepserve.json"], `"uid": "stepserve"`)
}

func TestEverythingEnabled(t *testing.T) {
	r := render(t, everything...)
	require.NotNil(t, r.monitor)
	assert.Equal(t, "kps", r.monitor.Labels["release"])
	assert.Equal(t, "/metrics", r.monitor.Spec.Endpoints[0].Path)
	assert.Equal(t, "metrics", r.monitor.Spec.Endpoints[0].Port, "/metrics is on the metrics listener")
	assert.Equal(t, r.deployment.Spec.Selector.MatchLabels, r.monitor.Spec.Selector.MatchLabels)

	require.NotNil(t, r.rule)
	runbooks, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	alerts := map[string]bool{}
	for _, g := range r.rule.Spec.Groups {
		for _, rule := range g.Rules {
			alerts[rule.Alert] = true
			assert.NotEmpty(t, rule.Annotations["summary"], rule.Alert)
			assert.NotEmpty(t, rule.Annotations["description"], rule.Alert)
			assert.Equal(t, "docs/operations.md#"+strings.ToLower(rule.Alert), rule.Annotations["runbook"], rule.Alert)
			assert.Contains(t, string(runbooks), "\n#### "+rule.Alert+"\n", "docs/operations.md has the runbook of %s", rule.Alert)
		}
	}
	for _, a := range []string{"StepserveCPUFallback", "StepserveRecompileInSteadyState", "StepserveNonCleanSteps",
		"StepserveHostBounce", "StepserveHostOpInProgram", "StepserveFailoverToCPU", "StepserveWorkerRestarts", "StepserveQueueSaturated",
		"StepserveHighLatencyP99", "StepserveModelNotReady", "StepserveReplicasDown", "StepserveConnectionsRefused"} {
		assert.True(t, alerts[a], a)
	}

	require.NotNil(t, r.hpa)
	assert.Equal(t, "stepserve_queue_depth", r.hpa.Spec.Metrics[0].Pods.Metric.Name)
	assert.Nil(t, r.deployment.Spec.Replicas, "the HPA owns the replica count")
	require.NotNil(t, r.pdb)
	assert.Equal(t, 1, r.pdb.Spec.MinAvailable.IntValue())

	pod := r.deployment.Spec.Template.Spec
	require.Len(t, pod.InitContainers, 1)
	assert.Equal(t, "registry.example/models:v3", pod.InitContainers[0].Image)
	for _, v := range pod.Volumes {
		if v.Name == "models" {
			assert.NotNil(t, v.EmptyDir, "models copied from the image into an emptyDir")
		}
	}
}

// TestWithoutMetricsPort: metricsPort 0 keeps /metrics and the probes on
// the API port.
func TestWithoutMetricsPort(t *testing.T) {
	r := render(t, "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor", "--set", "service.metricsPort=0,serviceMonitor.enabled=true")
	c := r.deployment.Spec.Template.Spec.Containers[0]
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		assert.Equal(t, "http", p.HTTPGet.Port.StrVal)
	}
	require.Len(t, c.Ports, 2, "http and grpc")
	require.Len(t, r.service.Spec.Ports, 2)
	assert.Equal(t, "http", r.monitor.Spec.Endpoints[0].Port)
	assert.NotContains(t, r.configMaps["rel-stepserve"].Data["stepserve.yaml"], "metrics_addr")
}

// TestGRPC: the gRPC port in the Service, the container and the server's
// configuration; probes over grpc.health.v1 on request; grpcPort 0 turns
// gRPC off everywhere.
func TestGRPC(t *testing.T) {
	r := render(t, "--set", "probes.grpc=true")
	c := r.deployment.Spec.Template.Spec.Containers[0]
	for probe, service := range map[*corev1.Probe]string{c.LivenessProbe: "live", c.ReadinessProbe: "ready", c.StartupProbe: "ready"} {
		require.NotNil(t, probe.GRPC, "a gRPC probe")
		assert.Nil(t, probe.HTTPGet)
		assert.Equal(t, int32(8001), probe.GRPC.Port)
		require.NotNil(t, probe.GRPC.Service)
		assert.Equal(t, service, *probe.GRPC.Service, "the health service stepserve answers for %s", service)
	}

	r = render(t, "--set", "service.grpcPort=9500")
	c = r.deployment.Spec.Template.Spec.Containers[0]
	assert.Contains(t, c.Ports, corev1.ContainerPort{Name: "grpc", ContainerPort: 9500, Protocol: corev1.ProtocolTCP})
	assert.Equal(t, "/v2/health/live", c.LivenessProbe.HTTPGet.Path, "HTTP probes unless probes.grpc")
	cfg := loadChartConfig(t, r)
	assert.Equal(t, ":9500", cfg.Server.GRPCAddr)

	r = render(t, "--set", "service.grpcPort=0")
	c = r.deployment.Spec.Template.Spec.Containers[0]
	for _, p := range c.Ports {
		assert.NotEqual(t, "grpc", p.Name)
	}
	for _, p := range r.service.Spec.Ports {
		assert.NotEqual(t, "grpc", p.Name)
	}
	assert.Empty(t, loadChartConfig(t, r).Server.GRPCAddr, "grpcPort 0: no gRPC")

	out, err := exec.Command(helmBin(), "template", "rel", chart, "--set", "service.grpcPort=0,probes.grpc=true").CombinedOutput()
	assert.Error(t, err)
	assert.Contains(t, string(out), "probes.grpc needs service.grpcPort")
}

// loadChartConfig is the server configuration the chart renders, as
// stepserve reads it.
func loadChartConfig(t *testing.T, r *rendered) *config.Config {
	t.Helper()
	cm := r.configMaps["rel-stepserve"]
	require.NotNil(t, cm)
	path := filepath.Join(t.TempDir(), "stepserve.yaml")
	require.NoError(t, os.WriteFile(path, []byte(cm.Data["stepserve.yaml"]), 0o644))
	cfg, err := config.Load([]string{"--config", path, "--model_repository", t.TempDir()})
	require.NoError(t, err, "stepserve rejects the chart's config:\n%s", cm.Data["stepserve.yaml"])
	return cfg
}

func TestOperatorObjectsNeedTheirCRDs(t *testing.T) {
	r := render(t, "--set", "serviceMonitor.enabled=true,prometheusRule.enabled=true")
	assert.Nil(t, r.monitor, "no ServiceMonitor without the monitoring.coreos.com CRD")
	assert.Nil(t, r.rule)
}

func TestNPUResourceAndCPUOnly(t *testing.T) {
	r := render(t, "--set", "npu.resource=rebellions.ai/REBEL,npu.count=2")
	c := r.deployment.Spec.Template.Spec.Containers[0]
	assert.True(t, c.Resources.Limits["rebellions.ai/REBEL"].Equal(resource.MustParse("2")))
	_, atom := c.Resources.Limits["rebellions.ai/ATOM"]
	assert.False(t, atom)

	// npu.count 0 is a CPU-only deployment, whatever the values say of
	// engines: no NPU requested, no NPU node required, the CPU engine by
	// default with no failover, no device list.
	r = render(t, "--set", "npu.count=0")
	c = r.deployment.Spec.Template.Spec.Containers[0]
	for name := range c.Resources.Limits {
		assert.NotContains(t, string(name), "rebellions.ai", "no NPU requested")
	}
	_, npuNode := r.deployment.Spec.Template.Spec.NodeSelector["rebellions.ai/npu.present"]
	assert.False(t, npuNode, "no NPU node required")
	for _, e := range c.Env {
		assert.NotEqual(t, "RBLN_VISIBLE_DEVICES", e.Name)
	}
	cfg := loadChartConfig(t, r)
	assert.Equal(t, "cpu", cfg.Engine.Default)
	assert.Equal(t, "none", cfg.Engine.Failover)

	r = render(t, "--set", "npu.count=0,nodeSelector.pool=cpu")
	assert.Equal(t, map[string]string{"pool": "cpu"}, r.deployment.Spec.Template.Spec.NodeSelector, "other selectors stay")
}

// RSD groups: a replica requests whole groups of NPUs, the workers group
// the pod's NPUs as configured, and a count that is not whole groups is
// refused (issue 33, item 1).
func TestNPUGroups(t *testing.T) {
	r := render(t, "--set", "npu.count=4,npu.visibleDevices=0\\,1\\,2\\,3,config.rbln.npus_per_device=2")
	c := r.deployment.Spec.Template.Spec.Containers[0]
	assert.True(t, c.Resources.Limits["rebellions.ai/ATOM"].Equal(resource.MustParse("4")))
	cfg := loadChartConfig(t, r)
	assert.Equal(t, 2, cfg.RBLN.NPUsPerDevice)

	cmd := exec.Command(helmBin(), "template", "rel", chart, "--set", "npu.count=3,config.rbln.npus_per_device=2")
	out, err := cmd.CombinedOutput()
	assert.Error(t, err)
	assert.Contains(t, string(out), "npu.count is 3, but config.rbln.npus_per_device groups NPUs by 2")
}

func TestValuesSchemaRejectsNonsense(t *testing.T) {
	for _, set := range []string{"models.source=s3", "config.engine.default=gpu", "image.pullPolicy=Sometimes", "service.port=0", "service.metricsPort=-1", "service.grpcPort=70000", "probes.grpc=yes",
		// The config value's schema is the server's keys (make schema):
		// a misspelt key, a bad duration, a port out of range, a word
		// the server does not take.
		"config.server.adr=:1", "config.sever.addr=:1", "config.server.read_timeout=10", "config.server.grpc_addr=:99999",
		"config.log.level=verbose", "config.engine.cpu_threads=-1", "config.server.max_body_bytes=100"} {
		cmd := exec.Command(helmBin(), "template", "rel", chart, "--set", set)
		out, err := cmd.CombinedOutput()
		assert.Error(t, err, "%s should be refused", set)
		assert.Contains(t, string(out), "values don't meet the specifications of the schema", set)
	}
}

// TestValuesSchemaTakesWhatTheServerTakes renders values the server
// accepts, as a user would write them, and checks that stepserve reads the
// rendered configuration with them.
func TestValuesSchemaTakesWhatTheServerTakes(t *testing.T) {
	for _, set := range []string{"config.server.shutdown_grace=1m30s", "config.server.shutdown_grace=0", "config.server.max_body_bytes=1GiB",
		"config.server.max_body_bytes=2097152", "config.rbln.devices={0,1}", "config.rbln.env.RBLN_LOG=debug", "config.batching.max_queue_delay=500us",
		"config.models.max_model_bytes=auto", "config.log.requests=true", "config.server.metrics_addr=127.0.0.1:9090"} {
		r := render(t, "--set", set)
		loadChartConfig(t, r)
	}
}

func helmBin() string {
	if b := os.Getenv("HELM"); b != "" {
		return b
	}
	return "helm"
}

// Grafana-managed alert rules ship, when asked, as a ConfigMap Grafana's
// sidecar provisions (label grafana_alert), with the Prometheus data
// source's uid in every query (issue 34).
func TestGrafanaAlertsConfigMap(t *testing.T) {
	r := render(t)
	_, ok := r.configMaps["rel-stepserve-grafana-alerts"]
	assert.False(t, ok, "off by default")
	r = render(t, "--set", "grafanaAlerts.enabled=true,grafanaAlerts.datasourceUid=prom-main")
	cm, ok := r.configMaps["rel-stepserve-grafana-alerts"]
	require.True(t, ok)
	assert.Equal(t, "1", cm.Labels["grafana_alert"])
	var doc struct {
		APIVersion int `json:"apiVersion"`
		Groups     []struct {
			Folder string
			Rules  []struct {
				UID       string `json:"uid"`
				Title     string
				Condition string
				Data      []struct {
					DatasourceUID string `json:"datasourceUid"`
				}
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(cm.Data["stepserve-alerts.json"]), &doc))
	assert.Equal(t, 1, doc.APIVersion)
	require.NotEmpty(t, doc.Groups)
	for _, g := range doc.Groups {
		assert.Equal(t, "stepserve", g.Folder)
		for _, rule := range g.Rules {
			assert.Equal(t, "C", rule.Condition, rule.Title)
			assert.LessOrEqual(t, len(rule.UID), 40, rule.Title)
			assert.Equal(t, "prom-main", rule.Data[0].DatasourceUID, rule.Title)
		}
	}
	assert.NotContains(t, cm.Data["stepserve-alerts.json"], "__STEPSERVE_PROMETHEUS_UID__")
}
