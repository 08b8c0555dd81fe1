// Bearer tokens: their sources, reading, reloading and checks.

package config

import (
	"fmt"
	"os"
	"strings"
)

// tokenSource is one scope's token key and token file.
type tokenSource struct{ scope, token, file string }

// Reload re-reads the token files, for a rotation without a restart. The
// token keys keep the values they were started with. On error the tokens
// in force should stay: the error names the file, never a token.
func (a Auth) Reload() (Auth, error) {
	var err error
	if a.InferenceTokens, err = a.inference.read(); err != nil {
		return a, err
	}
	if a.RepositoryTokens, err = a.repository.read(); err != nil {
		return a, err
	}
	return a, nil
}

func (s tokenSource) read() ([]string, error) {
	t, err := tokens(s.token, s.file)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, s.scope, err)
	}
	return t, nil
}

// check refuses a repository API left without a token by oversight: with
// model control on, a token on inference says the server is not meant to be
// open, and load and unload are the more dangerous of the two.
func (a Auth) check(modelControl bool) error {
	switch {
	case len(a.RepositoryTokens) > 0 && a.RepositoryAnonymous:
		return fmt.Errorf("%w: auth.repository.allow_anonymous is true but auth.repository.token or auth.repository.token_file sets a token; choose one", ErrInvalid)
	case modelControl && len(a.InferenceTokens) > 0 && len(a.RepositoryTokens) == 0 && !a.RepositoryAnonymous:
		return fmt.Errorf("%w: server.enable_model_control is on and auth.inference.token (or token_file) guards inference, "+
			"but the repository API, which loads and unloads models, has no token: set auth.repository.token or auth.repository.token_file, "+
			"or auth.repository.allow_anonymous: true to leave it open on purpose", ErrInvalid)
	}
	return nil
}

// tokens reads the bearer tokens of one scope: the token key, and every
// non-empty, non-comment line of the token file. An error says where a bad
// token is, never what it is.
func tokens(token, file string) ([]string, error) {
	var out []string
	if token != "" {
		if !goodToken(token) {
			return nil, fmt.Errorf("token: %s", weakToken)
		}
		out = append(out, token)
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("token_file: %w", err)
		}
		n := len(out)
		for i, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if !goodToken(line) {
				return nil, fmt.Errorf("token_file %s, line %d: %s", file, i+1, weakToken)
			}
			out = append(out, line)
		}
		if len(out) == n {
			return nil, fmt.Errorf("token_file %s holds no token", file)
		}
	}
	return out, nil
}

// weakToken is what a token must be: long enough (16 characters) that it is
// not guessed.
const weakToken = "a token must be at least 16 characters without spaces"

func goodToken(t string) bool { return len(t) >= 16 && !strings.ContainsAny(t, " \t") }
