package models

// Chat templates: the Jinja template a chat model's Hugging Face folder
// ships (tokenizer_config.json's chat_template, or chat_template.jinja
// beside it, which newer transformers write), rendered with the messages
// of a chat request into the prompt the model was trained on.
//
// Templates are rendered by github.com/ardanlabs/jinja: a pure-Go Jinja
// implementation written for exactly these templates (it is tested
// against those of the Llama, Mistral, Qwen, Gemma and DeepSeek
// families), with the globals they call (raise_exception, strftime_now)
// and Python's string methods, no cgo and no dependencies of its own.
// The alternatives were a general Django-style engine that does not
// follow Jinja's semantics where the templates rely on them (loop
// controls, namespace, string methods), or a Python process per render.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"

	"github.com/ardanlabs/jinja"

	"github.com/stepserve/stepserve/internal/clip"
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

// ChatMessage is one message of a conversation.
type ChatMessage struct {
	Role    string
	Content string
}

// ChatTemplate is a model's chat template, compiled. It is safe for
// concurrent use.
type ChatTemplate struct {
	tmpl *jinja.Template
	// The special tokens templates refer to by name (bos_token,
	// eos_token, ...), from tokenizer_config.json.
	tokens map[string]any
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
// a folder with no chat template.
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
func ParseChatTemplate(source string, tokens map[string]any) (*ChatTemplate, error) {
	if len(source) > maxChatTemplateBytes {
		return nil, fmt.Errorf("%w: the chat template is %d bytes; at most %d", ErrConfig, len(source), maxChatTemplateBytes)
	}
	t, err := jinja.Compile(source)
	if err != nil {
		return nil, fmt.Errorf("%w: the chat template does not compile: %s", ErrConfig, clip.Clip(err.Error(), 300))
	}
	return &ChatTemplate{tmpl: t, tokens: tokens}, nil
}

// Render renders messages into a prompt; with addGenerationPrompt the
// prompt ends where the assistant's reply begins. The template's own
// refusals (raise_exception: a role it does not know, roles that do not
// alternate) and messages it cannot take wrap [ErrChat], in the
// template's words: the request's fault. Any other failure is the
// template's, and wraps neither.
func (t *ChatTemplate) Render(messages []ChatMessage, addGenerationPrompt bool) (string, error) {
	if len(messages) == 0 {
		return "", fmt.Errorf("%w: no messages; want at least one {role, content}", ErrChat)
	}
	msgs := make([]any, len(messages))
	for i, m := range messages {
		if m.Role == "" {
			return "", fmt.Errorf("%w: message %d has no role", ErrChat, i)
		}
		msgs[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	data := make(map[string]jinja.Value, len(t.tokens)+3)
	for k, v := range t.tokens {
		data[k] = jinja.FromGoValue(v)
	}
	data["messages"] = jinja.FromGoValue(msgs)
	data["add_generation_prompt"] = jinja.NewBool(addGenerationPrompt)
	data["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := "raise_exception"
		if len(args) > 0 {
			msg = args[0].String()
		}
		return jinja.Undefined(), &refusal{msg}
	})
	out, err := t.tmpl.RenderValues(data)
	var r *refusal
	switch {
	case errors.As(err, &r):
		return "", fmt.Errorf("%w: the chat template refused the messages: %s", ErrChat, clip.Clip(r.msg, 500))
	case err != nil:
		return "", fmt.Errorf("models: the model's chat template failed to render: %s", clip.Clip(err.Error(), 500))
	}
	return out, nil
}

// refusal is a template's raise_exception.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }
