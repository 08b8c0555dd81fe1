package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stepserve/stepserve/bucketing"
)

// advise is `stepserve advise`: it asks a running server for a model's
// bucket advice (GET /v2/models/{model}/buckets/advice) and prints it for
// a person: the lists now and advised, their padding on the traffic the
// server saw, and the model.yaml block to paste.
// programs is "program" or "programs" for n.
func programs(n int) string {
	if n == 1 {
		return "program"
	}
	return "programs"
}

func advise(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("stepserve advise", flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("url", "http://localhost:8000", "the server's URL")
	model := fs.String("model", "", "the model to advise on (required)")
	k := fs.Int("max-buckets", 0, "the most buckets (compiled programs) the advice may use; 0: as many as the model has now")
	token := fs.String("token", os.Getenv("STEPSERVE_TOKEN"), "bearer token, when the server requires one (default $STEPSERVE_TOKEN)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: stepserve advise --model NAME [--url URL] [--max-buckets K] [--token T]

Asks a running server which bucket lists would have padded the steps it
served least, and prints them beside the current ones with the model.yaml
block to paste.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *model == "" {
		fmt.Fprintln(stderr, "stepserve advise: --model is required")
		return 2
	}
	u := strings.TrimRight(*base, "/") + "/v2/models/" + url.PathEscape(*model) + "/buckets/advice"
	if *k > 0 {
		u += fmt.Sprintf("?max_buckets=%d", *k)
	}
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		fmt.Fprintln(stderr, "stepserve advise:", err)
		return 2
	}
	if *token != "" {
		req.Header.Set("Authorization", "Bearer "+*token)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		fmt.Fprintln(stderr, "stepserve advise:", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(body))
		}
		fmt.Fprintf(stderr, "stepserve advise: %s: %s\n", printable(resp.Status), printable(e.Error))
		return 1
	}
	var out struct {
		Name       string           `json:"name"`
		MaxBuckets int              `json:"max_buckets"`
		Advice     bucketing.Advice `json:"advice"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		fmt.Fprintln(stderr, "stepserve advise: the answer is not bucket advice:", err)
		return 1
	}
	a := out.Advice
	out.Name, a.YAML = printable(out.Name), printable(a.YAML)
	how := "the best of a search over both dimensions"
	if a.Exact {
		how = "the optimum"
	}
	fmt.Fprintf(stdout, "model %s: %d steps recorded (recent ones weigh more: the weight halves every %s)\n\n", out.Name, a.Steps,
		strings.TrimSuffix(strings.TrimSuffix(bucketing.DefaultHalfLife.String(), "0s"), "0m"))
	now, advised, what := lists(a.CurrentBatch, a.CurrentSeq), lists(a.Batch, a.Seq), "device work"
	if len(a.Context) > 0 {
		// A language model's decode steps: the padding is key positions
		// read past the sequences' contexts.
		now, advised, what = lists(a.CurrentBatch, nil)+" x context "+fmt.Sprint(a.CurrentContext),
			lists(a.Batch, nil)+" x context "+fmt.Sprint(a.Context), "decode steps' key reads"
	}
	fmt.Fprintf(stdout, "  now:     %-40s %3d %-8s %5.1f%% of the %s is padding\n", now, a.CurrentPrograms, programs(a.CurrentPrograms)+",", 100*a.PaddingNow, what)
	fmt.Fprintf(stdout, "  advised: %-40s %3d %-8s %5.1f%% of the %s is padding\n\n", advised, a.Programs, programs(a.Programs)+",", 100*a.PaddingAdvised, what)
	fmt.Fprintf(stdout, "With at most %d %s, the advised lists are %s for this traffic: %.2fx the device work of today's.\nmodel.yaml:\n\n%s", out.MaxBuckets, programs(out.MaxBuckets), how, a.WorkRatio, a.YAML)
	return 0
}

// printable is s as it may reach a terminal: control characters other than
// newlines (an escape sequence a hostile server sends to retitle or clear
// the operator's terminal) become U+FFFD.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || !unicode.IsControl(r) {
			return r
		}
		return utf8.RuneError
	}, s)
}

func lists(batch, seq []int) string {
	s := "batch " + fmt.Sprint(batch)
	if len(seq) > 0 {
		s += " x seq " + fmt.Sprint(seq)
	}
	return s
}
