// Command gen-schema writes the Helm chart's values.schema.json with the
// schema of stepserve's configuration file (config.Schema) as the schema of
// the chart's config value, so that helm install refuses a key or a value
// the server would refuse, and accepts every value it accepts. The rest of
// the file (the chart's own values) is kept; keys are written sorted.
//
//	go run ./cmd/gen-schema [-chart deploy/helm/stepserve]
//
// make schema runs it; a test fails while the file is not current.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/stepserve/stepserve/config"
	"github.com/stepserve/stepserve/internal/genjson"
)

func main() {
	chart := flag.String("chart", "deploy/helm/stepserve", "the chart directory")
	flag.Parse()
	path := filepath.Join(*chart, "values.schema.json")
	old, err := os.ReadFile(path)
	if err == nil {
		var b []byte
		if b, err = render(old); err == nil {
			err = os.WriteFile(path, b, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen-schema:", err)
		os.Exit(1)
	}
}

// render is the chart schema old with its config value's schema made
// config.Schema().
func render(old []byte) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(old, &doc); err != nil {
		return nil, fmt.Errorf("values.schema.json: %w", err)
	}
	props, ok := doc["properties"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("values.schema.json: no properties object")
	}
	s := config.Schema()
	s["description"] = "stepserve's configuration (its YAML file): every key, typed; unknown keys are refused. Generated from the server's keys by make schema."
	props["config"] = s
	return genjson.Marshal(doc)
}
