// Package clip shortens text that a client or a worker sent before it goes
// into an error message or a log line, so that no message grows with its
// input.
package clip

import "unicode/utf8"

// Clip returns s whole when it is at most n bytes long; otherwise its first
// n bytes, cut back to a whole UTF-8 character, and "...".
func Clip[T ~string | ~[]byte](s T, n int) string {
	if len(s) <= n {
		return string(s)
	}
	cut := n
	for cut > 0 && cut > n-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return string(s[:cut]) + "..."
}
