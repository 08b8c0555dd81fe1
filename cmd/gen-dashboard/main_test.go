package main

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The chart's dashboard is what the definition here renders (make
// dashboard), and it is a dashboard: uid, the data source variable, every
// panel with an id and the queries it shows.
func TestRenderIsCurrent(t *testing.T) {
	got, err := Render()
	require.NoError(t, err)
	have, err := os.ReadFile("../../deploy/helm/stepserve/files/dashboard.json")
	require.NoError(t, err)
	assert.Equal(t, string(have), string(got), "deploy/helm/stepserve/files/dashboard.json is stale: run make dashboard")

	var d struct {
		UID        string `json:"uid"`
		Templating struct {
			List []struct{ Name, Type string }
		}
		Panels []struct {
			ID      int `json:"id"`
			Type    string
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(got, &d))
	assert.Equal(t, "stepserve", d.UID)
	require.NotEmpty(t, d.Templating.List)
	assert.Equal(t, "datasource", d.Templating.List[0].Name)
	ids := map[int]bool{}
	queries := 0
	for _, p := range d.Panels {
		assert.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		if p.Type != "row" {
			assert.NotEmpty(t, p.Targets, p.Title)
		}
		queries += len(p.Targets)
	}
	assert.Greater(t, queries, 40)
}
