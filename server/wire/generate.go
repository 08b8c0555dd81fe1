package wire

// The parameters of a generation, as Triton's generate extension and its
// streaming gRPC clients send them: one reading for both doors.

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/serving"
)

// generateParams are the parameters a generation takes by name.
var generateParams = "max_tokens, min_tokens, temperature, top_p, top_k, stop, seed, stream, ignore_eos, exclude_input_in_output, return_finish_reason, priority, speculative_decoding"

// GenerateParams reads the parameters of a generation asked by Triton's
// generate extension (HTTP) or a ModelStreamInfer request (gRPC), as JSON
// values by name; it also returns the stream parameter when given.
func GenerateParams(p map[string]json.RawMessage) (*serving.GenerateRequest, *bool, error) {
	gr := &serving.GenerateRequest{Logprobs: -1}
	var stream *bool
	bad := func(k, want string) error {
		return apierr.BadRequest(fmt.Sprintf("parameter %s: want %s", k, want))
	}
	for k, v := range p {
		var err error
		switch k {
		case "max_tokens":
			gr.MaxTokens = new(int)
			err = json.Unmarshal(v, gr.MaxTokens)
		case "temperature":
			gr.Temperature = new(float64)
			err = json.Unmarshal(v, gr.Temperature)
		case "top_p":
			gr.TopP = new(float64)
			err = json.Unmarshal(v, gr.TopP)
		case "top_k":
			gr.TopK = new(int)
			err = json.Unmarshal(v, gr.TopK)
		case "seed":
			gr.Seed = new(int64)
			err = json.Unmarshal(v, gr.Seed)
		case "priority":
			err = json.Unmarshal(v, &gr.Priority)
		case "ignore_eos":
			err = json.Unmarshal(v, &gr.IgnoreEOS)
		case "min_tokens":
			err = json.Unmarshal(v, &gr.MinTokens)
		case "speculative_decoding":
			var on *bool
			err = json.Unmarshal(v, &on)
			gr.NoSpeculation = on != nil && !*on
		case "stream":
			stream = new(bool)
			err = json.Unmarshal(v, stream)
		case "exclude_input_in_output", "return_finish_reason":
			var b bool
			if err = json.Unmarshal(v, &b); err == nil && k == "exclude_input_in_output" && !b {
				return nil, nil, apierr.BadRequest("parameter exclude_input_in_output: false is not supported; text_output never includes the prompt")
			}
		case "stop", "stop_words":
			var l []string
			if l, err = stringList(v); err == nil {
				for _, s := range l {
					if s != "" {
						gr.Stop = append(gr.Stop, s)
					}
				}
			}
		case "bad_words":
			var l []string
			if l, err = stringList(v); err == nil && len(strings.Join(l, "")) > 0 {
				return nil, nil, apierr.BadRequest("parameter bad_words is not supported; leave it out or empty")
			}
		default:
			return nil, nil, apierr.BadRequest(fmt.Sprintf("unknown parameter %s; the generate extension takes %s", apierr.ClipName(k), generateParams))
		}
		if err != nil {
			return nil, nil, bad(k, map[string]string{"max_tokens": "an integer", "min_tokens": "an integer", "top_k": "an integer", "seed": "a 64-bit integer",
				"priority": "an integer", "temperature": "a number", "top_p": "a number", "ignore_eos": "a boolean", "stream": "a boolean", "speculative_decoding": "a boolean",
				"exclude_input_in_output": "a boolean", "return_finish_reason": "a boolean"}[k]+map[bool]string{true: "a string or an array of strings"}[k == "stop" || k == "stop_words" || k == "bad_words"])
		}
	}
	return gr, stream, nil
}

// stringList is a JSON string or array of strings.
func stringList(v json.RawMessage) ([]string, error) {
	var one string
	if err := json.Unmarshal(v, &one); err == nil {
		return []string{one}, nil
	}
	var list []string
	err := json.Unmarshal(v, &list)
	return list, err
}
