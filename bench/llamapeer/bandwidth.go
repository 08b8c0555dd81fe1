package main

import (
	"sync"
	"time"
)

// readBandwidth measures the machine's memory read bandwidth, bytes a
// second: threads goroutines each sum their part of a 512 MiB buffer
// (eight times the last-level caches of these machines, so it comes from
// memory), eight independent sums each so loads, not additions, limit
// it; the best of five passes.
func readBandwidth(threads int) float64 {
	const size = 512 << 20
	buf := make([]uint64, size/8)
	for i := range buf {
		buf[i] = uint64(i) // touch every page before timing
	}
	best := 0.0
	for range 5 {
		var wg sync.WaitGroup
		sums := make([]uint64, threads)
		part := len(buf) / threads / 8 * 8
		start := time.Now()
		for t := range threads {
			wg.Go(func() { sums[t] = sum(buf[t*part : (t+1)*part]) })
		}
		wg.Wait()
		took := time.Since(start).Seconds()
		best = max(best, float64(threads*part*8)/took)
	}
	return best
}

func sum(b []uint64) uint64 {
	var s0, s1, s2, s3, s4, s5, s6, s7 uint64
	for i := 0; i+8 <= len(b); i += 8 {
		c := b[i : i+8 : i+8]
		s0 += c[0]
		s1 += c[1]
		s2 += c[2]
		s3 += c[3]
		s4 += c[4]
		s5 += c[5]
		s6 += c[6]
		s7 += c[7]
	}
	return s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7
}
