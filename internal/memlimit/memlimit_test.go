package memlimit

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadFindsALimit(t *testing.T) {
	l := Read()
	assert.Positive(t, l.Bytes)
	assert.NotEmpty(t, l.Source)
	assert.LessOrEqual(t, l.Bytes, physicalMemory())
}

// TestAddressSpaceLimit runs the test binary again under prlimit --as: the
// limit it reads is the cap.
func TestAddressSpaceLimit(t *testing.T) {
	if os.Getenv("MEMLIMIT_CHILD") != "" {
		l := Read()
		os.Stdout.WriteString(strconv.FormatInt(l.Bytes, 10) + " " + l.Source)
		return
	}
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("no prlimit")
	}
	cmd := exec.Command("prlimit", "--as=3221225472", "--", os.Args[0], "-test.run=^TestAddressSpaceLimit$")
	cmd.Env = append(os.Environ(), "MEMLIMIT_CHILD=1")
	out, err := cmd.Output()
	require.NoError(t, err)
	var n int64
	var source string
	_, err = fmt.Sscan(string(out), &n, &source)
	require.NoError(t, err, "child said %q", out)
	assert.Positive(t, n)
	assert.LessOrEqual(t, n, int64(3<<30), "the cap bounds the limit (%s)", source)
}
