package archtest

import (
	"fmt"
	"maps"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/stepserve/stepserve/"

// layers ranks the module's packages: a package imports only from its
// own layer and those below. A path ending in /... names every package
// below it. A package in none of them fails the test until it is placed.
var layers = [][]string{
	{"internal/bytesize", "internal/clip", "internal/gcfloor", "internal/genjson", "internal/half", "internal/jinja",
		"internal/memlimit", "internal/npugroup", "internal/suggest", "internal/trace", "internal/archtest", "internal/tlsfiles", "internal/tlsfiles/tlstest", "models/gguf",
		"bucketing", "generation", "generation/grammar", "models/tokenizers"},
	{"models", "internal/randweights"},
	{"engine", "engine/..."},
	{"steps"},
	{"batching"},
	{"config", "serving"},
	{"server/inferencepb", "server/apierr"},
	{"server/shm"},                   // the shared-memory registry
	{"server/wire"},                  // OIP's tensors, checked and bounded
	{"server/core"},                  // the request lifecycle and what every door shares
	{"server/triton", "server/text"}, // Triton's configuration; what the text doors share
	{"server/oip", "server/grpcapi", "server/openai", "server/anthropic", "server/tei", "server/tgi", "server/admin"}, // the doors
	{"server"},
	{"cmd/...", "bench/..."},
}

// doors may import none of each other, and, with the core they share,
// none of below: they reach the models through serving.
var (
	doors      = []string{"server/oip", "server/grpcapi", "server/openai", "server/anthropic", "server/tei", "server/tgi", "server/admin"}
	doorShared = []string{"server/apierr", "server/shm", "server/wire", "server/core", "server/text", "server/triton"}
	pastDoors  = []string{"engine", "engine/...", "batching", "generation", "steps"}
)

// matches reports whether pkg is pattern or, for a pattern ending in
// /..., below it.
func matches(pattern, pkg string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

func matchesAny(patterns []string, pkg string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return matches(p, pkg) })
}

// rank is pkg's layer, or -1 when it is in none.
func rank(pkg string) int {
	for i, l := range layers {
		if matchesAny(l, pkg) {
			return i
		}
	}
	return -1
}

// violations are the rules graph (package -> the module's packages it
// imports, both relative to the module) breaks, one line each.
func violations(graph map[string][]string) []string {
	var out []string
	for _, pkg := range slices.Sorted(maps.Keys(graph)) {
		r := rank(pkg)
		if r < 0 {
			out = append(out, fmt.Sprintf("%s is in no layer: place it in internal/archtest's layers", pkg))
			continue
		}
		door := matchesAny(doors, pkg)
		for _, imp := range graph[pkg] {
			switch ir := rank(imp); {
			case ir > r:
				out = append(out, fmt.Sprintf("%s imports %s, a layer above its own", pkg, imp))
			case door && matchesAny(doors, imp):
				out = append(out, fmt.Sprintf("%s imports %s: a door imports no other door", pkg, imp))
			case (door || matchesAny(doorShared, pkg)) && matchesAny(pastDoors, imp):
				out = append(out, fmt.Sprintf("%s imports %s: the doors reach the models through serving", pkg, imp))
			}
		}
	}
	return out
}

// The module's packages keep the rules.
func TestImportRules(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"...")
	out, err := cmd.Output()
	require.NoError(t, err, "go list")
	graph := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		graph[pkg] = nil
		for _, imp := range fields[1:] {
			if rel, ok := strings.CutPrefix(imp, module); ok {
				graph[pkg] = append(graph[pkg], rel)
			}
		}
	}
	require.Contains(t, graph, "server/oip", "go list listed the module")
	assert.Empty(t, violations(graph), "import rules broken")
}

// The rules catch what they are for.
func TestImportRulesCatchViolations(t *testing.T) {
	assert.Equal(t, []string{
		"server/oip imports engine: the doors reach the models through serving",
		"server/oip imports server/grpcapi: a door imports no other door",
	}, violations(map[string][]string{"server/oip": {"engine", "server/grpcapi", "serving"}}))
	assert.Equal(t, []string{"server/core imports steps: the doors reach the models through serving"},
		violations(map[string][]string{"server/core": {"steps"}}))
	assert.Equal(t, []string{"models imports serving, a layer above its own"},
		violations(map[string][]string{"models": {"serving", "bucketing"}}))
	assert.Equal(t, []string{"newpkg is in no layer: place it in internal/archtest's layers"},
		violations(map[string][]string{"newpkg": nil}))
	assert.True(t, matches("engine/...", path.Join("engine", "rbln")))
}
