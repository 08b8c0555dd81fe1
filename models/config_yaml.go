// model.yaml's decoding errors, as messages that name the key and quote
// little of the file.

package models

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"

	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/internal/suggest"
)

// The entries of a *yaml.TypeError: "line N:" and what went wrong, which
// quotes the file.
var (
	yamlCannot = regexp.MustCompile(`^line (\d+): cannot unmarshal (!!\w+)( .*)? into (.+)$`)
	// yamlWord is a value short and plain enough to quote: a typo such as
	// "soon", not a line of some other file.
	yamlWord    = regexp.MustCompile("^ `([A-Za-z0-9_.+-]{1,10})`$")
	yamlUnknown = regexp.MustCompile(`^line (\d+): field (.*) not found in type (.*)$`)
	yamlTwice   = regexp.MustCompile(`^line (\d+): (?:field .* already set in type .*|mapping key .* already defined at line \d+)$`)
)

// yamlKeys are the keys each struct type of model.yaml takes, by the type's
// name as the YAML decoder names it (models.Config, models.Buckets, ...):
// the names an unknown key may be a misspelling of.
var yamlKeys = sync.OnceValue(func() map[string][]string {
	keys := map[string][]string{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map || t.Kind() == reflect.Array {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		if _, seen := keys[t.String()]; seen {
			return
		}
		keys[t.String()] = nil
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" || !f.IsExported() {
				continue
			}
			keys[t.String()] = append(keys[t.String()], name)
			walk(f.Type)
		}
	}
	walk(reflect.TypeFor[Config]())
	return keys
})

// yamlError rewrites a YAML decoding error for a reader of model.yaml:
// what was found and what is wanted, by line, quoting at most a key name
// (clipped) or a short plain word, so that a file that is not a model.yaml
// is not echoed back.
func yamlError(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		// A syntax error: "yaml: line 3: did not find expected key". The
		// few that quote the file (an anchor's name) lose the quote.
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if i := strings.IndexAny(msg, "'\"`"); i >= 0 {
			msg = strings.TrimSpace(msg[:i])
		}
		return msg
	}
	const most = 5
	out := make([]string, 0, most+1)
	for _, e := range te.Errors[:min(len(te.Errors), most)] {
		if m := yamlCannot.FindStringSubmatch(e); m != nil {
			found := yamlKind(m[2])
			if w := yamlWord.FindStringSubmatch(m[3]); w != nil {
				found += fmt.Sprintf(" (%q)", w[1])
			}
			out = append(out, fmt.Sprintf("line %s: want %s, found %s", m[1], yamlWant(m[4]), found))
		} else if m := yamlUnknown.FindStringSubmatch(e); m != nil {
			msg := fmt.Sprintf("line %s: unknown key %q", m[1], clip.Clip(m[2], maxNameInError))
			if near := suggest.Nearest(m[2], yamlKeys()[m[3]]); near != "" {
				msg += fmt.Sprintf("; did you mean %q?", near)
			}
			out = append(out, msg)
		} else if m := yamlTwice.FindStringSubmatch(e); m != nil {
			out = append(out, fmt.Sprintf("line %s: a key appears twice", m[1]))
		} else if i := strings.Index(e, ":"); i >= 0 {
			out = append(out, e[:i]+": malformed value")
		}
	}
	if len(te.Errors) > most {
		out = append(out, fmt.Sprintf("and %d more", len(te.Errors)-most))
	}
	if len(out) == 0 {
		return "malformed YAML"
	}
	return strings.Join(out, "; ")
}

// yamlKind names a YAML tag as a reader says it.
func yamlKind(tag string) string {
	switch tag {
	case "!!str":
		return "a string"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!seq":
		return "a list"
	case "!!map":
		return "a mapping"
	case "!!null":
		return "nothing"
	default:
		return "a " + strings.TrimPrefix(tag, "!!")
	}
}

// yamlWant names the Go type a value decodes into as model.yaml's reader
// says it.
func yamlWant(goType string) string {
	switch goType {
	case "models.Config":
		return "a mapping of model.yaml's keys"
	case "int", "*int":
		return "an integer"
	case "float64":
		return "a number"
	case "bool":
		return "true or false"
	case "string", "models.Datatype":
		return "a string"
	case "time.Duration", "*time.Duration":
		return "a duration such as 5ms"
	case "[]int":
		return "a list of integers"
	case "[]models.TensorSpec":
		return "a list of tensors ({name, datatype, shape})"
	}
	if strings.HasPrefix(goType, "*models.") || strings.HasPrefix(goType, "models.") {
		return "a mapping"
	}
	return strings.TrimPrefix(goType, "*")
}
