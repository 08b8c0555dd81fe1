package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// buildOf says which BLAS and which element-wise kernels the server's CPU
// engine uses, from its stepserve_build_info labels.
func buildOf(base string) string {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return "?"
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	label := func(name string) string {
		if m := regexp.MustCompile(`stepserve_build_info\{[^}]*\b` + name + `="([^"]+)"`).FindSubmatch(b); m != nil {
			return string(m[1])
		}
		return "?"
	}
	return fmt.Sprintf("%s BLAS, %s kernels", label("blas"), label("kernels"))
}

// meanPadding is the mean padding ratio of a model's steps so far on the
// server at base (stepserve_padding_ratio's sum over its count, every
// bucket), or NaN when it cannot be read.
func meanPadding(base, model string) float64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return math.NaN()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum, count float64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || !strings.Contains(f[0], `model="`+model+`"`) {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch {
		case strings.HasPrefix(f[0], "stepserve_padding_ratio_sum{"):
			sum += v
		case strings.HasPrefix(f[0], "stepserve_padding_ratio_count{"):
			count += v
		}
	}
	return sum / count
}
