// Command gen-dashboard writes the chart's Grafana dashboard
// (files/dashboard.json) from its definition here, built with Grafana's
// typed Go SDK (github.com/grafana/grafana-foundation-sdk, Apache-2.0)
// rather than hand-written JSON: make dashboard, part of make generate
// and check-generated. Change the dashboard here, then run it.
package main

import (
	"bytes"
	"encoding/json"
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
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
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
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x2).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model, protocol, outcome) (rate(stepserve_requests_total{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}} {{protocol}} {{outcome}}").
				RefId("A")}).
			Title("Request rate by protocol and outcome").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 1}).
			Height(0x8).
			Unit("reqps").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x3).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("histogram_quantile(0.5, sum by (model, le) (rate(stepserve_request_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))").
				LegendFormat("{{model}} p50").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("histogram_quantile(0.9, sum by (model, le) (rate(stepserve_request_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))").
					LegendFormat("{{model}} p90").
					RefId("B"),
				prometheus.NewDataqueryBuilder().
					Expr("histogram_quantile(0.99, sum by (model, le) (rate(stepserve_request_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))").
					LegendFormat("{{model}} p99").
					RefId("C")}).
			Title("Latency quantiles").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 1}).
			Height(0x8).
			Unit("s").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x4).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model) (stepserve_queue_depth{model=~\"$model\"})").
				LegendFormat("{{model}}").
				RefId("A")}).
			Title("Queue depth").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 9}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x5).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("histogram_quantile(0.99, sum by (model, le) (rate(stepserve_queue_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))").
				LegendFormat("{{model}}").
				RefId("A")}).
			Title("Queue wait p99").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 9}).
			Height(0x8).
			Unit("s").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithRow(dashboard.NewRowBuilder("Steps").
			Title("Steps").
			GridPos(dashboard.GridPos{H: 1, W: 24, X: 0, Y: 17}).
			Id(0x6)).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x7).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model) (rate(stepserve_batch_size_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model) (rate(stepserve_batch_size_count{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}}").
				RefId("A")}).
			Title("Mean batch size (rows per step)").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 18}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x8).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model, bucket) (rate(stepserve_padding_ratio_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model, bucket) (rate(stepserve_padding_ratio_count{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}} {{bucket}}").
				RefId("A")}).
			Title("Mean padding ratio by bucket").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 18}).
			Height(0x8).
			Unit("percentunit").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x9).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model, verdict) (rate(stepserve_steps_total{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}} {{verdict}}").
				RefId("A")}).
			Title("Steps by verdict").
			Description("clean: no explain signal; overhead: CPU fallback, recompile, host bounce or extra transfers; unmeasured: the engine could not run explain").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 26}).
			Height(0x8).
			Unit("ops").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0xa).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model, bucket, signal) (increase(stepserve_step_signals_total{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}} {{bucket}} {{signal}}").
				RefId("A")}).
			Title("Explain signals by bucket").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 26}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0xb).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("histogram_quantile(0.99, sum by (model, bucket, le) (rate(stepserve_step_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))").
				LegendFormat("{{model}} {{bucket}}").
				RefId("A")}).
			Title("Step duration p99 by bucket").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 34}).
			Height(0x8).
			Unit("s").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x1b).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model, bucket) (rate(stepserve_step_device_seconds_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model, bucket) (rate(stepserve_step_device_seconds_count{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}} {{bucket}} device").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("sum by (model, bucket) (rate(stepserve_step_duration_seconds_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model, bucket) (rate(stepserve_step_duration_seconds_count{model=~\"$model\"}[$__rate_interval])) - sum by (model, bucket) (rate(stepserve_step_device_seconds_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model, bucket) (rate(stepserve_step_device_seconds_count{model=~\"$model\"}[$__rate_interval]))").
					LegendFormat("{{model}} {{bucket}} host overhead").
					RefId("B")}).
			Title("Step device time and host overhead (mean by bucket)").
			Description("Device time per step (stepserve_step_device_seconds: a worker's step body, the CPU engine's compute; absent where the engine does not measure it) beside the wall-clock step; host overhead = step wall time - device time (IPC, staging conversions, the explain region).").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 42}).
			Height(0x8).
			Unit("s").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0xc).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model, direction) (rate(stepserve_transfers_total{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}} {{direction}}").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("sum by (model) (rate(stepserve_host_bounce_bytes_total{model=~\"$model\"}[$__rate_interval]))").
					LegendFormat("{{model}} host bounce bytes/s").
					RefId("B")}).
			Title("Transfers by direction").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 34}).
			Height(0x8).
			Unit("ops").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithRow(dashboard.NewRowBuilder("Devices").
			Title("Devices").
			GridPos(dashboard.GridPos{H: 1, W: 24, X: 0, Y: 50}).
			Id(0xd)).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0xe).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("stepserve_model_ready{model=~\"$model\"}").
				LegendFormat("{{model}} {{engine}}").
				RefId("A")}).
			Title("Model ready").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 51}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0xf).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("stepserve_worker_up").
				LegendFormat("device {{device}} up").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("increase(stepserve_worker_restarts_total[$__rate_interval])").
					LegendFormat("device {{device}} restarts").
					RefId("B"),
				prometheus.NewDataqueryBuilder().
					Expr("sum by (model, to) (increase(stepserve_engine_failovers_total{model=~\"$model\"}[$__rate_interval]))").
					LegendFormat("{{model}} failover to {{to}}").
					RefId("C")}).
			Title("Worker up and restarts").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 51}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x10).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("stepserve_device_memory_bytes{kind=~\"allocated|reserved|active|cached\"}").
				LegendFormat("dev {{device}} npu {{npu}} chiplet {{chiplet}} {{kind}}").
				RefId("A")}).
			Title("Device memory per chiplet").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 59}).
			Height(0x8).
			Unit("bytes").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x11).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("max by (pod, card) (rbln_npu_utilization) * on (pod) group_left () max by (pod) (stepserve_build_info)").
				LegendFormat("{{pod}} card {{card}}").
				RefId("A")}).
			Title("NPU utilisation (rbln-metrics-exporter, by pod)").
			Description("The NPU exporter's utilisation joined with stepserve's pods.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 59}).
			Height(0x8).
			Unit("percent").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x12).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("stepserve_model_load_duration_seconds{model=~\"$model\"}").
				LegendFormat("{{model}} load").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("stepserve_bucket_compile_duration_seconds{model=~\"$model\"}").
					LegendFormat("{{model}} {{bucket}} compile").
					RefId("B")}).
			Title("Model load and bucket compile time").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 67}).
			Height(0x8).
			Unit("s").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x17).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (engine, device, kind) (increase(stepserve_worker_late_replies_total[$__rate_interval]))").
				LegendFormat("{{engine}} device {{device}} {{kind}}").
				RefId("A")}).
			Title("Worker late replies").
			Description("Results that came after their caller had given up (a memory poll or a load that waited behind a compile holding the worker's interpreter): dropped and counted, never a restart. A steady rate means callers' deadlines are shorter than the worker's compiles.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 67}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x18).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("stepserve_model_replicas{model=~\"$model\"}").
				LegendFormat("{{model}} loaded").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("stepserve_model_replicas_healthy{model=~\"$model\"}").
					LegendFormat("{{model}} healthy").
					RefId("B")}).
			Title("Replicas loaded and healthy").
			Description("A model's replicas on its engine (model.yaml's instances: devices x per_device) and how many are healthy now. Batches go to the healthy ones; below instances.min_ready healthy the model is not ready (unless a failover engine serves it).").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 75}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x19).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model, engine, device) (rate(stepserve_device_steps_total{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}} {{engine}} device {{device}}").
				RefId("A")}).
			Title("Steps by device").
			Description("How a model's batches spread over the devices it is loaded on: each batch goes to the healthy replica with the fewest steps in flight. A device that takes no steps while its neighbours do has a replica down.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 75}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithRow(dashboard.NewRowBuilder("Connections").
			Title("Connections").
			GridPos(dashboard.GridPos{H: 1, W: 24, X: 0, Y: 83}).
			Id(0x13)).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x14).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (pod, listener) (stepserve_connections_open)").
				LegendFormat("{{pod}} {{listener}} open").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("max by (pod, listener) (stepserve_connections_max)").
					LegendFormat("{{pod}} {{listener}} limit").
					RefId("B")}).
			Title("Open connections and limit").
			Description("Client connections per listener against server.max_connections (api) and the metrics listener's fixed limit.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 84}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x15).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (pod, listener) (rate(stepserve_connections_closed_idle_total[$__rate_interval]))").
				LegendFormat("{{pod}} {{listener}} closed idle").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("sum by (pod, listener) (rate(stepserve_connections_refused_total[$__rate_interval]))").
					LegendFormat("{{pod}} {{listener}} refused").
					RefId("B")}).
			Title("Connections closed idle and refused").
			Description("At the limit: idle connections closed to make room, and new ones refused with 503 because every open one was busy (those 503s are not in the request rate).").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 84}).
			Height(0x8).
			Unit("cps").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x16).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (pod) (stepserve_inflight_bytes)").
				LegendFormat("{{pod}} in flight").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("max by (pod) (stepserve_inflight_bytes_limit)").
					LegendFormat("{{pod}} budget").
					RefId("B")}).
			Title("In-flight request memory and budget").
			Description("Bytes the requests in flight hold (bodies, tensors, step buffers, outputs, responses not yet written) against server.max_inflight_bytes; at the budget new requests wait, then get 503.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 24, X: 0, Y: 92}).
			Height(0x8).
			Span(0x18).
			Unit("bytes").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x1a).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("max by (model, lists) (stepserve_bucket_padding_work_ratio{model=~\"$model\"})").
				LegendFormat("{{model}} {{lists}}").
				RefId("A")}).
			Title("Padding waste: current vs advised buckets").
			Description("The fraction of the device work that is padding on each model's recent steps (decayed, half-life 1h), with its bucket lists now (solid) and with the lists the bucket advisor gives for as many programs (dashed). A wide gap: run `stepserve advise --model <name>` (or GET /v2/models/<name>/buckets/advice) and paste its model.yaml block.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 100}).
			Height(0x8).
			Unit("percentunit").
			Min(0).
			Max(1).
			Overrides([]cog.Builder[dashboard.DashboardFieldConfigSourceOverrides]{dashboard.NewDashboardFieldConfigSourceOverridesBuilder().
				Matcher(dashboard.MatcherConfig{Id: "byRegexp", Options: ".* advised"}).
				Properties([]dashboard.DynamicConfigValue{dashboard.DynamicConfigValue{Id: "custom.lineStyle", Value: map[string]interface{}{"dash": []interface{}{10, 10}, "fill": "dash"}}})}).
			WithOverride(dashboard.MatcherConfig{Id: "byRegexp", Options: ".* advised"}, []dashboard.DynamicConfigValue{dashboard.DynamicConfigValue{Id: "custom.lineStyle", Value: map[string]interface{}{"fill": "dash", "dash": []interface{}{10, 10}}}}).
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false).
				Calcs([]string{"lastNotNull"})).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x1c).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model) (rate(stepserve_batch_token_deferrals_total{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}}").
				RefId("A")}).
			Title("Token-budget deferrals").
			Description("Requests per second that batching.max_batch_tokens kept out of the batch being formed: each started a later batch rather than pad that one to its length. Steady deferrals with idle steps: the budget is too tight for the traffic; none at all: it never binds.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 100}).
			Height(0x8).
			Unit("reqps").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x1d).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (engine, device, outcome) (increase(stepserve_worker_model_reloads_total[$__rate_interval]))").
				LegendFormat("{{engine}} device {{device}} {{outcome}}").
				RefId("A")}).
			Title("Worker model reloads").
			Description("Models put back on a restarted worker, by outcome. Failed reloads of one model in a row are retried with a growing backoff (up to 5 minutes); a steady failed rate is a model whose reload takes its worker down (see the log: 'reloading model after restart failed').").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 108}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x1e).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (engine, device) (rate(stepserve_worker_output_lines_dropped_total[$__rate_interval]))").
				LegendFormat("{{engine}} device {{device}}").
				RefId("A")}).
			Title("Worker output lines dropped").
			Description("Lines a worker printed beyond the log's rate limit for worker output (50 lines a second, bursts of 200): a model that prints without end. The log keeps a bounded share; the rest are counted here.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 108}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x1f).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("histogram_quantile(0.5, sum by (model, le) (rate(stepserve_generation_time_to_first_token_seconds_bucket{model=~\"$model\"}[$__rate_interval])))").
				LegendFormat("{{model}} p50").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("histogram_quantile(0.99, sum by (model, le) (rate(stepserve_generation_time_to_first_token_seconds_bucket{model=~\"$model\"}[$__rate_interval])))").
					LegendFormat("{{model}} p99").
					RefId("B")}).
			Title("Generation: time to first token (p50, p99)").
			Description("Time from a generation's arrival to its first token: queueing, then its prompt's prefill, a chunk a step beside the running decodes.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 116}).
			Height(0x8).
			Unit("s").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x20).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("histogram_quantile(0.5, sum by (model, le) (rate(stepserve_generation_time_per_output_token_seconds_bucket{model=~\"$model\"}[$__rate_interval])))").
				LegendFormat("{{model}} p50").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("histogram_quantile(0.99, sum by (model, le) (rate(stepserve_generation_time_per_output_token_seconds_bucket{model=~\"$model\"}[$__rate_interval])))").
					LegendFormat("{{model}} p99").
					RefId("B")}).
			Title("Generation: time per output token (p50, p99)").
			Description("A generation's mean time between two tokens after the first: what a streaming reader feels. It grows with the decode batch and with prompt chunks prefilled beside it.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 116}).
			Height(0x8).
			Unit("s").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x21).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model) (rate(stepserve_generation_prompt_tokens_total{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}} prompt").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("sum by (model) (rate(stepserve_generation_generated_tokens_total{model=~\"$model\"}[$__rate_interval]))").
					LegendFormat("{{model}} generated").
					RefId("B")}).
			Title("Generation: tokens per second").
			Description("Prompt tokens admitted and tokens generated, per second.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 124}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x22).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("histogram_quantile(0.5, sum by (model, le) (rate(stepserve_generation_request_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))").
				LegendFormat("{{model}} p50").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("histogram_quantile(0.99, sum by (model, le) (rate(stepserve_generation_request_duration_seconds_bucket{model=~\"$model\"}[$__rate_interval])))").
					LegendFormat("{{model}} p99").
					RefId("B")}).
			Title("Generation: request duration (p50, p99)").
			Description("A generation's time from arrival to its last token.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 124}).
			Height(0x8).
			Unit("s").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x23).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model) (stepserve_generation_kv_cache_blocks{model=~\"$model\", state=\"used\"}) / sum by (model) (stepserve_generation_kv_cache_blocks{model=~\"$model\"})").
				LegendFormat("{{model}}").
				RefId("A")}).
			Title("Generation: KV cache blocks used").
			Description("The share of each language model's KV cache blocks held by sequences. Near 100% with sequences waiting, new ones wait for blocks and running ones are preempted.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 132}).
			Height(0x8).
			Unit("percentunit").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x24).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model, state) (stepserve_generation_sequences{model=~\"$model\"})").
				LegendFormat("{{model}} {{state}}").
				RefId("A")}).
			Title("Generation: sequences running and waiting").
			Description("Sequences in the continuous batch (running) and queued for it (waiting: for a slot of max_num_seqs, or for KV blocks).").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 132}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x25).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model) (rate(stepserve_generation_preemptions_total{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}}").
				RefId("A")}).
			Title("Generation: preemptions per second").
			Description("Running sequences sent back to wait because the KV cache ran out of blocks; each is recomputed later (its output unchanged), at the cost of its prefill again.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 140}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x26).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model) (rate(stepserve_generation_step_sequences_sum{model=~\"$model\"}[$__rate_interval])) / sum by (model) (rate(stepserve_generation_step_sequences_count{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}}").
				RefId("A")}).
			Title("Generation: sequences per step (mean)").
			Description("Sequences each step computed: decodes and prompt chunks together. The continuous batch at work.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 12, Y: 140}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x27).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("sum by (model) (rate(stepserve_generation_prefix_cache_hit_tokens_total{model=~\"$model\"}[$__rate_interval])) / sum by (model) (rate(stepserve_generation_prefix_cache_queried_tokens_total{model=~\"$model\"}[$__rate_interval]))").
				LegendFormat("{{model}}").
				RefId("A")}).
			Title("Generation: prefix cache hit rate").
			Description("The share of admitted sequences' tokens the prefix cache held (computed before by a sequence with the same start, shared, not computed again): a common system prompt is computed once.").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 148}).
			Height(0x8).
			Unit("percentunit").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort(""))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(0x28).
			Targets([]cog.Builder[variants.Dataquery]{prometheus.NewDataqueryBuilder().
				Expr("increase(stepserve_device_allocator_events[15m])").
				LegendFormat("dev {{device}} npu {{npu}} chiplet {{chiplet}} {{event}} /15m").
				RefId("A"),
				prometheus.NewDataqueryBuilder().
					Expr("stepserve_device_memory_age_seconds").
					LegendFormat("dev {{device}} reading age (s)").
					RefId("B")}).
			Title("Device allocator events and memory reading age").
			Description("Out-of-memory errors and allocation retries counted by the device allocator (per NPU and chiplet; an increase fires StepserveDeviceOOM), and how old the memory reading was at its last poll (0: read live).").
			Datasource(common.DataSourceRef{Type: cog.ToPtr[string]("prometheus"), Uid: cog.ToPtr[string]("${datasource}")}).
			GridPos(dashboard.GridPos{H: 8, W: 12, X: 0, Y: 156}).
			Height(0x8).
			Unit("short").
			Legend(common.NewVizLegendOptionsBuilder().
				DisplayMode("table").
				Placement("bottom").
				ShowLegend(false)).
			Tooltip(common.NewVizTooltipOptionsBuilder().
				Mode("multi").
				Sort("")))
}
