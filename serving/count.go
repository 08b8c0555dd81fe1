package serving

import (
	"context"
	"fmt"
)

// CountTokens is how many tokens r's prompt is, as Generate would read
// it (messages rendered by the model's chat template, tools included),
// without generating (Anthropic's count_tokens).
func (m *Model) CountTokens(ctx context.Context, r *GenerateRequest) (int, error) {
	g := m.gen
	if g == nil {
		return 0, fmt.Errorf("model %s is not a language model; it serves inference (/v2/models/%s/infer) (%w)", m.model.Name, m.model.Name, ErrNotGenerative)
	}
	prompt, err := g.prompt(ctx, r)
	if err != nil {
		return 0, err
	}
	return len(prompt), nil
}
