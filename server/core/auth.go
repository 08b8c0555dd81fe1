package core

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
)

// Tokens are one scope's bearer Tokens, replaced whole when the token
// files are reloaded. They are kept as SHA-256 digests: every comparison is
// then of 32 bytes, so that timing tells nothing of a token's length, and
// the Tokens themselves are kept nowhere in the server.
type Tokens struct {
	scope   string // the configuration keys' prefix, for the log: auth.inference
	digests atomic.Pointer[[][sha256.Size]byte]
}

func NewTokens(scope string, list []string) *Tokens {
	t := &Tokens{scope: scope}
	t.set(list)
	return t
}

// set puts list in force and says how many tokens it added and removed.
func (t *Tokens) set(list []string) (added, removed int) {
	next := make([][sha256.Size]byte, len(list))
	for i, tok := range list {
		next[i] = sha256.Sum256([]byte(tok))
	}
	if prev := t.digests.Swap(&next); prev != nil {
		added, removed = diff(*prev, next), diff(next, *prev)
	}
	return added, removed
}

// diff counts the digests of b that a lacks.
func diff(a, b [][sha256.Size]byte) int {
	n := 0
outer:
	for _, x := range b {
		for _, y := range a {
			if x == y {
				continue outer
			}
		}
		n++
	}
	return n
}

// match reports whether given is one of the tokens. Every token is
// compared, in constant time, so that neither the match nor its position
// leaks through timing.
// None says no token is set: the scope is open.
func (t *Tokens) None() bool { return t == nil || len(*t.digests.Load()) == 0 }

func (t *Tokens) Match(given string) bool {
	d := sha256.Sum256([]byte(given))
	match := 0
	for _, x := range *t.digests.Load() {
		match |= subtle.ConstantTimeCompare(d[:], x[:])
	}
	return match == 1
}

// Bearer requires one of t's tokens as an "Authorization: Bearer" header;
// while t holds no token it lets everything through.
func Bearer(t *Tokens) func(http.Handler) http.Handler {
	return BearerAs(t, WriteError)
}

// BearerAs is bearer answering a refusal with deny, which writes the
// status and message in an API's own error shape.
func BearerAs(t *Tokens, deny func(w http.ResponseWriter, status int, msg string)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if len(*t.digests.Load()) == 0 {
				next.ServeHTTP(w, r)
				return
			}
			given, ok := BearerToken(r.Header.Get("Authorization"))
			if !ok || !t.Match(given) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="stepserve"`)
				msg := "missing bearer token: send Authorization: Bearer <token>"
				if ok {
					msg = "invalid bearer token"
				}
				deny(w, http.StatusUnauthorized, msg)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// IndexAuth guards the read-only model listing as the repository API
// where that is on (its tokens, or none when it was left open on purpose)
// or has tokens; else with the inference tokens. Tokens are read at each
// request, so that a SIGHUP reload applies.
func IndexAuth(modelControl bool, repository, inference *Tokens) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		viaRepo, viaInfer := Bearer(repository)(next), Bearer(inference)(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if modelControl || len(*repository.digests.Load()) > 0 {
				viaRepo.ServeHTTP(w, r)
				return
			}
			viaInfer.ServeHTTP(w, r)
		})
	}
}

// AdminClosed reports whether the administrator's endpoints have no token
// of their own while inference has one, and were not left open on
// purpose (auth.repository.allow_anonymous): they are never more open
// than inference, so they are closed.
func (c *Core) AdminClosed() bool {
	return !c.Opts.RepositoryAnonymous && len(*c.RepositoryTokens.digests.Load()) == 0 && len(*c.InferenceTokens.digests.Load()) > 0
}

// AdminClosedMsg says why, and what opens them.
const AdminClosedMsg = "the administrator's endpoints (logging, trace settings and files, system shared memory) need a token while inference has one: " +
	"set auth.repository.token or auth.repository.token_file, or auth.repository.allow_anonymous: true to leave them open on purpose"

// AdminAuth guards the administrator's endpoints: the repository tokens,
// or closed (403) while only inference has tokens ([Server.adminClosed]).
// Tokens are read at each request, so that a SIGHUP reload applies.
func (c *Core) AdminAuth(next http.Handler) http.Handler {
	viaRepo := Bearer(c.RepositoryTokens)(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.AdminClosed() {
			WriteError(w, http.StatusForbidden, AdminClosedMsg)
			return
		}
		viaRepo.ServeHTTP(w, r)
	})
}

// BearerToken is the token of an Authorization header of the Bearer scheme,
// whose name is case-insensitive (RFC 9110, section 11.1).
func BearerToken(h string) (string, bool) {
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimLeft(token, " "), true
}

// SetTokens puts new bearer tokens in force, for a rotation without a
// restart (SIGHUP): requests that arrive from now on are checked against
// them. It logs, per scope, how many tokens there are (0: no
// authentication) and how many were added and removed; never a token. It
// is safe to call while serving.
func (c *Core) SetTokens(inference, repository []string) {
	for _, u := range []struct {
		t    *Tokens
		list []string
	}{{c.InferenceTokens, inference}, {c.RepositoryTokens, repository}} {
		added, removed := u.t.set(u.list)
		level := slog.LevelInfo
		if len(u.list) == 0 && removed > 0 {
			level = slog.LevelWarn // authentication turned off
		}
		c.Logger.Log(context.Background(), level, "bearer tokens reloaded", "scope", u.t.scope, "tokens", len(u.list), "added", added, "removed", removed)
	}
}

// SharedMemoryTokens are the tokens that guard the system shared-memory
// extension (status, register, unregister): registering makes the server
// map a file of the host's /dev/shm and read and write it, an
// administrator's act, so the repository scope's, closed as the other
// administrator's endpoints are while only inference has tokens
// ([Core.AdminClosed]). Read at each call, so that a SIGHUP reload
// applies.
func (c *Core) SharedMemoryTokens() *Tokens { return c.RepositoryTokens }

// SharedMemoryAuth guards the system shared-memory endpoints as
// [Core.AdminAuth] guards the administrator's.
func (c *Core) SharedMemoryAuth(next http.Handler) http.Handler { return c.AdminAuth(next) }
