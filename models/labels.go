package models

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/stepserve/stepserve/internal/clip"
)

// Labels files: an output's class names, for the classification extension
// (a request may ask for an output's top k classes as "value:index:label"
// strings). model.yaml names the file on the output:
//
//	outputs:
//	  - {name: probabilities, datatype: FP32, shape: [-1, 10], labels: labels.txt}
//
// The file holds one label per line, line i naming index i of the
// output's row; it has exactly as many lines as the row has elements. A
// blank line leaves its index without a label. As Triton's label files.
const (
	// maxLabelsBytes bounds a labels file, read whole when the model is
	// opened.
	maxLabelsBytes = 1 << 20
	// MaxLabelBytes bounds one label: a class name, not a document.
	MaxLabelBytes = 256
)

// validateLabels checks an output's labels key: a relative path in the
// model directory, on an output that classification can rank (numbers,
// with a fixed row).
func validateLabels(at string, s TensorSpec) error {
	if err := relativeFile(s.Labels); err != nil {
		return fmt.Errorf("%w: %s.labels: %q must be a file in the model directory (a relative path, no '..')", ErrConfig, at, clip.Clip(s.Labels, maxNameInError))
	}
	if s.Datatype == BYTES || s.Datatype == BOOL {
		return fmt.Errorf("%w: %s.labels: output %q is %s; labels name the elements of a numeric output, which classification ranks", ErrConfig, at, s.Name, s.Datatype)
	}
	if s.HasSeq() {
		return fmt.Errorf("%w: %s.labels: output %q has a variable dimension; labels need a fixed number of elements per row", ErrConfig, at, s.Name)
	}
	return nil
}

// readLabels reads the labels files model.yaml names, one list per output
// (nil for an output without one), through the repository root.
func (m *Manifest) readLabels() ([][]string, error) {
	var out [][]string
	for i, s := range m.Config.Outputs {
		if s.Labels == "" {
			continue
		}
		name := path.Join(m.Name, s.Labels)
		b, err := readFile(m.root, name, maxLabelsBytes)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w: outputs[%d].labels: %s is not in the model directory", path.Join(m.Name, ConfigFile), ErrConfig, i, name)
		}
		if err != nil {
			return nil, err
		}
		labels, err := ParseLabels(b, s.RowElements(0))
		if err != nil {
			return nil, fmt.Errorf("%s: %w (outputs[%d].labels, output %q)", name, err, i, s.Name)
		}
		if out == nil {
			out = make([][]string, len(m.Config.Outputs))
		}
		out[i] = labels
	}
	return out, nil
}

// ParseLabels reads a labels file for an output of want elements per row:
// one label per line (a final newline optional, "\r\n" as "\n"), valid
// UTF-8, each at most MaxLabelBytes, exactly want lines.
func ParseLabels(b []byte, want int) ([]string, error) {
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("not valid UTF-8 text")
	}
	text := strings.TrimSuffix(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n")
	var labels []string
	if text != "" || len(b) > 0 {
		labels = strings.Split(text, "\n")
	}
	if len(labels) != want {
		return nil, fmt.Errorf("has %d labels (lines); the output has %d elements per row, one label each", len(labels), want)
	}
	for i, l := range labels {
		if len(l) > MaxLabelBytes {
			return nil, fmt.Errorf("line %d: a label of %d bytes, above the limit of %d", i+1, len(l), MaxLabelBytes)
		}
		if strings.ContainsFunc(l, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
			return nil, fmt.Errorf("line %d: a label holds a control character", i+1)
		}
	}
	return labels, nil
}
