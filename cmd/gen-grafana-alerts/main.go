// Command gen-grafana-alerts writes the chart's Grafana-managed alert
// rules (files/grafana-alerts.json, Grafana's alerting file-provisioning
// format) from its Prometheus rules (files/stepserve-rules.yaml), built
// with Grafana's typed Go SDK (github.com/grafana/grafana-foundation-sdk,
// Apache-2.0), so that the two cannot drift: each Prometheus alert becomes a
// Grafana rule of the same name, expression, for, labels and annotations.
//
// A Prometheus alert fires for every series its expression returns; the
// Grafana rule asks the expression (A, instant), takes each series' last
// value (B), and fires for every value it got (C: $B == $B, true for any
// number). The data source's uid is the chart's to set
// (grafanaAlerts.datasourceUid): the file carries a placeholder.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/alerting"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/expr"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/stepserve/stepserve/internal/genjson"
)

// DatasourcePlaceholder is replaced by the chart with the Prometheus data
// source's uid.
const DatasourcePlaceholder = "__STEPSERVE_PROMETHEUS_UID__"

// Folder is the Grafana folder the rules are provisioned in.
const Folder = "stepserve"

func main() {
	chart := flag.String("chart", "deploy/helm/stepserve", "the chart directory")
	flag.Parse()
	src, err := os.ReadFile(filepath.Join(*chart, "files", "stepserve-rules.yaml"))
	if err == nil {
		var out []byte
		if out, err = Render(src); err == nil {
			err = os.WriteFile(filepath.Join(*chart, "files", "grafana-alerts.json"), out, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen-grafana-alerts:", err)
		os.Exit(1)
	}
}

// promRules is the part of a Prometheus rule file the conversion reads.
type promRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// provisioning is Grafana's alerting file-provisioning document.
type provisioning struct {
	APIVersion int                 `json:"apiVersion"`
	Groups     []provisioningGroup `json:"groups"`
}

type provisioningGroup struct {
	OrgID    int              `json:"orgId"`
	Name     string           `json:"name"`
	Folder   string           `json:"folder"`
	Interval string           `json:"interval"`
	Rules    []map[string]any `json:"rules"`
}

// provisioned are the rule fields Grafana's provisioning files take; the
// SDK's API-shaped rule has more (folderUID, ruleGroup, orgID), which the
// file's group carries instead.
var provisioned = []string{"uid", "title", "condition", "data", "noDataState", "execErrState", "for", "labels", "annotations", "isPaused"}

// promValue is Prometheus's $value in an annotation's template.
var promValue = regexp.MustCompile(`\$value\b`)

// Render converts a Prometheus rule file into Grafana's provisioning JSON.
func Render(src []byte) ([]byte, error) {
	var pr promRules
	if err := yaml.Unmarshal(src, &pr); err != nil {
		return nil, fmt.Errorf("stepserve-rules.yaml: %w", err)
	}
	doc := provisioning{APIVersion: 1}
	for _, g := range pr.Groups {
		pg := provisioningGroup{OrgID: 1, Name: g.Name, Folder: Folder, Interval: "1m"}
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue // a recording rule: Prometheus's own
			}
			// Grafana's templates name a rule's value by its query:
			// $values.B.Value where Prometheus says $value.
			ann := map[string]string{}
			for k, v := range r.Annotations {
				ann[k] = promValue.ReplaceAllString(v, "$$values.B.Value")
			}
			rule, err := grafanaRule(g.Name, r.Alert, r.Expr, r.For, r.Labels, ann)
			if err != nil {
				return nil, fmt.Errorf("alert %s: %w", r.Alert, err)
			}
			pg.Rules = append(pg.Rules, rule)
		}
		if len(pg.Rules) > 0 {
			doc.Groups = append(doc.Groups, pg)
		}
	}
	return genjson.Marshal(doc)
}

func grafanaRule(group, alert, query, forDur string, labels, annotations map[string]string) (map[string]any, error) {
	if forDur == "" {
		forDur = "0s"
	}
	rb := alerting.NewRuleBuilder(alert).
		Uid(uid(alert)).
		RuleGroup(group).
		Condition("C").
		For(forDur).
		NoDataState(alerting.RuleNoDataStateOK).
		ExecErrState(alerting.RuleExecErrStateError).
		Labels(labels).
		Annotations(annotations).
		Queries([]cog.Builder[alerting.Query]{
			alerting.NewQueryBuilder("A").
				DatasourceUid(DatasourcePlaceholder).
				RelativeTimeRange(600, 0).
				Model(prometheus.NewDataqueryBuilder().Expr(strings.TrimSpace(query)).Instant().RefId("A")),
			alerting.NewQueryBuilder("B").
				DatasourceUid("__expr__").
				Model(expr.NewExprBuilder().TypeReduce(expr.NewTypeReduceBuilder().RefId("B").Expression("A").Reducer(expr.TypeReduceReducerLast))),
			alerting.NewQueryBuilder("C").
				DatasourceUid("__expr__").
				Model(expr.NewExprBuilder().TypeMath(expr.NewTypeMathBuilder().RefId("C").Expression("$B == $B"))),
		})
	rule, err := rb.Build()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(rule)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, k := range provisioned {
		if v, ok := m[k]; ok {
			out[k] = v
		}
	}
	return out, nil
}

// uid is a rule's uid: stable, at most 40 characters, from its name.
func uid(alert string) string {
	u := "stepserve-" + strings.ToLower(strings.TrimPrefix(alert, "Stepserve"))
	if len(u) > 40 {
		u = u[:40]
	}
	return u
}
