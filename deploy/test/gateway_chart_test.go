package test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	eppserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"
	"sigs.k8s.io/yaml"
)

// gateway turns on the inference gateway's objects with an HTTPRoute.
var gateway = []string{"--set", "inferenceGateway.enabled=true,inferenceGateway.httpRoute.enabled=true"}

// TestChartInferenceGateway: the InferencePool selects the chart's pods on
// the port the OpenAI routes are served on; the endpoint picker is the
// Service the pool names, on the port it names; the picker's arguments
// are flags GAIE's picker (v1.5.0) parses, naming the pool and
// stepserve's metrics port; its plugins configuration is one GAIE's own
// loader instantiates; the objectives and the route point at the pool.
func TestChartInferenceGateway(t *testing.T) {
	r := render(t, gateway...)
	require.NotNil(t, r.pool, "kinds %v", r.kinds)
	pod := r.deployment.Spec.Template
	for k, v := range r.pool.Spec.Selector.MatchLabels {
		assert.Equal(t, string(v), pod.Labels[string(k)], "the pool selects the chart's pods by %s", k)
	}
	ports := containerPorts(r.deployment.Spec.Template.Spec.Containers[0])
	require.Len(t, r.pool.Spec.TargetPorts, 1)
	assert.Equal(t, ports["http"], int32(r.pool.Spec.TargetPorts[0].Number), "the pool's target is the API port")

	// The picker: the Service the pool names, selecting the picker's pods.
	ref := r.pool.Spec.EndpointPickerRef
	var svc corev1.Service
	require.NoError(t, yaml.UnmarshalStrict(r.others["Service/"+string(ref.Name)], &svc), "the pool's picker %q is a Service of the chart", ref.Name)
	require.NotNil(t, ref.Port)
	var extProc *corev1.ServicePort
	for i, p := range svc.Spec.Ports {
		if p.Port == int32(ref.Port.Number) {
			extProc = &svc.Spec.Ports[i]
		}
	}
	require.NotNil(t, extProc, "the picker's Service serves the port the pool names, %d", ref.Port.Number)
	var epp appsv1.Deployment
	require.NoError(t, yaml.UnmarshalStrict(r.others["Deployment/"+string(ref.Name)], &epp))
	for k, v := range svc.Spec.Selector {
		assert.Equal(t, v, epp.Spec.Template.Labels[k], "the picker's Service selects its pods by %s", k)
	}
	assert.NotEqual(t, epp.Spec.Template.Labels["app.kubernetes.io/name"], pod.Labels["app.kubernetes.io/name"],
		"the pool's selector must not take the picker's pods")
	assert.NotEqual(t, r.service.Labels["app.kubernetes.io/name"], svc.Labels["app.kubernetes.io/name"],
		"the server's ServiceMonitor selects its Service by these labels: not the picker's")
	require.Len(t, epp.Spec.Template.Spec.Containers, 1)
	c := epp.Spec.Template.Spec.Containers[0]
	assert.Equal(t, extProc.TargetPort.StrVal, "grpc")
	assert.Equal(t, extProc.Port, containerPorts(c)["grpc"])

	// The picker's flags, parsed by the picker's own flag set.
	opts := eppserver.NewOptions()
	fs := pflag.NewFlagSet("epp", pflag.ContinueOnError)
	opts.AddFlags(fs)
	require.NoError(t, fs.Parse(c.Args), "GAIE's picker refuses the chart's arguments %v", c.Args)
	require.NoError(t, opts.Complete())
	require.NoError(t, opts.Validate())
	assert.Equal(t, r.pool.Name, opts.PoolName)
	assert.Equal(t, "default", opts.PoolNamespace)
	assert.Equal(t, "inference.networking.k8s.io", opts.PoolGroup)
	assert.Equal(t, int(ports["metrics"]), opts.ModelServerMetricsPort, "the picker scrapes stepserve's metrics listener")
	assert.Equal(t, int(ref.Port.Number), opts.GRPCPort)
	assert.Equal(t, "vllm:num_requests_waiting", opts.TotalQueuedRequestsMetric, "the names stepserve exports (server.vllm_metrics)")
	assert.Equal(t, "vllm:kv_cache_usage_perc", opts.KVCacheUsagePercentageMetric)

	// Its configuration file: the ConfigMap's key at the path it reads.
	require.True(t, strings.HasPrefix(opts.ConfigFile, "/config/"), opts.ConfigFile)
	require.Len(t, epp.Spec.Template.Spec.Volumes, 1)
	cm := r.configMaps[epp.Spec.Template.Spec.Volumes[0].ConfigMap.Name]
	require.NotNil(t, cm)
	raw := cm.Data[strings.TrimPrefix(opts.ConfigFile, "/config/")]
	require.NotEmpty(t, raw, "the picker reads %s", opts.ConfigFile)
	cfg := loadPickerConfig(t, raw)
	for _, want := range []string{"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"} {
		assert.Contains(t, cfg, want)
	}

	// The picker's role lets it read the pool, the objectives and the pods.
	var role rbacv1.Role
	require.NoError(t, yaml.UnmarshalStrict(r.others["Role/"+string(ref.Name)], &role))
	can := map[string]bool{}
	for _, rule := range role.Rules {
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				if strings.Join(rule.Verbs, ",") == "get,watch,list" {
					can[g+"/"+res] = true
				}
			}
		}
	}
	for _, want := range []string{"/pods", "inference.networking.k8s.io/inferencepools", "inference.networking.x-k8s.io/inferenceobjectives"} {
		assert.True(t, can[want], "the picker may get, watch and list %s", want)
	}
	assert.Equal(t, epp.Spec.Template.Spec.ServiceAccountName, string(ref.Name))

	require.Len(t, r.objectives, 1)
	assert.Equal(t, r.pool.Name, string(r.objectives[0].Spec.PoolRef.Name))
	assert.Equal(t, "inference.networking.k8s.io", string(r.objectives[0].Spec.PoolRef.Group))
	require.NotNil(t, r.route)
	backend := r.route.Spec.Rules[0].BackendRefs[0]
	assert.Equal(t, "InferencePool", string(*backend.Kind))
	assert.Equal(t, "inference.networking.k8s.io", string(*backend.Group))
	assert.Equal(t, r.pool.Name, string(backend.Name))

	// Without the picker: the pool names one deployed elsewhere.
	r = render(t, append(gateway, "--set", "inferenceGateway.epp.enabled=false,inferenceGateway.epp.name=shared-epp")...)
	assert.Equal(t, "shared-epp", string(r.pool.Spec.EndpointPickerRef.Name))
	assert.Empty(t, r.others["Deployment/shared-epp"])
	assert.NotContains(t, r.kinds, "Role")
}

// loadPickerConfig instantiates raw, an EndpointPickerConfig, with GAIE's
// own loader and the plugins its picker registers, as the picker does at
// start; it returns the scheduler's configuration as text.
func loadPickerConfig(t *testing.T, raw string) string {
	t.Helper()
	registerPickerPlugins()
	rawConfig, _, err := loader.LoadRawConfig([]byte(raw), logr.Discard())
	require.NoError(t, err, "GAIE's loader refuses the chart's picker configuration:\n%s", raw)
	handle := fwkplugin.NewEppHandle(context.Background(), func() []types.NamespacedName { return nil })
	cfg, err := loader.InstantiateAndConfigure(rawConfig, handle, logr.Discard())
	require.NoError(t, err, "GAIE's loader cannot instantiate the chart's picker configuration:\n%s", raw)
	return cfg.SchedulerConfig.String() + rawConfig.String()
}

func containerPorts(c corev1.Container) map[string]int32 {
	out := map[string]int32{}
	for _, p := range c.Ports {
		out[p.Name] = p.ContainerPort
	}
	return out
}

// TestChartAutoscalingSignals: each signal becomes the HPA metric of the
// name the adapter rules serve it under, or the KEDA trigger querying its
// series; KEDA replaces the HPA (it makes its own); an unknown signal is
// refused by name.
func TestChartAutoscalingSignals(t *testing.T) {
	names := adapterNames(t)
	for _, signals := range []string{"queueDepth", "requestsWaiting", "kvCacheUsage", "requestsWaiting,kvCacheUsage,queueDepth"} {
		r := render(t, "--set", "autoscaling.enabled=true", "--set", "autoscaling.signals={"+signals+"}")
		require.NotNil(t, r.hpa, signals)
		want := strings.Split(signals, ",")
		require.Len(t, r.hpa.Spec.Metrics, len(want))
		for i, m := range r.hpa.Spec.Metrics {
			require.NotNil(t, m.Pods)
			assert.True(t, names[m.Pods.Metric.Name], "the HPA's %s (signal %s) is a name the adapter rules serve (%v)", m.Pods.Metric.Name, want[i], names)
			assert.Equal(t, "AverageValue", string(m.Pods.Target.Type))
		}
		assert.Nil(t, r.scaled)

		r = render(t, "--set", "autoscaling.enabled=true,autoscaling.driver=keda", "--set", "autoscaling.signals={"+signals+"}")
		assert.Nil(t, r.hpa, "KEDA makes the HPA itself")
		require.NotNil(t, r.scaled)
		triggers := r.scaled["spec"].(map[string]any)["triggers"].([]any)
		require.Len(t, triggers, len(want))
		series := map[string]string{"queueDepth": "stepserve_queue_depth", "requestsWaiting": "vllm:num_requests_waiting", "kvCacheUsage": "vllm:kv_cache_usage_perc"}
		for i, tr := range triggers {
			md := tr.(map[string]any)["metadata"].(map[string]any)
			assert.Contains(t, md["query"], series[want[i]]+"{", signals)
			assert.Contains(t, md["query"], `service="rel-stepserve"`)
		}
	}
	out, err := helmErr("template", "rel", chart, "--set", "autoscaling.enabled=true", "--set", "autoscaling.signals={gpuUtilization}")
	require.Error(t, err)
	assert.Contains(t, out, "queueDepth", "the schema names the signals there are")
	// Past the schema (a chart without one, or helm --skip-schema-validation), the template refuses it too.
	out, err = helmErr("template", "rel", chart, "--skip-schema-validation", "--set", "autoscaling.enabled=true", "--set", "autoscaling.signals={gpuUtilization}")
	require.Error(t, err)
	assert.Contains(t, out, "queueDepth", "the refusal names the signals there are")
}

// adapterNames are the custom metrics deploy/prometheus/adapter-rules.yaml
// serves: each rule's name.as with its matches applied to the series it
// selects.
func adapterNames(t *testing.T) map[string]bool {
	out := map[string]bool{}
	for _, rule := range adapterRules(t) {
		out[rule.servedAs()] = true
	}
	return out
}

// TestChartStorageURI: models.source storageUri runs KServe's storage
// initializer as KServe's webhook does (the URI, then the directory it
// fills) into the volume stepserve reads its repository from.
func TestChartStorageURI(t *testing.T) {
	r := render(t, "--set", "models.source=storageUri,models.storageUri.uri=s3://models/repository")
	pod := r.deployment.Spec.Template.Spec
	require.Len(t, pod.InitContainers, 1)
	init := pod.InitContainers[0]
	assert.Equal(t, []string{"s3://models/repository", "/models"}, init.Args)
	assert.True(t, strings.HasPrefix(init.Image, "kserve/storage-initializer:v"), init.Image)
	var models *corev1.Volume
	for i, v := range pod.Volumes {
		if v.Name == "models" {
			models = &pod.Volumes[i]
		}
	}
	require.NotNil(t, models)
	assert.NotNil(t, models.EmptyDir)
	assert.Contains(t, r.deployment.Spec.Template.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "models", MountPath: "/models", ReadOnly: true})

	out, err := helmErr("template", "rel", chart, "--set", "models.source=storageUri")
	require.Error(t, err)
	assert.Contains(t, out, "models.storageUri.uri is required")
}

// helmErr is helm's combined output and error, for a run meant to fail.
func helmErr(args ...string) (string, error) {
	out, err := exec.Command(helmBin(), args...).CombinedOutput()
	return string(out), err
}

// TestChartRefusesTLSItCannotServe: the server's TLS keys set through the
// chart's config, which mounts no certificate and probes over plain HTTP,
// are refused with the reason, not rendered into a pod that never gets
// ready.
func TestChartRefusesTLSItCannotServe(t *testing.T) {
	out, err := helmErr("template", "rel", chart, "--set", "config.server.tls_cert_file=/etc/tls/tls.crt,config.server.tls_key_file=/etc/tls/tls.key")
	require.Error(t, err)
	assert.Contains(t, out, "does not mount certificates")
}
