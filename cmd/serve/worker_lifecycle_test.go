package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shmFiles are the files in /dev/shm named for the server pid, as staging
// files once were (stepserve-<pid>-...).
func shmFiles(t *testing.T, pid int) []string {
	entries, err := os.ReadDir("/dev/shm")
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), fmt.Sprintf("stepserve-%d-", pid)) {
			names = append(names, e.Name())
		}
	}
	return names
}

// running reports whether pid is a live process (not gone, not a zombie).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestServerKilledLeavesNothingBehind: a server serving a model on a
// device worker is killed with SIGKILL. Its staging was never in /dev/shm
// (a memfd dies with the processes that map it), and the worker, whose
// control socket closed, exits by itself.
func TestServerKilledLeavesNothingBehind(t *testing.T) {
	p := start(t, "--model_repository", torchRepo(t, ""))
	probabilities(t, p.base, heldout(t)[:1])
	server, worker := p.cmd.Process.Pid, latestWorkerPID(t, p)
	assert.Empty(t, shmFiles(t, server), "staging files in /dev/shm while serving")

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	p.done <- <-p.done // the cleanup waits for it too
	assert.Eventually(t, func() bool { return !running(worker) }, 30*time.Second, 10*time.Millisecond, "the worker outlived its server")
	assert.Empty(t, shmFiles(t, server), "staging files in /dev/shm after the server was killed")
}

// TestCtrlCStopsTheWorkerInOrder: a terminal's Ctrl-C sends SIGINT to the
// whole foreground process group. It reaches the server alone (the worker
// leads a group of its own), and the server stops the worker in order: the
// worker exits by itself, status 0, without a traceback.
func TestCtrlCStopsTheWorkerInOrder(t *testing.T) {
	cmd := exec.Command(binPath, "--server.addr", "127.0.0.1:0", "--model_repository", torchRepo(t, ""))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // as a shell runs a job
	p := startCmd(t, cmd)
	worker := latestWorkerPID(t, p)
	require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGINT))
	select {
	case err := <-p.done:
		p.done <- err
		assert.NoError(t, err, "the server's exit")
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not stop on SIGINT")
	}
	logs := p.logs.String()
	assert.Contains(t, logs, fmt.Sprintf(`msg="torch worker stopped" engine=torch device=cpu pid=%d exit="status 0"`, worker))
	assert.Contains(t, logs, "stepserve_worker: stopping: shutdown requested", "stopped by its server, not by the signal")
	assert.NotContains(t, logs, "terminated by a signal")
	assert.NotContains(t, logs, "Traceback")
	assert.NotContains(t, logs, "KeyboardInterrupt")
	assert.False(t, running(worker))
}
