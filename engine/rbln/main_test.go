package rbln

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestMain fails the run if it left anything in /dev/shm: staging is
// memfd-backed and must never appear there, however a test ends.
func TestMain(m *testing.M) {
	code := m.Run()
	if left := shmLeftovers(os.Getpid()); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the tests left %d files in /dev/shm: %s\n", len(left), strings.Join(left, " "))
		code = 1
	}
	os.Exit(code)
}

// shmLeftovers are the files in /dev/shm named for the process pid, as
// staging files once were (stepserve-<pid>-...).
func shmLeftovers(pid int) []string {
	entries, _ := os.ReadDir("/dev/shm")
	var left []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), fmt.Sprintf("stepserve-%d-", pid)) {
			left = append(left, e.Name())
		}
	}
	return left
}
