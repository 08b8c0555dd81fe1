package server

import (
	"crypto/subtle"
	"net/http"
	"strings"
)

// bearer requires one of tokens as an "Authorization: Bearer" header; with
// no tokens it lets everything through. Every token is compared, in
// constant time, so that neither the match nor its position leaks through
// timing.
func bearer(tokens []string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if len(tokens) == 0 {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			given, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			match := 0
			for _, t := range tokens {
				match |= subtle.ConstantTimeCompare([]byte(given), []byte(t))
			}
			if !ok || match != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="stepserve"`)
				msg := "missing bearer token: send Authorization: Bearer <token>"
				if ok {
					msg = "invalid bearer token"
				}
				writeError(w, http.StatusUnauthorized, msg)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}
