package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// writeBodies writes the wrk Lua scripts: a single-row digits request as
// JSON and as binary tensors, and a text request for the encoder.
func writeBodies(dir string) (map[string]string, error) {
	row := []float32{0, 0, 2, 13, 16, 14, 1, 0, 0, 0, 11, 12, 7, 16, 3, 0, 0, 0, 9, 3, 2, 16, 3, 0, 0, 0, 0, 0, 9, 11, 0, 0, 0, 0, 2, 11, 15, 13, 3, 0, 0, 0, 4, 15, 16, 13, 3, 0, 0, 0, 0, 14, 8, 0, 0, 0, 0, 0, 5, 15, 4, 0, 0, 0}
	js, _ := json.Marshal(map[string]any{"inputs": []map[string]any{{"name": "pixels", "datatype": "FP32", "shape": []int{1, 64}, "data": row}}})
	hdr := `{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"parameters":{"binary_data_size":256}}],"outputs":[{"name":"probabilities","parameters":{"binary_data":true}}]}`
	bin := []byte(hdr)
	for _, v := range row {
		bin = binary.LittleEndian.AppendUint32(bin, math.Float32bits(v))
	}
	text := []byte(`{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["the water is warm and the children play near the river"]}]}`)
	scripts := map[string]string{}
	for name, b := range map[string]struct {
		body    []byte
		headers map[string]string
	}{
		"json":   {js, map[string]string{"Content-Type": "application/json"}},
		"binary": {bin, map[string]string{"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": strconv.Itoa(len(hdr))}},
		"text":   {text, map[string]string{"Content-Type": "application/json"}},
	} {
		bodyPath := filepath.Join(dir, name+".body")
		if err := os.WriteFile(bodyPath, b.body, 0o644); err != nil {
			return nil, err
		}
		var lua strings.Builder
		fmt.Fprintf(&lua, "wrk.method = \"POST\"\nlocal f = io.open(%q, \"rb\")\nwrk.body = f:read(\"*all\")\nf:close()\n", bodyPath)
		for k, v := range b.headers {
			fmt.Fprintf(&lua, "wrk.headers[%q] = %q\n", k, v)
		}
		script := filepath.Join(dir, name+".lua")
		if err := os.WriteFile(script, []byte(lua.String()), 0o644); err != nil {
			return nil, err
		}
		scripts[name] = script
	}
	mixed, err := writeMixedEmbeddings(dir)
	if err != nil {
		return nil, err
	}
	scripts["embed-mixed"] = mixed
	return scripts, nil
}

// writeMixedEmbeddings writes a wrk script that cycles through OpenAI
// embeddings requests for the tiny-xlmr demo of mixed lengths, as a search
// service sees them: seven short queries (5 to 15 tokens) for every long
// passage (about 100 tokens).
func writeMixedEmbeddings(dir string) (string, error) {
	short := []string{"what is a bucket", "how do steps batch requests", "the fox jumps", "search embeddings for similar text",
		"a server answers requests", "rerank the passages", "tokenizers split words into pieces"}
	long := strings.Repeat("An inference server answers requests; it batches them, pads them to a compiled shape, and runs the model once per step. ", 6)
	var lua strings.Builder
	lua.WriteString("wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nlocal bodies = {\n")
	for i := range 16 {
		text := short[i%len(short)]
		if i%8 == 7 {
			text = long
		}
		b, err := json.Marshal(map[string]any{"model": "tiny-xlmr", "input": text})
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&lua, "  %q,\n", b)
	}
	lua.WriteString("}\nlocal i = 0\nrequest = function()\n  i = i %% #bodies + 1\n  return wrk.format(nil, nil, nil, bodies[i])\nend\n")
	script := filepath.Join(dir, "embed-mixed.lua")
	return script, os.WriteFile(script, []byte(strings.ReplaceAll(lua.String(), "%%", "%")), 0o644)
}

// embedRepository is a repository of the tiny-xlmr demo alone, with the
// batch buckets a serving deployment would have ([1, 4, 16, 64]: the
// shipped demo keeps its buffers small) and, when budget is not 0,
// batching.max_batch_tokens.
func embedRepository(dir, name string, budget int) (string, error) {
	root := filepath.Join(dir, name)
	if err := os.CopyFS(filepath.Join(root, "tiny-xlmr"), os.DirFS("model_repository/tiny-xlmr")); err != nil {
		return "", err
	}
	p := filepath.Join(root, "tiny-xlmr", "model.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	b = regexp.MustCompile(`(?m)^(\s*)batch: \[[^\]]*\]`).ReplaceAll(b, []byte("${1}batch: [1, 4, 16, 64]"))
	if budget > 0 {
		b = fmt.Appendf(b, "batching:\n  max_batch_tokens: %d\n", budget)
	}
	return root, os.WriteFile(p, b, 0o644)
}

// noBatchRepository copies the shipped models with batch bucket [1].
func noBatchRepository(dir string) (string, error) {
	root := filepath.Join(dir, "nobatch")
	if err := os.CopyFS(root, os.DirFS("model_repository")); err != nil {
		return "", err
	}
	re := regexp.MustCompile(`(?m)^(\s*)batch: \[[^\]]*\]`)
	for _, m := range []string{"digits", "tiny-encoder"} {
		p := filepath.Join(root, m, "model.yaml")
		b, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(p, re.ReplaceAll(b, []byte("${1}batch: [1]")), 0o644); err != nil {
			return "", err
		}
	}
	return root, nil
}
