package tgi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// maxStops is the stop sequences a request may give (TGI's default
// max_stop_sequences).
const maxStops = 4

// maxTopN bounds top_n_tokens (TGI's default max_top_n_tokens).
const maxTopN = 5

// route is which of TGI's routes a request came by.
type route int

const (
	routeGenerate route = iota // POST /generate: one answer
	routeStream                // POST /generate_stream: events
	routeCompat                // POST /: by the body's stream, one answer in an array
)

// request is TGI's GenerateRequest (CompatGenerateRequest with stream).
type request struct {
	Inputs     *string    `json:"inputs"`
	Parameters parameters `json:"parameters"`
	Stream     bool       `json:"stream"`
	Model      string     `json:"model"` // beside TGI's keys: the model where several are served
}

// parameters is TGI's GenerateParameters.
type parameters struct {
	AdapterID           *string          `json:"adapter_id"`
	BestOf              *int             `json:"best_of"`
	DecoderInputDetails bool             `json:"decoder_input_details"`
	Details             bool             `json:"details"`
	DoSample            bool             `json:"do_sample"`
	FrequencyPenalty    *float64         `json:"frequency_penalty"`
	Grammar             *grammar         `json:"grammar"`
	MaxNewTokens        *int             `json:"max_new_tokens"`
	RepetitionPenalty   *float64         `json:"repetition_penalty"`
	ReturnFullText      *bool            `json:"return_full_text"`
	Seed                *json.RawMessage `json:"seed"`
	Stop                []string         `json:"stop"`
	Temperature         *float64         `json:"temperature"`
	TopK                *int             `json:"top_k"`
	TopNTokens          *int             `json:"top_n_tokens"`
	TopP                *float64         `json:"top_p"`
	Truncate            *int             `json:"truncate"`
	TypicalP            *float64         `json:"typical_p"`
	Watermark           bool             `json:"watermark"`
}

// grammar is TGI's GrammarType: {"type": "json", "value": schema (an
// object, or a string of one)}, {"type": "regex", "value": pattern} or
// {"type": "json_schema", "value": {"name", "schema"}}.
type grammar struct {
	Type  string          `json:"type"`
	Value json.RawMessage `json:"value"`
}

func bad(format string, args ...any) error {
	return apierr.BadRequest("Input validation error: " + fmt.Sprintf(format, args...))
}

// generate answers a generation request of TGI's: the body decoded and
// checked as TGI's router checks it, then run through the core's call.
func (s *API) generate(t *text.Request, body []byte, via route) int {
	var req request
	if err := t.DecodeJSON(body, &req, "inputs"); err != nil {
		return t.Fail(err)
	}
	stream := via == routeStream || via == routeCompat && req.Stream
	if t.Model() == nil {
		// The body's model, or ?model=, or the only language model: a
		// TGI serves one, and its clients name none.
		if _, err := t.Choose(req.Model, "POST "+t.R.URL.Path, text.KindGenerative); err != nil {
			return t.Fail(err)
		}
	}
	gr, w, err := s.prepare(&req, stream, via == routeCompat)
	if err != nil {
		return t.Fail(err)
	}
	if m := t.Model(); m != nil {
		w.end, _ = m.EndToken()
	}
	return t.GenerateTo(gr, w)
}

// prepare checks req's parameters and builds its generation and writer.
func (s *API) prepare(req *request, stream, compat bool) (*serving.GenerateRequest, *writer, error) {
	p := &req.Parameters
	switch {
	case req.Inputs == nil:
		return nil, nil, bad("`inputs` is required: the prompt, a string")
	case *req.Inputs == "":
		return nil, nil, bad("`inputs` cannot be empty")
	case p.AdapterID != nil && *p.AdapterID != "":
		return nil, nil, bad("adapter_id %q: no LoRA adapter is served here", apierr.ClipName(*p.AdapterID))
	case p.BestOf != nil && *p.BestOf != 1:
		return nil, nil, bad("best_of %d: one sequence is generated a request (max_best_of 1)", *p.BestOf)
	case p.DecoderInputDetails && stream:
		return nil, nil, bad("`decoder_input_details` == true is not supported when streaming tokens")
	case p.Watermark:
		return nil, nil, bad("watermark: no watermarking is applied here")
	case p.TypicalP != nil:
		return nil, nil, bad("typical_p: typical decoding is not served; use top_p or top_k")
	case p.Temperature != nil && (math.IsNaN(*p.Temperature) || *p.Temperature <= 0):
		return nil, nil, bad("`temperature` must be strictly positive")
	case p.TopP != nil && (math.IsNaN(*p.TopP) || *p.TopP <= 0 || *p.TopP >= 1):
		return nil, nil, bad("`top_p` must be > 0.0 and < 1.0")
	case p.TopK != nil && *p.TopK <= 0:
		return nil, nil, bad("`top_k` must be strictly positive")
	case p.MaxNewTokens != nil && *p.MaxNewTokens <= 0:
		return nil, nil, bad("`max_new_tokens` must be strictly positive")
	case len(p.Stop) > maxStops:
		return nil, nil, bad("`stop` supports up to %d stop sequences. Given: %d", maxStops, len(p.Stop))
	case p.TopNTokens != nil && (*p.TopNTokens < 0 || *p.TopNTokens > maxTopN):
		return nil, nil, bad("`top_n_tokens` must be >= 0 and <= %d", maxTopN)
	case p.Truncate != nil && *p.Truncate <= 0:
		return nil, nil, bad("`truncate` must be strictly positive")
	case p.RepetitionPenalty != nil && (math.IsNaN(*p.RepetitionPenalty) || *p.RepetitionPenalty <= 0):
		return nil, nil, bad("`repetition_penalty` must be strictly positive")
	case p.FrequencyPenalty != nil && (math.IsNaN(*p.FrequencyPenalty) || *p.FrequencyPenalty < -2 || *p.FrequencyPenalty > 2):
		return nil, nil, bad("`frequency_penalty` must be >= -2.0 and <= 2.0")
	}
	if stream && compat && p.BestOf != nil && *p.BestOf > 1 {
		return nil, nil, bad("`best_of` != 1 is not supported when streaming tokens")
	}
	gr := &serving.GenerateRequest{Prompt: *req.Inputs, MaxTokens: p.MaxNewTokens, Stop: p.Stop, Logprobs: 0}
	w := &writer{stream: stream, compat: compat, details: p.Details}
	if p.TopNTokens != nil {
		gr.Logprobs, w.top = *p.TopNTokens, *p.TopNTokens
	}
	gr.ScorePrompt = p.DecoderInputDetails
	if p.Truncate != nil {
		gr.Truncate = *p.Truncate
	}
	if p.ReturnFullText != nil && *p.ReturnFullText {
		w.prefix = *req.Inputs
	}
	if p.RepetitionPenalty != nil || p.FrequencyPenalty != nil {
		gr.RepetitionPenalty, gr.FrequencyPenalty = p.RepetitionPenalty, p.FrequencyPenalty
	}
	// Sampling where asked for or where a warper is set, as TGI's
	// NextTokenChooser decides; greedy otherwise.
	sampling := p.DoSample || p.Temperature != nil && *p.Temperature != 1 || p.TopK != nil || p.TopP != nil
	greedy := 0.0
	gr.Temperature, gr.TopK, gr.TopP = &greedy, p.TopK, p.TopP
	if sampling {
		temp := 1.0
		if p.Temperature != nil {
			temp = *p.Temperature
		}
		gr.Temperature = &temp
		seed, err := seedOf(p.Seed)
		if err != nil {
			return nil, nil, err
		}
		gr.Seed, w.seed = &seed, &seed
	}
	if g := p.Grammar; g != nil {
		c, err := g.constraint()
		if err != nil {
			return nil, nil, err
		}
		gr.Constraint = c
	}
	return gr, w, nil
}

// seedOf is the request's seed (a non-negative integer up to 2^63-1,
// as the int64 TGI reports), or a random one that the answer reports.
func seedOf(raw *json.RawMessage) (int64, error) {
	if raw == nil || string(bytes.TrimSpace(*raw)) == "null" {
		return int64(rand.Uint64() >> 1), nil
	}
	var seed uint64
	if err := json.Unmarshal(*raw, &seed); err != nil || seed > math.MaxInt64 {
		return 0, bad("`seed` must be an integer from 0 to %d", int64(math.MaxInt64))
	}
	return int64(seed), nil
}

// constraint is the structured output g asks for.
func (g *grammar) constraint() (*serving.Constraint, error) {
	v := bytes.TrimSpace(g.Value)
	if len(v) == 0 || string(v) == "null" {
		return nil, bad("grammar.value is required")
	}
	switch g.Type {
	case "json":
		if v[0] == '"' { // a schema given as a string of JSON
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return nil, bad("grammar.value: %v", err)
			}
			v = bytes.TrimSpace([]byte(s))
		}
		if len(v) == 0 || v[0] != '{' || !json.Valid(v) {
			return nil, bad("grammar.value: want a JSON Schema, an object (or a string of one)")
		}
		return &serving.Constraint{JSONSchema: v}, nil
	case "json_schema":
		var cfg struct {
			Schema json.RawMessage `json:"schema"`
		}
		if err := json.Unmarshal(v, &cfg); err != nil || len(bytes.TrimSpace(cfg.Schema)) == 0 || bytes.TrimSpace(cfg.Schema)[0] != '{' {
			return nil, bad("grammar.value: want {\"name\", \"schema\"} with the JSON Schema, an object, in schema")
		}
		return &serving.Constraint{JSONSchema: bytes.TrimSpace(cfg.Schema)}, nil
	case "regex":
		var re string
		if err := json.Unmarshal(v, &re); err != nil {
			return nil, bad("grammar.value: want the regular expression, a string")
		}
		return &serving.Constraint{Regex: re}, nil
	}
	return nil, bad("grammar.type %q; want json, json_schema or regex", apierr.ClipName(g.Type))
}
