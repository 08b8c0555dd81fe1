package main

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The committed Grafana rules are what the Prometheus rules render to
// (make grafana-alerts), and every alert has its Grafana twin, with the
// same expression, for, labels and its annotations' $value named as
// Grafana names it.
func TestRenderIsCurrentAndComplete(t *testing.T) {
	src, err := os.ReadFile("../../deploy/helm/stepserve/files/stepserve-rules.yaml")
	require.NoError(t, err)
	got, err := Render(src)
	require.NoError(t, err)
	have, err := os.ReadFile("../../deploy/helm/stepserve/files/grafana-alerts.json")
	require.NoError(t, err)
	assert.Equal(t, string(have), string(got), "deploy/helm/stepserve/files/grafana-alerts.json is stale: run make grafana-alerts")

	var doc provisioning
	require.NoError(t, json.Unmarshal(got, &doc))
	byTitle := map[string]map[string]any{}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			byTitle[r["title"].(string)] = r
		}
	}
	rule := byTitle["StepserveWorkerDown"]
	require.NotNil(t, rule)
	assert.Equal(t, "2m", rule["for"])
	assert.Equal(t, map[string]any{"severity": "critical"}, rule["labels"])
	data := rule["data"].([]any)
	require.Len(t, data, 3)
	assert.Equal(t, "stepserve_worker_up == 0", data[0].(map[string]any)["model"].(map[string]any)["expr"])
	for _, r := range byTitle {
		for _, v := range r["annotations"].(map[string]any) {
			assert.NotRegexp(t, `\$value\b`, v, "Grafana names the value $values.B.Value")
		}
	}
}
