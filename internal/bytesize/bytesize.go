// Package bytesize writes sizes for people, in the one format every
// message of the server uses: 512 B, 64 KiB, 1.5 GiB.
package bytesize

import (
	"strconv"
	"strings"
)

// Format writes n bytes with a binary unit and at most one decimal, the
// ".0" dropped.
func Format(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, u := float64(n), 0
	for v >= unit && u < 5 {
		v /= unit
		u++
	}
	s := strconv.FormatFloat(v, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + " " + [...]string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}[u]
}
