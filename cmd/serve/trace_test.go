package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chromeTrace is a trace file as the tests read it.
type chromeTrace struct {
	OtherData struct {
		Stepserve struct {
			Model         string `json:"model"`
			Level         string `json:"level"`
			Steps         int    `json:"steps"`
			Requests      int    `json:"requests"`
			DroppedEvents int    `json:"dropped_events"`
		} `json:"stepserve"`
	} `json:"otherData"`
	TraceEvents []chromeEvent `json:"traceEvents"`
}

type chromeEvent struct {
	Name string         `json:"name"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args"`
}

func (e chromeEvent) end() float64 { return e.Ts + e.Dur }

// within reports whether e lies inside outer, to the rounding of the
// file's microseconds (three decimals).
func (e chromeEvent) within(outer chromeEvent) bool {
	const eps = 0.002
	return e.Ts >= outer.Ts-eps && e.end() <= outer.end()+eps
}

// names maps (pid, tid) to the thread names, and pid to process names.
func (c *chromeTrace) threads() (map[[2]int]string, map[int]string) {
	threads, procs := map[[2]int]string{}, map[int]string{}
	for _, e := range c.TraceEvents {
		if e.Ph != "M" {
			continue
		}
		name, _ := e.Args["name"].(string)
		switch e.Name {
		case "thread_name":
			threads[[2]int{e.Pid, e.Tid}] = name
		case "process_name":
			procs[e.Pid] = name
		}
	}
	return threads, procs
}

// spans are the complete events named name on (pid, tid), in time order.
func (c *chromeTrace) spans(pid, tid int, name string) []chromeEvent {
	var out []chromeEvent
	for _, e := range c.TraceEvents {
		if e.Ph == "X" && e.Pid == pid && e.Tid == tid && (name == "" || e.Name == name) {
			out = append(out, e)
		}
	}
	return out
}

// admin sends a request with the repository token.
func admin(t *testing.T, method, url, token string, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

type traceFileInfo struct {
	Name    string    `json:"name"`
	Size    int64     `json:"size"`
	Model   string    `json:"model"`
	Level   string    `json:"level"`
	Steps   int       `json:"steps"`
	Created time.Time `json:"created"`
}

// waitTrace waits for the trace file name to be listed, and downloads it.
func waitTrace(t *testing.T, base, token, name string) (traceFileInfo, chromeTrace) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := admin(t, "GET", base+"/v2/trace/files", token, "")
		require.Equal(t, 200, code, string(body))
		var list struct{ Files []traceFileInfo }
		require.NoError(t, json.Unmarshal(body, &list))
		for _, f := range list.Files {
			if f.Name == name {
				code, body := admin(t, "GET", base+"/v2/trace/files/"+name, token, "")
				require.Equal(t, 200, code, string(body))
				assert.Equal(t, f.Size, int64(len(body)), "the listed size is the file's")
				var c chromeTrace
				require.NoError(t, json.Unmarshal(body, &c), "a trace file is Chrome trace JSON")
				return f, c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace file %s not written; files: %s", name, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkTimestamps checks a TIMESTAMPS trace of steps steps of one request
// each on model: one step span per step on the device's row with its
// phases in order inside it, and each request's phases in order, nested
// in its received..written span.
func checkTimestamps(t *testing.T, c chromeTrace, model, device string, steps int, ids []string) {
	t.Helper()
	threads, procs := c.threads()
	assert.Equal(t, "stepserve model "+model, procs[1])
	deviceTid := -1
	reqTids := map[string]int{}
	for k, name := range threads {
		if k[0] != 1 {
			continue
		}
		if name == "steps on "+device {
			deviceTid = k[1]
		}
		for _, id := range ids {
			if strings.HasSuffix(name, "(id "+id+")") {
				reqTids[id] = k[1]
			}
		}
	}
	require.NotEqual(t, -1, deviceTid, "a row named for the device: %v", threads)
	require.Len(t, reqTids, len(ids), "a row per request, named with its id: %v", threads)

	stepSpans := c.spans(1, deviceTid, "step")
	require.Len(t, stepSpans, steps, "one step span per traced step")
	for _, st := range stepSpans {
		assert.Equal(t, model != "", st.Args["bucket"] != nil, "the step names its bucket")
		assert.NotNil(t, st.Args["rows"])
		assert.Contains(t, []any{"clean", "overhead", "unmeasured"}, st.Args["verdict"])
		var phases []chromeEvent
		for _, name := range []string{"copy in", "infer", "copy out"} {
			for _, e := range c.spans(1, deviceTid, name) {
				if e.within(st) {
					phases = append(phases, e)
				}
			}
		}
		require.Len(t, phases, 3, "copy in, infer and copy out inside step at %v", st.Ts)
		for i := 1; i < 3; i++ {
			assert.LessOrEqual(t, phases[i-1].end(), phases[i].Ts+0.002, "%s before %s", phases[i-1].Name, phases[i].Name)
		}
	}
	for _, id := range ids {
		tid := reqTids[id]
		whole := c.spans(1, tid, "request")
		require.Len(t, whole, 1, "request %s: one received..written span", id)
		assert.Equal(t, float64(200), whole[0].Args["status"])
		prev := whole[0].Ts
		for _, name := range []string{"decode", "prepare", "queue", "step", "respond"} {
			sp := c.spans(1, tid, name)
			require.Len(t, sp, 1, "request %s: its %s span", id, name)
			assert.True(t, sp[0].within(whole[0]), "request %s: %s inside received..written", id, name)
			assert.GreaterOrEqual(t, sp[0].Ts+0.002, prev, "request %s: %s after the phase before it", id, name)
			prev = sp[0].end()
		}
		// The request's step is one of the device's.
		st := c.spans(1, tid, "step")[0]
		found := false
		for _, d := range stepSpans {
			found = found || (d.Ts == st.Ts && d.Dur == st.Dur)
		}
		assert.True(t, found, "request %s ran in a traced step", id)
	}
}

func TestTraceTimestampsOfDigitsSteps(t *testing.T) {
	dir := t.TempDir()
	const token = "trace-admin-token-0123"
	p := start(t, "--trace.dir", dir, "--auth.repository.token", token, "--trace.max_files", "2")
	digits := heldout(t)

	code, body := admin(t, "GET", p.base+"/v2", "", "")
	require.Equal(t, 200, code)
	assert.Contains(t, string(body), `"trace"`, "GET /v2 lists the trace extension")

	// The settings are an administrator's.
	code, _ = admin(t, "POST", p.base+"/v2/trace/setting", "", `{"trace_level":["TIMESTAMPS"]}`)
	assert.Equal(t, 401, code)
	code, _ = admin(t, "GET", p.base+"/v2/trace/files", "", "")
	assert.Equal(t, 401, code)

	code, body = admin(t, "POST", p.base+"/v2/trace/setting", token,
		`{"trace_level":["TIMESTAMPS"],"trace_rate":"1","trace_count":"3","trace_file":"digits_ts"}`)
	require.Equal(t, 200, code, string(body))
	var settings map[string]any
	require.NoError(t, json.Unmarshal(body, &settings))
	assert.Equal(t, map[string]any{"trace_level": []any{"TIMESTAMPS"}, "trace_rate": "1", "trace_count": "3",
		"log_frequency": "0", "trace_file": "digits_ts"}, settings, "Triton's form: strings, the level an array")

	ids := []string{"r1", "r2", "r3"}
	for i, id := range append(ids, "r4") {
		resp, out := post(t, p.base+"/v2/models/digits/infer", jsonRequest(id, digits[i:i+1]))
		require.Equal(t, 200, resp.StatusCode, string(out))
	}
	info, c := waitTrace(t, p.base, token, "digits_ts.0.json")
	assert.Equal(t, traceFileInfo{Name: "digits_ts.0.json", Size: info.Size, Model: "digits", Level: "TIMESTAMPS", Steps: 3, Created: info.Created}, info)
	assert.Equal(t, 3, c.OtherData.Stepserve.Steps)
	assert.Equal(t, 3, c.OtherData.Stepserve.Requests, "r4 came after the count ran out")
	checkTimestamps(t, c, "digits", "cpu device cpu", 3, ids)

	code, body = admin(t, "GET", p.base+"/v2/trace/setting", token, "")
	require.Equal(t, 200, code)
	assert.Contains(t, string(body), `"trace_count":"0"`, "the count went down with each traced step")

	// The step's device time is exported where the engine measures it.
	resp, err := http.Get(p.base + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Regexp(t, `stepserve_step_device_seconds_count\{bucket="[^"]+",engine="cpu",model="digits"\} [1-9]`, string(metrics))

	// PROFILE on the CPU engine: its kernels' spans inside the infer span.
	code, body = admin(t, "POST", p.base+"/v2/models/digits/trace/setting", token, `{"trace_level":["PROFILE"],"trace_count":"1","trace_file":"digits_prof"}`)
	require.Equal(t, 200, code, string(body))
	resp, out := post(t, p.base+"/v2/models/digits/infer", jsonRequest("p1", digits[:1]))
	require.Equal(t, 200, resp.StatusCode, string(out))
	_, c = waitTrace(t, p.base, token, "digits_prof.0.json")
	assert.Equal(t, "PROFILE", c.OtherData.Stepserve.Level)
	checkTimestamps(t, c, "digits", "cpu device cpu", 1, []string{"p1"})
	_, procs := c.threads()
	assert.Contains(t, procs[2], "engine spans")
	infer := c.spans(1, 1, "infer")
	require.Len(t, infer, 1)
	var kernels []string
	for _, e := range c.TraceEvents {
		if e.Pid == 2 && e.Ph == "X" {
			assert.True(t, e.within(infer[0]), "engine span %s inside the infer span", e.Name)
			kernels = append(kernels, e.Name)
		}
	}
	assert.Equal(t, []string{"layer 0: product", "layer 0: bias+activation", "layer 1: product", "layer 1: bias+activation"}, kernels[:4])
}

func TestTraceSettingsAndFilesAPI(t *testing.T) {
	dir := t.TempDir()
	const token = "trace-admin-token-0123"
	p := start(t, "--trace.dir", dir, "--auth.repository.token", token, "--trace.max_files", "2")
	get := func(path string) map[string]any {
		code, body := admin(t, "GET", p.base+path, token, "")
		require.Equal(t, 200, code, string(body))
		var m map[string]any
		require.NoError(t, json.Unmarshal(body, &m))
		return m
	}

	// A model's setting overrides the global one; null removes it.
	code, body := admin(t, "POST", p.base+"/v2/trace/setting", token, `{"trace_level":["TIMESTAMPS"],"trace_rate":"1","trace_count":"0"}`)
	require.Equal(t, 200, code, string(body))
	code, body = admin(t, "POST", p.base+"/v2/models/digits/trace/setting", token, `{"trace_count":"1","trace_file":"mine"}`)
	require.Equal(t, 200, code, string(body))
	assert.Equal(t, "1", get("/v2/models/digits/trace/setting")["trace_count"])
	assert.Equal(t, "mine", get("/v2/models/digits/versions/1/trace/setting")["trace_file"])
	assert.Equal(t, "0", get("/v2/trace/setting")["trace_count"], "the global setting is untouched")
	assert.Equal(t, []any{"TIMESTAMPS"}, get("/v2/models/digits/trace/setting")["trace_level"], "what the model does not set is the global")
	code, body = admin(t, "POST", p.base+"/v2/models/digits/trace/setting", token, `{"trace_file":null}`)
	require.Equal(t, 200, code, string(body))
	assert.Equal(t, "", get("/v2/models/digits/trace/setting")["trace_file"], "null cleared the override")
	assert.Equal(t, "1", get("/v2/models/digits/trace/setting")["trace_count"], "and only that key")
	code, _ = admin(t, "GET", p.base+"/v2/models/nope/trace/setting", token, "")
	assert.Equal(t, 404, code)

	// Bad keys and values: 400, naming each.
	for body, want := range map[string][]string{
		`{"trace_level":["TENSORS"]}`:                       {"trace_level", "TENSORS"},
		`{"trace_level":["LOUD"]}`:                          {"trace_level", "LOUD"},
		`{"trace_rate":"0","trace_count":"-5"}`:             {"trace_rate", "trace_count"},
		`{"bogus":"1"}`:                                     {"bogus", "unknown"},
		`{"trace_file":"../etc/passwd"}`:                    {"trace_file", "path"},
		`{"log_frequency":"often"}`:                         {"log_frequency", "integer"},
		`[1,2]`:                                             {"JSON object"},
		`{"trace_count":"` + strings.Repeat("9", 40) + `"}`: {"trace_count"},
	} {
		code, out := admin(t, "POST", p.base+"/v2/trace/setting", token, body)
		assert.Equal(t, 400, code, body)
		for _, w := range want {
			assert.Contains(t, string(out), w, body)
		}
	}
	assert.Equal(t, "0", get("/v2/trace/setting")["trace_count"], "a refused request changes nothing")

	// Files: the count bound keeps the newest two; names are checked.
	digits := heldout(t)
	for i := range 3 {
		code, body := admin(t, "POST", p.base+"/v2/models/digits/trace/setting", token, `{"trace_count":"1"}`)
		require.Equal(t, 200, code, string(body))
		resp, out := post(t, p.base+"/v2/models/digits/infer", jsonRequest(fmt.Sprint("f", i), digits[i:i+1]))
		require.Equal(t, 200, resp.StatusCode, string(out))
		waitTrace(t, p.base, token, fmt.Sprintf("digits.%d.json", i))
	}
	var list struct{ Files []traceFileInfo }
	_, body = admin(t, "GET", p.base+"/v2/trace/files", token, "")
	require.NoError(t, json.Unmarshal(body, &list))
	var names []string
	for _, f := range list.Files {
		names = append(names, f.Name)
	}
	assert.Equal(t, []string{"digits.2.json", "digits.1.json"}, names, "trace.max_files 2: the oldest went first")
	code, _ = admin(t, "GET", p.base+"/v2/trace/files/digits.0.json", token, "")
	assert.Equal(t, 404, code, "the deleted file is gone")
	for _, bad := range []string{"..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", ".writing-1", "digits.1.json%00"} {
		code, _ := admin(t, "GET", p.base+"/v2/trace/files/"+bad, token, "")
		assert.Contains(t, []int{400, 404}, code, bad)
	}
	code, _ = admin(t, "GET", p.base+"/v2/trace/files/digits.1.json", "", "")
	assert.Equal(t, 401, code, "a download needs the repository token")
}

// TestTraceProfileOfATorchModel takes a PROFILE trace of digits-cnn on the
// torch engine: the worker's torch.profiler events are merged under a
// process of their own, each step's stepserve.step range aligned on the
// step's infer span, with the ATen calls of the step inside it.
func TestTraceProfileOfATorchModel(t *testing.T) {
	dir := t.TempDir()
	const token = "trace-admin-token-0123"
	p := start(t, "--trace.dir", dir, "--auth.repository.token", token)
	digits := heldout(t)
	code, body := admin(t, "POST", p.base+"/v2/models/digits-cnn/trace/setting", token,
		`{"trace_level":["PROFILE"],"trace_rate":"1","trace_count":"2"}`)
	require.Equal(t, 200, code, string(body))
	ids := []string{"c1", "c2"}
	for i, id := range ids {
		rows := digits[4*i : 4*i+4]
		var data []float32
		for _, d := range rows {
			data = append(data, d.pixels...)
		}
		body, _ := json.Marshal(map[string]any{"id": id, "inputs": []map[string]any{
			{"name": "image", "datatype": "FP32", "shape": []int{len(rows), 1, 8, 8}, "data": data}}})
		resp, out := post(t, p.base+"/v2/models/digits-cnn/infer", body)
		require.Equal(t, 200, resp.StatusCode, string(out))
	}
	_, c := waitTrace(t, p.base, token, "digits-cnn.0.json")
	assert.Equal(t, "PROFILE", c.OtherData.Stepserve.Level)
	checkTimestamps(t, c, "digits-cnn", "torch device cpu", 2, ids)

	threads, procs := c.threads()
	assert.Contains(t, procs[3], "worker torch.profiler")
	var workerRows []string
	for k, name := range threads {
		if k[0] == 3 {
			workerRows = append(workerRows, name)
		}
	}
	require.NotEmpty(t, workerRows, "the worker's threads are named")
	assert.Contains(t, workerRows[0], "activities CPU", "the row says what was profiled")

	infers := c.spans(1, 1, "infer")
	require.Len(t, infers, 2)
	var anchors []chromeEvent
	aten := 0
	for _, e := range c.TraceEvents {
		if e.Pid != 3 || e.Ph != "X" {
			continue
		}
		if strings.HasPrefix(e.Name, "stepserve.step digits-cnn") {
			anchors = append(anchors, e)
		}
	}
	require.Len(t, anchors, 2, "one stepserve.step range per profiled step")
	for i, a := range anchors {
		assert.InDelta(t, infers[i].Ts, a.Ts, 0.002, "step %d: the worker's range starts where the infer span starts", i)
		assert.True(t, a.within(infers[i]), "step %d: the worker's range lies inside the infer span", i)
		for _, e := range c.TraceEvents {
			if e.Pid == 3 && e.Ph == "X" && strings.HasPrefix(e.Name, "aten::") && e.within(a) {
				aten++
			}
		}
	}
	assert.Positive(t, aten, "the step's ATen calls are inside its range")

	resp, err := http.Get(p.base + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Regexp(t, `stepserve_step_device_seconds_count\{bucket="[^"]+",engine="torch",model="digits-cnn"\} [1-9]`, string(metrics),
		"the worker's step body is the torch engine's device time")
}
