package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/yannh/kubeconform/pkg/validator"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// The schemas the manifests are validated against, every one from a pinned
// source and none from the network: Kubernetes' own OpenAPI document, and
// the CRDs of the operators the chart and deploy/kserve write objects for.
// The modules that are not requirements of go.mod (nothing imports them)
// are pinned here and downloaded by make deps (deps-host): keep the
// versions there in step.
const (
	// Kubernetes' swagger.json, of the release k8s.io/api v0.37.2 is cut
	// from.
	kubernetesModule = "k8s.io/kubernetes@v1.37.2"
	// KEDA's ScaledObject. v2.21.1 declares go 1.27.4, which this module's
	// go 1.26 refuses to download; its config/crd/bases is byte for byte
	// v2.21.0's.
	kedaModule = "github.com/kedacore/keda/v2@v2.21.0"
	// Without a version: the one go.mod requires, the one whose Go types the
	// other tests decode into.
	gaieModule       = "sigs.k8s.io/gateway-api-inference-extension"
	gatewayAPIModule = "sigs.k8s.io/gateway-api"
)

// crdSources are the CRD files, by module (or "" for this module's
// testdata, where the CRDs no Go module serves are committed with their
// SOURCE.md) and glob.
var crdSources = []struct{ module, glob string }{
	{gaieModule, "config/crd/bases/*.yaml"},
	{gatewayAPIModule, "config/crd/standard/*.yaml"},
	{kedaModule, "config/crd/bases/keda.sh_*.yaml"},
	{"", "testdata/crds/*/*.yaml"},
}

// schemaLocation is where kubeconform looks a resource's schema up: one
// directory per API group ("v1" for the core group), one file per kind and
// version.
const schemaLocation = "{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json"

// definitionsFile holds Kubernetes' definitions, once; the kinds' files
// refer into it, as the CRDs' metadata does.
const definitionsFile = "_definitions.json"

// schemaSet is every schema file, by path under the schema directory, and
// the kinds the CRDs define ("group/version/Kind", as helm's
// --api-versions takes them).
type schemaSet struct {
	files    map[string][]byte
	crdKinds []string
}

var (
	schemasOnce sync.Once
	schemas     *schemaSet
	schemasErr  error
)

// loadSchemas converts the sources once per test binary: reading them is
// most of the cost.
func loadSchemas(t *testing.T) *schemaSet {
	t.Helper()
	schemasOnce.Do(func() { schemas, schemasErr = buildSchemas() })
	require.NoError(t, schemasErr)
	return schemas
}

// newValidator is a strict kubeconform validator over the schemas, written
// into a directory of the test's: a kind without a schema is an error,
// never skipped.
func newValidator(t *testing.T) validator.Validator {
	t.Helper()
	set := loadSchemas(t)
	dir := t.TempDir()
	for name, b := range set.files {
		path := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, b, 0o644))
	}
	v, err := validator.New([]string{filepath.Join(dir, schemaLocation)}, validator.Opts{Strict: true})
	require.NoError(t, err)
	return v
}

// validate checks every document of a YAML stream and returns one line per
// problem: a resource that breaks its schema (the field and what is wrong
// with it), or one with no schema at all. It also returns how many
// resources it validated, so that an empty stream cannot pass unnoticed.
func validate(v validator.Validator, name string, manifests []byte) (problems []string, validated int) {
	for _, res := range v.Validate(name, io.NopCloser(bytes.NewReader(manifests))) {
		what := name
		if sig, err := res.Resource.Signature(); err == nil {
			what = fmt.Sprintf("%s %s/%s %s", name, sig.Version, sig.Kind, sig.Name)
		}
		switch res.Status {
		case validator.Valid:
			validated++
		case validator.Empty:
		case validator.Invalid:
			for _, p := range leaves(res.Err) {
				problems = append(problems, what+": "+p)
			}
		default: // Error (no schema, unparsable) or Skipped, which nothing should be
			problems = append(problems, fmt.Sprintf("%s: %v (status %d)", what, res.Err, res.Status))
		}
	}
	return problems, validated
}

// leaves are the failures of a validation error, each at the field it
// names. kubeconform's own list (Result.ValidationErrors) stops at the
// first $ref, which for Kubernetes' kinds is the whole object; the
// error's text, one failure a line (its lines joined with " - at "), goes
// down to the field.
func leaves(err error) []string {
	parts := strings.Split(err.Error(), " - at ")
	var out []string
	for _, p := range parts[1:] {
		p = "at " + strings.TrimSpace(p)
		if !strings.HasSuffix(p, ": validation failed") {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return []string{err.Error()}
	}
	return out
}

func buildSchemas() (*schemaSet, error) {
	set := &schemaSet{files: map[string][]byte{}}
	var mu sync.Mutex
	add := func(group, version, kind string, schema any, crd bool) error {
		b, err := json.Marshal(schema)
		if err != nil {
			return err
		}
		dir := group
		if dir == "" {
			dir = version
		}
		mu.Lock()
		defer mu.Unlock()
		set.files[filepath.Join(dir, strings.ToLower(kind)+"_"+version+".json")] = b
		if crd {
			set.crdKinds = append(set.crdKinds, group+"/"+version+"/"+kind)
		}
		return nil
	}

	var files []string
	for _, src := range crdSources {
		dir := "."
		if src.module != "" {
			var err error
			if dir, err = moduleDir(src.module); err != nil {
				return nil, err
			}
		}
		matches, err := filepath.Glob(filepath.Join(dir, src.glob))
		if err != nil {
			return nil, err
		}
		if len(matches) == 0 {
			return nil, fmt.Errorf("no CRDs in %s", filepath.Join(dir, src.glob))
		}
		files = append(files, matches...)
	}

	var wg sync.WaitGroup
	errs := make([]error, len(files)+1)
	var definitions []byte
	wg.Go(func() { definitions, errs[0] = kubernetesSchemas(add) })
	for i, f := range files {
		wg.Go(func() {
			if err := crdSchemas(f, add); err != nil {
				errs[i+1] = fmt.Errorf("%s: %w", f, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	set.files[definitionsFile] = definitions
	sort.Strings(set.crdKinds)
	return set, nil
}

// moduleDir is where the module cache holds a module, never downloading
// it: the tests run offline after make deps.
func moduleDir(module string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", module)
	cmd.Env = append(os.Environ(), "GOPROXY=off")
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); jerr != nil || info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("run make deps: %s is not in the module cache (go mod download: %v %s)", module, err, info.Error)
	}
	return info.Dir, nil
}

// kubernetesSchemas adds a schema for each of Kubernetes' kinds that
// refers into the definitions, which it returns, for one file.
func kubernetesSchemas(add func(group, version, kind string, schema any, crd bool) error) ([]byte, error) {
	dir, err := moduleDir(kubernetesModule)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "api", "openapi-spec", "swagger.json"))
	if err != nil {
		return nil, err
	}
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	defs := map[string]any{}
	for name, def := range doc.Definitions {
		switch name {
		// Both serialise as either: "1Gi" or 1, "http" or 8080.
		case "io.k8s.apimachinery.pkg.api.resource.Quantity":
			defs[name] = map[string]any{"type": []any{"string", "number"}}
		case "io.k8s.apimachinery.pkg.util.intstr.IntOrString":
			defs[name] = map[string]any{"type": []any{"string", "integer"}}
		default:
			defs[name] = strictSchema(def, false)
		}
		gvks, _ := def["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			// The kinds' files are one directory down from the definitions.
			if err := add(group, version, kind, map[string]any{"$ref": "../" + definitionsFile + "#/definitions/" + name}, false); err != nil {
				return nil, err
			}
		}
	}
	return json.Marshal(map[string]any{"definitions": defs})
}

// crdSchemas adds the schema of every served version of the CRDs in a
// file.
func crdSchemas(path string, add func(group, version, kind string, schema any, crd bool) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	n := 0
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		var crd struct {
			Kind string
			Spec struct {
				Group    string
				Names    struct{ Kind string }
				Versions []struct {
					Name   string
					Served bool
					Schema struct {
						OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
					}
				}
			}
		}
		if err := yaml.Unmarshal(doc, &crd); err != nil {
			return err
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			if v.Schema.OpenAPIV3Schema == nil {
				return fmt.Errorf("%s/%s %s: no openAPIV3Schema", crd.Spec.Group, v.Name, crd.Spec.Names.Kind)
			}
			schema := strictSchema(v.Schema.OpenAPIV3Schema, true).(map[string]any)
			// The API server validates a custom resource's metadata as any
			// object's: the CRD says only "type: object".
			if props, ok := schema["properties"].(map[string]any); ok {
				meta := map[string]any{"$ref": "../" + definitionsFile + "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
				if m, ok := props["metadata"].(map[string]any); ok && len(m) > 1 {
					// Some CRDs constrain it further (a name's length).
					delete(m, "additionalProperties")
					meta = map[string]any{"allOf": []any{meta, m}}
				}
				props["metadata"] = meta
			}
			if err := add(crd.Spec.Group, v.Name, crd.Spec.Names.Kind, schema, true); err != nil {
				return err
			}
			n++
		}
	}
	if n == 0 {
		return errors.New("no served CRD versions")
	}
	return nil
}

// strictSchema converts an OpenAPI schema, Kubernetes' (swagger 2.0) or a
// CRD's (OpenAPI v3, structural), into the JSON schema (draft 4) that
// kubeconform validates with, the way kubeconform's openapi2jsonschema
// writes its strict schemas: an object that lists its properties takes no
// others, so a misspelt field fails, and an int-or-string takes either.
// Unlike openapi2jsonschema it honours what the API server does with a
// CRD's x-kubernetes-preserve-unknown-fields (the object keeps fields it
// does not list) and nullable (null is a value), and is strict at the root
// too (the API server's strict field validation is).
func strictSchema(node any, crd bool) any {
	return convert(node, crd, false)
}

// convert converts one schema. Within allOf, anyOf, oneOf and not, a
// schema constrains its parent's fields rather than lists them (a
// structural schema's rule), so nothing there is closed.
func convert(node any, crd, junctor bool) any {
	in, ok := node.(map[string]any)
	if !ok {
		return node
	}
	if in["x-kubernetes-int-or-string"] == true || in["format"] == "int-or-string" {
		out := map[string]any{"type": []any{"integer", "string"}}
		if p, ok := in["pattern"]; ok {
			out["pattern"] = p
		}
		if in["nullable"] == true {
			out["type"] = []any{"integer", "string", "null"}
		}
		return out
	}
	out := make(map[string]any, len(in))
	for k, v := range in {
		switch k {
		case "description", "example", "x-kubernetes-validations":
			// Documentation, and CEL rules kubeconform cannot evaluate.
		case "properties", "patternProperties", "definitions":
			props := map[string]any{}
			for name, p := range v.(map[string]any) {
				props[name] = convert(p, crd, junctor)
			}
			out[k] = props
		case "items", "additionalProperties", "not":
			if list, ok := v.([]any); ok {
				items := make([]any, len(list))
				for i, p := range list {
					items[i] = convert(p, crd, junctor)
				}
				out[k] = items
			} else {
				out[k] = convert(v, crd, junctor || k == "not")
			}
		case "allOf", "anyOf", "oneOf":
			list := v.([]any)
			items := make([]any, len(list))
			for i, p := range list {
				items[i] = convert(p, crd, true)
			}
			out[k] = items
		default:
			out[k] = v
		}
	}
	if crd && in["nullable"] == true {
		if t, ok := out["type"].(string); ok {
			out["type"] = []any{t, "null"}
		}
		if enum, ok := out["enum"].([]any); ok {
			out["enum"] = append(enum, nil)
		}
	}
	delete(out, "nullable")
	_, listed := in["properties"]
	_, additional := in["additionalProperties"]
	if listed && !additional && !junctor && in["x-kubernetes-preserve-unknown-fields"] != true {
		out["additionalProperties"] = false
	}
	return out
}
