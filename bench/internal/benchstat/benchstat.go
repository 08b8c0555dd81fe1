// Package benchstat holds what make bench's commands share: the median
// of a round's figures and the line that names the CPU they ran on.
package benchstat

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
)

// Median is v's median (the mean of the middle two for an even count).
func Median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// CPULine names the CPU, its count and its vector extensions from
// /proc/cpuinfo (the architecture where it cannot be read).
func CPULine() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	var model string
	var flags []string
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			if model == "" {
				model = strings.TrimSpace(v)
			}
		case "flags":
			if flags == nil {
				for _, f := range strings.Fields(v) {
					if f == "avx2" || f == "fma" || strings.HasPrefix(f, "avx512f") || f == "avx512_bf16" || f == "avx512_vnni" || strings.HasPrefix(f, "amx") {
						flags = append(flags, f)
					}
				}
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs (%s)", model, runtime.NumCPU(), strings.Join(flags, " "))
}
