package cpufallback

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHugeMakeHugePages: a resident weight's slice comes back zeroed and,
// where the kernel's transparent huge pages are not "never", its memory
// is backed by 2 MiB pages once written (the mappings that hold it count
// them in /proc/self/smaps).
func TestHugeMakeHugePages(t *testing.T) {
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || strings.Contains(string(mode), "[never]") {
		t.Skipf("transparent huge pages are off here (%q)", strings.TrimSpace(string(mode)))
	}
	s := hugeMake[float32](4 << 20) // 16 MiB: 7 or 8 whole 2 MiB pages
	nonzero := 0
	for i, v := range s {
		if v != 0 {
			nonzero++
		}
		s[i] = 1
	}
	require.Zero(t, nonzero, "elements not zero")
	lo := uintptr(unsafe.Pointer(&s[0]))
	// At least one: on a host whose memory is too fragmented, the kernel
	// may not find 2 MiB for each.
	assert.GreaterOrEqual(t, anonHugeKiB(t, lo, lo+uintptr(len(s))*4), 2048, "huge pages in the mappings that hold the slice")
}

// anonHugeKiB sums AnonHugePages over the mappings of /proc/self/smaps
// that overlap [lo, hi) (advice splits a mapping where it starts and
// ends).
func anonHugeKiB(t *testing.T, lo, hi uintptr) int {
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	in, sum := false, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if a, b, ok := strings.Cut(strings.Fields(line)[0], "-"); ok {
			start, err1 := strconv.ParseUint(a, 16, 64)
			end, err2 := strconv.ParseUint(b, 16, 64)
			if err1 == nil && err2 == nil {
				in = start < uint64(hi) && end > uint64(lo)
				continue
			}
		}
		if in && strings.HasPrefix(line, "AnonHugePages:") {
			n, err := strconv.Atoi(strings.Fields(line)[1])
			require.NoError(t, err)
			sum += n
		}
	}
	require.NoError(t, sc.Err())
	return sum
}
