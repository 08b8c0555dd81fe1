package models

// Chat templates: the Jinja template a chat model's Hugging Face folder
// ships (tokenizer_config.json's chat_template, or chat_template.jinja
// beside it, which newer transformers write), rendered with the messages
// of a chat request into the prompt the model was trained on.
//
// Templates are rendered by internal/jinja, stepserve's fork of
// github.com/ardanlabs/jinja: a pure-Go Jinja implementation written for
// exactly these templates (it is tested against those of the Llama,
// Mistral, Qwen, Gemma and DeepSeek families), with the globals they call
// (raise_exception, strftime_now) and Python's string methods, no cgo and
// no dependencies of its own. The alternatives were a general
// Django-style engine that does not follow Jinja's semantics where the
// templates rely on them (loop controls, namespace, string methods), or a
// Python process per render. The fork adds what the original lacks: an
// evaluation budget. A template is a program that came with the model
// folder, and one that loops, allocates or recurses without end must cost
// a request an error, not the server its CPU, its memory or its stack.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"

	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/internal/jinja"
)

// chatTemplateFile is where newer transformers write a folder's chat
// template; it takes precedence over tokenizer_config.json's.
const chatTemplateFile = "chat_template.jinja"

// maxChatTemplateBytes bounds a chat template's source.
const maxChatTemplateBytes = 1 << 20

// ErrChat is wrapped by the errors of rendering a chat: the template's
// own refusals (raise_exception: a role it does not know, roles that do
// not alternate) and messages that cannot be rendered. They are the
// request's fault: a 400.
var ErrChat = errors.New("models: chat")

// ErrChatTemplateBudget is wrapped by the errors of a chat template that
// exceeded its evaluation budget, and of rendering with a template that
// was refused at load for exceeding it on a probe. They are the
// template's fault (the model's), not the request's: not a 400.
var ErrChatTemplateBudget = errors.New("the model's chat template exceeded its evaluation budget")

// A chat template's evaluation budget (see internal/jinja's Limits): a
// template may take ChatTemplateSteps steps, build strings, lists and an
// output of ChatTemplateBytes each, build ChatTemplateAlloc bytes in all
// over its render, and nest calls ChatTemplateDepth deep, on top of what
// the conversation brings:
//
//   - chatStepsPerPair steps for each pair of messages: some real
//     templates look back over the conversation for each message (Gemma
//     4's takes 30M steps for 2,400 messages, about as many as an HTTP
//     request holds; DeepSeek V4's 17M), where Llama 3's, Qwen's and
//     Mistral's take 0.1M to 1.8M, linear in them;
//   - a step per chatBytesPerStep bytes of the messages (a template reads
//     and copies its messages a few times over);
//   - the messages' bytes, to the bytes budget: the output holds them;
//   - chatAllocPerByte bytes built per byte of the messages: a template
//     copies its messages into its output, and into a few strings on the
//     way. The real templates build 1.6 to 15 MB for 2,400 messages of
//     200 bytes (Kimi K3's the most; 26 MB for messages of 1,000 bytes).
//
// A step is 30 to 50 ns of CPU (a million: 50 ms). Building costs a step
// per 64 bytes too, but the steps grow with the square of the messages
// (58M for 2,400 of them: 3.7 GB at 64 bytes a step), and what is built
// does not: ChatTemplateAlloc bounds the memory a render can hold.
const (
	ChatTemplateSteps = 1_000_000
	ChatTemplateBytes = 4 << 20
	ChatTemplateAlloc = 64 << 20
	ChatTemplateDepth = 64
	chatStepsPerPair  = 10
	chatBytesPerStep  = 4
	chatAllocPerByte  = 4
)

// chatLimits is the budget of rendering messages.
func chatLimits(messages []ChatMessage, tools []any) jinja.Limits {
	n, size := int64(len(messages)), int64(0)
	for _, m := range messages {
		size += int64(len(m.Role) + len(m.Content) + len(m.ToolCallID) + len(m.Name))
		for _, c := range m.ToolCalls {
			size += int64(len(c.ID)+len(c.Name)) + jsonSize(c.Arguments)
		}
	}
	for _, tool := range tools {
		size += jsonSize(tool)
	}
	return jinja.Limits{
		MaxSteps: ChatTemplateSteps + chatStepsPerPair*n*n + size/chatBytesPerStep,
		MaxBytes: ChatTemplateBytes + size,
		MaxAlloc: ChatTemplateAlloc + chatAllocPerByte*size,
		MaxDepth: ChatTemplateDepth,
	}
}

// probeMessages is the conversation a template is tried on at load,
// within the budget of no messages: a template that exceeds it on four
// messages would on every request.
var probeMessages = []ChatMessage{
	{Role: "system", Content: "You are a helpful assistant."},
	{Role: "user", Content: "Hello!"},
	{Role: "assistant", Content: "Hello! How can I help you today?"},
	{Role: "user", Content: "What is 2+2?"},
}

// ChatMessage is one message of a conversation.
type ChatMessage struct {
	Role    string
	Content string
	// ToolCalls are the calls an assistant message made (tools.go);
	// ToolCallID is the call a tool message answers, and Name its
	// function's name.
	ToolCalls  []ToolCall
	ToolCallID string
	Name       string
}

// ChatTemplate is a model's chat template, compiled. It is safe for
// concurrent use. A template refused at load (see [ParseChatTemplate]) is
// one too, whose Refused says why: the model serves without chat, and
// rendering with it fails wrapping [ErrChatTemplateBudget].
type ChatTemplate struct {
	tmpl *jinja.Template
	// The special tokens templates refer to by name (bos_token,
	// eos_token, ...), from tokenizer_config.json.
	tokens map[string]any
	// refused is why the template was refused at load; "" when it
	// serves.
	refused string
	// toolFormat is the format it writes tool calls in (tools.go).
	toolFormat string
}

// Refused is why the template was refused at load, to log and to answer
// chat requests with; "" for one that serves (and for none).
func (t *ChatTemplate) Refused() string {
	if t == nil {
		return ""
	}
	return t.refused
}

// tokenizerConfig is what tokenizer_config.json says of chat.
type tokenizerConfig struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	UNK          json.RawMessage `json:"unk_token"`
	PAD          json.RawMessage `json:"pad_token"`
}

// ReadChatTemplate reads the chat template of the Hugging Face folder dir
// (in root): chat_template.jinja where there is one, else
// tokenizer_config.json's chat_template (a string, or a list of named
// templates, of which "default" is used). It returns nil and no error for
// a folder with no chat template, and a refused template (see
// [ParseChatTemplate]) for one that exceeds its budget.
func ReadChatTemplate(root *os.Root, dir string) (*ChatTemplate, error) {
	cfgFile := path.Join(dir, hfTokenizerConfig)
	b, err := readFile(root, cfgFile, maxConfigBytes)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var cfg tokenizerConfig
	if err == nil {
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("%s: %w: not a JSON object: %s", cfgFile, ErrConfig, clip.Clip(jsonError(err), maxNameInError))
		}
	}
	source, where := "", ""
	jinjaFile := path.Join(dir, chatTemplateFile)
	switch t, err := readFile(root, jinjaFile, maxChatTemplateBytes); {
	case err == nil:
		source, where = string(t), jinjaFile
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	default:
		if source, err = templateOf(cfg.ChatTemplate); err != nil {
			return nil, fmt.Errorf("%s: %w: chat_template: %v", cfgFile, ErrConfig, err)
		}
		where = cfgFile + " chat_template"
	}
	if source == "" {
		return nil, nil
	}
	t, err := ParseChatTemplate(source, specialTokens(cfg))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return t, nil
}

// templateOf is the template source a chat_template value holds: a
// string, or a list of {name, template} of which "default" is taken.
func templateOf(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", errors.New("want a string, or a list of {name, template}")
	}
	var names []string
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
		names = append(names, clip.Clip(n.Name, maxNameInError))
	}
	return "", fmt.Errorf("no template named \"default\" among %q", names)
}

// specialTokens are tokenizer_config.json's special tokens by the names
// templates use. A token is a string or an AddedToken object
// ({"content": ...}).
func specialTokens(cfg tokenizerConfig) map[string]any {
	out := map[string]any{}
	for name, raw := range map[string]json.RawMessage{"bos_token": cfg.BOS, "eos_token": cfg.EOS, "unk_token": cfg.UNK, "pad_token": cfg.PAD} {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			out[name] = s
			continue
		}
		var added struct {
			Content *string `json:"content"`
		}
		if json.Unmarshal(raw, &added) == nil && added.Content != nil {
			out[name] = *added.Content
		}
	}
	return out
}

// ParseChatTemplate compiles a chat template's source. tokens are the
// special tokens it may refer to by name (bos_token, eos_token, ...).
//
// The template is then tried: it renders a probe conversation (system,
// user, assistant, user, with the generation prompt) within the budget of
// no messages. A template that exceeds its budget there, or nests too
// deep to compile, would on every request: it is returned refused, with
// no error (the model serves without chat; [ChatTemplate.Refused] says
// why). Any other failure on the probe (a template that refuses a system
// message, as many do) leaves it to serve: requests will have its words.
func ParseChatTemplate(source string, tokens map[string]any) (*ChatTemplate, error) {
	if len(source) > maxChatTemplateBytes {
		return nil, fmt.Errorf("%w: the chat template is %d bytes; at most %d", ErrConfig, len(source), maxChatTemplateBytes)
	}
	t, err := jinja.Compile(source)
	var be *jinja.BudgetError
	switch {
	case errors.As(err, &be):
		return &ChatTemplate{tokens: tokens, refused: "it does not compile: " + clip.Clip(err.Error(), 300)}, nil
	case err != nil:
		return nil, fmt.Errorf("%w: the chat template does not compile: %s", ErrConfig, clip.Clip(err.Error(), 300))
	}
	ct := &ChatTemplate{tmpl: t, tokens: tokens, toolFormat: toolFormatOf(source)}
	if _, err := ct.render(context.Background(), probeMessages, nil, true, chatLimits(nil, nil)); errors.As(err, &be) {
		ct.tmpl, ct.refused = nil, fmt.Sprintf("it exceeded its evaluation budget on a probe conversation of %d messages: %s", len(probeMessages), be.Reason)
	}
	return ct, nil
}

// Render renders messages into a prompt; with addGenerationPrompt the
// prompt ends where the assistant's reply begins. It ends when ctx does
// (an error wrapping ctx's). The template's own refusals
// (raise_exception: a role it does not know, roles that do not
// alternate) and messages it cannot take wrap [ErrChat], in the
// template's words: the request's fault. A template that exceeds its
// budget (see ChatTemplateSteps), or was refused at load, wraps
// [ErrChatTemplateBudget]. Any other failure is the template's, and
// wraps neither.
func (t *ChatTemplate) Render(ctx context.Context, messages []ChatMessage, addGenerationPrompt bool) (string, error) {
	return t.RenderTools(ctx, messages, nil, addGenerationPrompt)
}

// RenderTools is Render with the tools a conversation may call: OpenAI's
// tool definitions, as decoded JSON, passed to the template as its tools
// variable (as transformers passes them); nil for none.
func (t *ChatTemplate) RenderTools(ctx context.Context, messages []ChatMessage, tools []any, addGenerationPrompt bool) (string, error) {
	if t.refused != "" {
		return "", &chatBudgetError{"the model's chat template was refused at load: " + t.refused}
	}
	if len(messages) == 0 {
		return "", fmt.Errorf("%w: no messages; want at least one {role, content}", ErrChat)
	}
	for i, m := range messages {
		if m.Role == "" {
			return "", fmt.Errorf("%w: message %d has no role", ErrChat, i)
		}
	}
	out, err := t.render(ctx, messages, tools, addGenerationPrompt, chatLimits(messages, tools))
	var r *refusal
	var be *jinja.BudgetError
	switch {
	case errors.As(err, &r):
		return "", fmt.Errorf("%w: the chat template refused the messages: %s", ErrChat, clip.Clip(r.msg, 500))
	case errors.As(err, &be):
		return "", &chatBudgetError{ErrChatTemplateBudget.Error() + ": " + be.Reason}
	case err != nil && ctx.Err() != nil:
		return "", fmt.Errorf("models: rendering the chat template: %w", ctx.Err())
	case err != nil:
		return "", fmt.Errorf("models: the model's chat template failed to render: %s", clip.Clip(err.Error(), 500))
	}
	return out, nil
}

// render renders messages within lim.
func (t *ChatTemplate) render(ctx context.Context, messages []ChatMessage, tools []any, addGenerationPrompt bool, lim jinja.Limits) (string, error) {
	msgs := make([]any, len(messages))
	for i, m := range messages {
		msgs[i] = m.templateValue()
	}
	data := make(map[string]jinja.Value, len(t.tokens)+3)
	for k, v := range t.tokens {
		data[k] = jinja.FromGoValue(v)
	}
	data["messages"] = jinja.FromGoValue(msgs)
	if tools != nil {
		data["tools"] = jinja.FromGoValue(tools)
	}
	data["add_generation_prompt"] = jinja.NewBool(addGenerationPrompt)
	data["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := "raise_exception"
		if len(args) > 0 {
			if args[0].IsString() {
				msg = args[0].AsString()
			} else {
				msg = args[0].String()
			}
		}
		return jinja.Undefined(), &refusal{msg}
	})
	return t.tmpl.RenderContext(ctx, data, lim)
}

// chatBudgetError is a template's budget exceeded, in its own words; it
// wraps ErrChatTemplateBudget.
type chatBudgetError struct{ msg string }

func (e *chatBudgetError) Error() string { return e.msg }
func (e *chatBudgetError) Unwrap() error { return ErrChatTemplateBudget }

// refusal is a template's raise_exception.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }
