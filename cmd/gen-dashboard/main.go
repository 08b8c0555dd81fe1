// Command gen-dashboard writes the chart's Grafana dashboard
// (files/dashboard.json) from its definition here, built with Grafana's
// typed Go SDK (github.com/grafana/grafana-foundation-sdk, Apache-2.0)
// rather than hand-written JSON: make dashboard, part of make generate
// and check-generated. Change the dashboard here, then run it.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"

	"github.com/stepserve/stepserve/internal/genjson"
)

func main() {
	chart := flag.String("chart", "deploy/helm/stepserve", "the chart directory")
	flag.Parse()
	b, err := Render()
	if err == nil {
		err = os.WriteFile(filepath.Join(*chart, "files", "dashboard.json"), b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen-dashboard:", err)
		os.Exit(1)
	}
}

// Render is the dashboard's JSON.
func Render() ([]byte, error) {
	d, err := Dashboard().Build()
	if err != nil {
		return nil, err
	}
	return genjson.Marshal(d)
}

// Dashboard is stepserve's dashboard: requests, steps and their signals,
// batching, device memory, workers, generation, connections. It is the
// classic dashboard schema on purpose: the SDK marks it deprecated for
// dashboardv2, which only Grafana 12's new dashboards read, while the
// sidecar provisions this one into every Grafana the chart meets.
//
//lint:ignore SA1019 the classic schema is the one every Grafana provisions
func Dashboard() *dashboard.DashboardBuilder {
	//lint:ignore SA1019 the classic schema is the one every Grafana provisions
	return dashboard.NewDashboardBuilder("stepserve").
		Uid("stepserve").
		Title("stepserve").
		Tags([]string{"stepserve",
			"inference",
			"npu"}).
		Editable().
		Refresh("30s").
		Time("now-1h", "now").
		Version(0x1).
		Variables([]cog.Builder[dashboard.VariableModel]{dashboard.NewDatasourceVariableBuilder("datasource").
			Name("datasource").
			Label("Data source").
			Type("prometheus"),
			dashboard.NewQueryVariableBuilder("model").
				Name("model").
				Label("Model").
				Query(dashboard.StringOrMap{Map: map[string]interface{}{"query": "label_values(stepserve_requests_total, model)", "refId": "models"}}).
				Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
				Current(dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: cog.ToPtr[string]("All")}, Value: dashboard.StringOrArrayOfString{String: cog.ToPtr[string]("$__all")}}).
				Multi(true).
				Refresh(2).
				IncludeAll(true)}).
		WithRow(dashboard.NewRowBuilder("Requests").
			Title("Requests").
			GridPos(dashboard.GridPos{H: 1, W: 24, X: 0, Y: 0}).
			Id(0x1)).
		WithPanel(panel(0x2, "Request rate by protocol and outcome", "reqps", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 1},
			query{"sum by (model, protocol, outcome) (rate(stepserve_requests_total{model=~\"$model\"}[$__rate_interval]))", "{{model}} {{protocol}} {{outcome}}"})).
		WithPanel(panel(0x3, "Latency quantiles", "s", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 1},
			query{"histogram_quantile(0.5, sum by (model, le) (rate(stepserve_request_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))", "{{model}} p50"},
			query{"histogram_quantile(0.9, sum by (model, le) (rate(stepserve_request_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))", "{{model}} p90"},
			query{"histogram_quantile(0.99, sum by (model, le) (rate(stepserve_request_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))", "{{model}} p99"})).
		WithPanel(panel(0x4, "Queue depth", "short", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 9},
			query{"sum by (model) (stepserve_queue_depth{model=~\"$model\"})", "{{model}}"})).
		WithPanel(panel(0x5, "Queue wait p99", "s", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 9},
			query{"histogram_quantile(0.99, sum by (model, le) (rate(stepserve_queue_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))", "{{model}}"})).
		WithRow(dashboard.NewRowBuilder("Steps").
			Title("Steps").
			GridPos(dashboard.GridPos{H: 1, W: 24, X: 0, Y: 17}).
			Id(0x6)).
		WithPanel(panel(0x7, "Mean batch size (rows per step)", "short", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 18},
			query{"sum by (model) (rate(stepserve_batch_size_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model) (rate(stepserve_batch_size_count{model=~\"$model\"}[$__rate_interval]))", "{{model}}"})).
		WithPanel(panel(0x8, "Mean padding ratio by bucket", "percentunit", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 18},
			query{"sum by (model, bucket) (rate(stepserve_padding_ratio_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model, bucket) (rate(stepserve_padding_ratio_count{model=~\"$model\"}[$__rate_interval]))", "{{model}} {{bucket}}"})).
		WithPanel(panel(0x9, "Steps by verdict", "ops", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 26},
			query{"sum by (model, verdict) (rate(stepserve_steps_total{model=~\"$model\"}[$__rate_interval]))", "{{model}} {{verdict}}"}).
			Description("clean: no explain signal; overhead: CPU fallback, recompile, host bounce or extra transfers; unmeasured: the engine could not run explain")).
		WithPanel(panel(0xa, "Explain signals by bucket", "short", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 26},
			query{"sum by (model, bucket, signal) (increase(stepserve_step_signals_total{model=~\"$model\"}[$__rate_interval]))", "{{model}} {{bucket}} {{signal}}"})).
		WithPanel(panel(0xb, "Step duration p99 by bucket", "s", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 34},
			query{"histogram_quantile(0.99, sum by (model, bucket, le) (rate(stepserve_step_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))", "{{model}} {{bucket}}"})).
		WithPanel(panel(0x1b, "Step device time and host overhead (mean by bucket)", "s", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 42},
			query{"sum by (model, bucket) (rate(stepserve_step_device_seconds_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model, bucket) (rate(stepserve_step_device_seconds_count{model=~\"$model\"}[$__rate_interval]))", "{{model}} {{bucket}} device"},
			query{"sum by (model, bucket) (rate(stepserve_step_duration_seconds_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model, bucket) (rate(stepserve_step_duration_seconds_count{model=~\"$model\"}[$__rate_interval])) - sum by (model, bucket) (rate(stepserve_step_device_seconds_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model, bucket) (rate(stepserve_step_device_seconds_count{model=~\"$model\"}[$__rate_interval]))", "{{model}} {{bucket}} host overhead"}).
			Description("Device time per step (stepserve_step_device_seconds: a worker's step body, the CPU engine's compute; absent where the engine does not measure it) beside the wall-clock step; host overhead = step wall time - device time (IPC, staging conversions, the explain region).")).
		WithPanel(panel(0xc, "Transfers by direction", "ops", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 34},
			query{"sum by (model, direction) (rate(stepserve_transfers_total{model=~\"$model\"}[$__rate_interval]))", "{{model}} {{direction}}"},
			query{"sum by (model) (rate(stepserve_host_bounce_bytes_total{model=~\"$model\"}[$__rate_interval]))", "{{model}} host bounce bytes/s"})).
		WithRow(dashboard.NewRowBuilder("Devices").
			Title("Devices").
			GridPos(dashboard.GridPos{H: 1, W: 24, X: 0, Y: 50}).
			Id(0xd)).
		WithPanel(panel(0xe, "Model ready", "short", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 51},
			query{"stepserve_model_ready{model=~\"$model\"}", "{{model}} {{engine}}"})).
		WithPanel(panel(0xf, "Worker up and restarts", "short", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 51},
			query{"stepserve_worker_up", "device {{device}} up"},
			query{"increase(stepserve_worker_restarts_total[$__rate_interval])", "device {{device}} restarts"},
			query{"sum by (model, to) (increase(stepserve_engine_failovers_total{model=~\"$model\"}[$__rate_interval]))", "{{model}} failover to {{to}}"})).
		WithPanel(panel(0x10, "Device memory per chiplet", "bytes", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 59},
			query{"stepserve_device_memory_bytes{kind=~\"allocated|reserved|active|cached\"}", "dev {{device}} npu {{npu}} chiplet {{chiplet}} {{kind}}"})).
		WithPanel(panel(0x11, "NPU utilisation (rbln-metrics-exporter, by pod)", "percent", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 59},
			query{"max by (pod, card) (rbln_npu_utilization) * on (pod) group_left () max by (pod) (stepserve_build_info)", "{{pod}} card {{card}}"}).
			Description("The NPU exporter's utilisation joined with stepserve's pods.")).
		WithPanel(panel(0x12, "Model load and bucket compile time", "s", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 67},
			query{"stepserve_model_load_duration_seconds{model=~\"$model\"}", "{{model}} load"},
			query{"stepserve_bucket_compile_duration_seconds{model=~\"$model\"}", "{{model}} {{bucket}} compile"})).
		WithPanel(panel(0x17, "Worker late replies", "short", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 67},
			query{"sum by (engine, device, kind) (increase(stepserve_worker_late_replies_total[$__rate_interval]))", "{{engine}} device {{device}} {{kind}}"}).
			Description("Results that came after their caller had given up (a memory poll or a load that waited behind a compile holding the worker's interpreter): dropped and counted, never a restart. A steady rate means callers' deadlines are shorter than the worker's compiles.")).
		WithPanel(panel(0x18, "Replicas loaded and healthy", "short", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 75},
			query{"stepserve_model_replicas{model=~\"$model\"}", "{{model}} loaded"},
			query{"stepserve_model_replicas_healthy{model=~\"$model\"}", "{{model}} healthy"}).
			Description("A model's replicas on its engine (model.yaml's instances: devices x per_device) and how many are healthy now. Batches go to the healthy ones; below instances.min_ready healthy the model is not ready (unless a failover engine serves it).")).
		WithPanel(panel(0x19, "Steps by device", "short", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 75},
			query{"sum by (model, engine, device) (rate(stepserve_device_steps_total{model=~\"$model\"}[$__rate_interval]))", "{{model}} {{engine}} device {{device}}"}).
			Description("How a model's batches spread over the devices it is loaded on: each batch goes to the healthy replica with the fewest steps in flight. A device that takes no steps while its neighbours do has a replica down.")).
		WithRow(dashboard.NewRowBuilder("Connections").
			Title("Connections").
			GridPos(dashboard.GridPos{H: 1, W: 24, X: 0, Y: 83}).
			Id(0x13)).
		WithPanel(panel(0x14, "Open connections and limit", "short", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 84},
			query{"sum by (pod, listener) (stepserve_connections_open)", "{{pod}} {{listener}} open"},
			query{"max by (pod, listener) (stepserve_connections_max)", "{{pod}} {{listener}} limit"}).
			Description("Client connections per listener against server.max_connections (api) and the metrics listener's fixed limit.")).
		WithPanel(panel(0x15, "Connections closed idle and refused", "cps", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 84},
			query{"sum by (pod, listener) (rate(stepserve_connections_closed_idle_total[$__rate_interval]))", "{{pod}} {{listener}} closed idle"},
			query{"sum by (pod, listener) (rate(stepserve_connections_refused_total[$__rate_interval]))", "{{pod}} {{listener}} refused"}).
			Description("At the limit: idle connections closed to make room, and new ones refused with 503 because every open one was busy (those 503s are not in the request rate).")).
		WithPanel(panel(0x16, "In-flight request memory and budget", "bytes", dashboard.GridPos{H: 8, W: 24, X: 0, Y: 92},
			query{"sum by (pod) (stepserve_inflight_bytes)", "{{pod}} in flight"},
			query{"max by (pod) (stepserve_inflight_bytes_limit)", "{{pod}} budget"}).
			Description("Bytes the requests in flight hold (bodies, tensors, step buffers, outputs, responses not yet written) against server.max_inflight_bytes; at the budget new requests wait, then get 503.").
			Span(0x18)).
		WithPanel(panel(0x1a, "Padding waste: current vs advised buckets", "percentunit", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 100},
			query{"max by (model, lists) (stepserve_bucket_padding_work_ratio{model=~\"$model\"})", "{{model}} {{lists}}"}).
			Description("The fraction of the device work that is padding on each model's recent steps (decayed, half-life 1h), with its bucket lists now (solid) and with the lists the bucket advisor gives for as many programs (dashed). A wide gap: run `stepserve advise --model <name>` (or GET /v2/models/<name>/buckets/advice) and paste its model.yaml block.").
			Min(0).
			Max(1).
			// The advised lists' series dashed.
			WithOverride(dashboard.MatcherConfig{Id: "byRegexp", Options: ".* advised"}, []dashboard.DynamicConfigValue{{Id: "custom.lineStyle", Value: map[string]any{"fill": "dash", "dash": []any{10, 10}}}}).
			Legend(legend().
				Calcs([]string{"lastNotNull"}))).
		WithPanel(panel(0x1c, "Token-budget deferrals", "reqps", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 100},
			query{"sum by (model) (rate(stepserve_batch_token_deferrals_total{model=~\"$model\"}[$__rate_interval]))", "{{model}}"}).
			Description("Requests per second that batching.max_batch_tokens kept out of the batch being formed: each started a later batch rather than pad that one to its length. Steady deferrals with idle steps: the budget is too tight for the traffic; none at all: it never binds.")).
		WithPanel(panel(0x1d, "Worker model reloads", "short", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 108},
			query{"sum by (engine, device, outcome) (increase(stepserve_worker_model_reloads_total[$__rate_interval]))", "{{engine}} device {{device}} {{outcome}}"}).
			Description("Models put back on a restarted worker, by outcome. Failed reloads of one model in a row are retried with a growing backoff (up to 5 minutes); a steady failed rate is a model whose reload takes its worker down (see the log: 'reloading model after restart failed').")).
		WithPanel(panel(0x1e, "Worker output lines dropped", "short", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 108},
			query{"sum by (engine, device) (rate(stepserve_worker_output_lines_dropped_total[$__rate_interval]))", "{{engine}} device {{device}}"}).
			Description("Lines a worker printed beyond the log's rate limit for worker output (50 lines a second, bursts of 200): a model that prints without end. The log keeps a bounded share; the rest are counted here.")).
		WithPanel(panel(0x1f, "Generation: time to first token (p50, p99)", "s", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 116},
			query{"histogram_quantile(0.5, sum by (model, le) (rate(stepserve_generation_time_to_first_token_seconds_bucket{model=~\"$model\"}[$__rate_interval])))", "{{model}} p50"},
			query{"histogram_quantile(0.99, sum by (model, le) (rate(stepserve_generation_time_to_first_token_seconds_bucket{model=~\"$model\"}[$__rate_interval])))", "{{model}} p99"}).
			Description("Time from a generation's arrival to its first token: queueing, then its prompt's prefill, a chunk a step beside the running decodes.")).
		WithPanel(panel(0x20, "Generation: time per output token (p50, p99)", "s", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 116},
			query{"histogram_quantile(0.5, sum by (model, le) (rate(stepserve_generation_time_per_output_token_seconds_bucket{model=~\"$model\"}[$__rate_interval])))", "{{model}} p50"},
			query{"histogram_quantile(0.99, sum by (model, le) (rate(stepserve_generation_time_per_output_token_seconds_bucket{model=~\"$model\"}[$__rate_interval])))", "{{model}} p99"}).
			Description("A generation's mean time between two tokens after the first: what a streaming reader feels. It grows with the decode batch and with prompt chunks prefilled beside it.")).
		WithPanel(panel(0x21, "Generation: tokens per second", "short", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 124},
			query{"sum by (model) (rate(stepserve_generation_prompt_tokens_total{model=~\"$model\"}[$__rate_interval]))", "{{model}} prompt"},
			query{"sum by (model) (rate(stepserve_generation_generated_tokens_total{model=~\"$model\"}[$__rate_interval]))", "{{model}} generated"}).
			Description("Prompt tokens admitted and tokens generated, per second.")).
		WithPanel(panel(0x22, "Generation: request duration (p50, p99)", "s", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 124},
			query{"histogram_quantile(0.5, sum by (model, le) (rate(stepserve_generation_request_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))", "{{model}} p50"},
			query{"histogram_quantile(0.99, sum by (model, le) (rate(stepserve_generation_request_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))", "{{model}} p99"}).
			Description("A generation's time from arrival to its last token.")).
		WithPanel(panel(0x23, "Generation: KV cache blocks used", "percentunit", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 132},
			query{"sum by (model) (stepserve_generation_kv_cache_blocks{model=~\"$model\", state=\"used\"}) / sum by (model) (stepserve_generation_kv_cache_blocks{model=~\"$model\"})", "{{model}}"}).
			Description("The share of each language model's KV cache blocks held by sequences. Near 100% with sequences waiting, new ones wait for blocks and running ones are preempted.")).
		WithPanel(panel(0x24, "Generation: sequences running and waiting", "short", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 132},
			query{"sum by (model, state) (stepserve_generation_sequences{model=~\"$model\"})", "{{model}} {{state}}"}).
			Description("Sequences in the continuous batch (running) and queued for it (waiting: for a slot of max_num_seqs, or for KV blocks).")).
		WithPanel(panel(0x25, "Generation: preemptions per second", "short", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 140},
			query{"sum by (model) (rate(stepserve_generation_preemptions_total{model=~\"$model\"}[$__rate_interval]))", "{{model}}"}).
			Description("Running sequences sent back to wait because the KV cache ran out of blocks; each is recomputed later (its output unchanged), at the cost of its prefill again.")).
		WithPanel(panel(0x26, "Generation: sequences per step (mean)", "short", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 140},
			query{"sum by (model) (rate(stepserve_generation_step_sequences_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model) (rate(stepserve_generation_step_sequences_count{model=~\"$model\"}[$__rate_interval]))", "{{model}}"}).
			Description("Sequences each step computed: decodes and prompt chunks together. The continuous batch at work.")).
		WithPanel(panel(0x27, "Generation: prefix cache hit rate", "percentunit", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 148},
			query{"sum by (model) (rate(stepserve_generation_prefix_cache_hit_tokens_total{model=~\"$model\"}[$__rate_interval])) / sum by (model) (rate(stepserve_generation_prefix_cache_queried_tokens_total{model=~\"$model\"}[$__rate_interval]))", "{{model}}"}).
			Description("The share of admitted sequences' tokens the prefix cache held (computed before by a sequence with the same start, shared, not computed again): a common system prompt is computed once.")).
		WithPanel(panel(0x2d, "Generation: speculative decoding, drafted tokens kept", "percentunit", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 148},
			query{"sum by (model) (rate(stepserve_generation_draft_accepted_tokens_total{model=~\"$model\"}[$__rate_interval])) / sum by (model) (rate(stepserve_generation_draft_tokens_total{model=~\"$model\"}[$__rate_interval]))", "{{model}}"}).
			Description("The share of the tokens drafted by prompt lookup (generation.speculative) that the model drew too, kept without a step of their own. Low on text that does not repeat its prompt or itself: each drafted token still costs a row of the step, and a request can opt out (speculative_decoding: false).")).
		WithPanel(panel(0x28, "Device allocator events and memory reading age", "short", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 156},
			query{"increase(stepserve_device_allocator_events[15m])", "dev {{device}} npu {{npu}} chiplet {{chiplet}} {{event}} /15m"},
			query{"stepserve_device_memory_age_seconds", "dev {{device}} reading age (s)"}).
			Description("Out-of-memory errors and allocation retries counted by the device allocator (per NPU and chiplet; an increase fires StepserveDeviceOOM), and how old the memory reading was at its last poll (0: read live).")).
		WithRow(dashboard.NewRowBuilder("Compiled programs").
			Title("Compiled programs").
			GridPos(dashboard.GridPos{H: 1, W: 24, X: 0, Y: 164}).
			Id(0x29)).
		WithPanel(panel(0x2a, "Graphs and graph breaks per bucket", "short", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 165},
			query{"max by (model, bucket, kind, compiler) (stepserve_program_graphs{model=~\"$model\"})", "{{model}} {{bucket}} {{kind}} graphs ({{compiler}})"},
			query{"max by (model, bucket, kind) (stepserve_program_graph_breaks{model=~\"$model\"})", "{{model}} {{bucket}} {{kind}} breaks"}).
			Description("Graphs the compiler (inductor on the host CPU, rbln on an NPU) captured for each bucket's step: 1 is a whole step. Breaks fall back to the host on every step (each counts as cpu_fallback); strict warm-up refuses them.")).
		WithPanel(panel(0x2b, "Recompiles and compile time per bucket", "short", dashboard.GridPos{H: 8, W: 12, X: 12, Y: 165},
			query{"max by (model, bucket, kind) (stepserve_program_recompiles{model=~\"$model\"})", "{{model}} {{bucket}} {{kind}} recompiles"},
			query{"max by (model, bucket, kind) (stepserve_program_compile_seconds{model=~\"$model\"})", "{{model}} {{bucket}} {{kind}} compile s"}).
			Description("Graphs captured after a bucket's first run (a compiled guard stopped holding: /explain names Dynamo's reason), and the first run's seconds, which built the program (a fraction of a second where the compiler's cache served it).")).
		WithPanel(panel(0x2c, "Step audit findings by rule", "short", dashboard.GridPos{H: 8, W: 12, X: 0, Y: 173},
			query{"sum by (model, rule) (stepserve_step_audit_findings{model=~\"$model\"})", "{{model}} {{rule}}"}).
			Description("Places the captured step graphs go against the documented step structure, by rule: created_in_step (item 1), float64, int64, mixed_float, input_layout (item 3), host_read (item 4), outputs (item 5). /explain's programs[].audit names each operator and source line."))
}

// query is one of a panel's Prometheus queries and its legend.
type query struct{ expr, legend string }

// panel is a time series of the queries (refIds A, B, ... in order) on
// the dashboard's data source, with the legend and tooltip every panel
// here has; the caller adds a description and any field options.
func panel(id uint32, title, unit string, pos dashboard.GridPos, queries ...query) *timeseries.PanelBuilder {
	targets := make([]cog.Builder[variants.Dataquery], len(queries))
	for i, q := range queries {
		targets[i] = prometheus.NewDataqueryBuilder().Expr(q.expr).LegendFormat(q.legend).RefId(string(rune('A' + i)))
	}
	return timeseries.NewPanelBuilder().
		Id(id).
		Targets(targets).
		Title(title).
		Datasource(common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}).
		GridPos(pos).
		Height(pos.H).
		Unit(unit).
		Legend(legend()).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode("multi").Sort(""))
}

// legend is every panel's legend: a table below the graph.
func legend() *common.VizLegendOptionsBuilder {
	return common.NewVizLegendOptionsBuilder().DisplayMode("table").Placement("bottom").ShowLegend(false)
}
