package config

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repo makes a model repository directory and returns its path.
func repo(t *testing.T) string {
	t.Helper()
	return t.TempDir()
}

func TestDefaults(t *testing.T) {
	dir := repo(t)
	c, err := Load([]string{"--model_repository", dir})
	require.NoError(t, err)
	assert.Equal(t, ":8000", c.Server.Addr)
	assert.Equal(t, int64(64<<20), c.Server.MaxBodyBytes)
	assert.Equal(t, int64(64<<20), c.Server.MaxResponseBytes)
	assert.Zero(t, c.Server.MaxInflightBytes, "0: the server takes half the memory limit it finds")
	assert.Equal(t, 30*time.Second, c.Server.ShutdownGrace)
	assert.Equal(t, 10*time.Second, c.Server.ReadHeaderTimeout)
	assert.True(t, c.Server.StrictReadiness, "as Triton: ready when every model is")
	assert.Equal(t, dir, c.ModelRepository)
	assert.Equal(t, slog.LevelInfo, c.Log.Level)
	assert.Equal(t, "text", c.Log.Format)
	assert.Zero(t, c.Batching.MaxQueueDelay, "as Triton: no wait unless asked")
	assert.Equal(t, 1024, c.Batching.MaxQueueSize)
	assert.Zero(t, c.Batching.DefaultTimeout)
	assert.Equal(t, 1, c.Batching.PriorityLevels)
	assert.Equal(t, Models{MaxModelBytes: 0, LoadTimeout: 10 * time.Minute, ExitOnError: true}, c.Models, "auto: the model set takes half the memory limit")
}

func TestModelLimits(t *testing.T) {
	dir := repo(t)
	t.Setenv("STEPSERVE_MODELS_MAX_MODEL_BYTES", "4GiB")
	c, err := Load([]string{"--model_repository", dir, "--models.load_timeout", "90s"})
	require.NoError(t, err)
	assert.Equal(t, Models{MaxModelBytes: 4 << 30, LoadTimeout: 90 * time.Second, ExitOnError: true}, c.Models)
	c, err = Load([]string{"--model_repository", dir, "--models.exit_on_error=false", "--server.strict_readiness=false"})
	require.NoError(t, err)
	assert.False(t, c.Models.ExitOnError)
	assert.False(t, c.Server.StrictReadiness)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--models.max_model_bytes", "512KiB"}, `models.max_model_bytes: "512KiB"; want auto, or a size of at least 1MiB`},
		{[]string{"--models.max_model_bytes", "lots"}, `models.max_model_bytes: "lots"; want auto`},
		{[]string{"--models.load_timeout", "0s"}, `models.load_timeout: "0s"; want a positive duration`},
	} {
		_, err := Load(append([]string{"--model_repository", dir}, tc.args...))
		assert.ErrorIs(t, err, ErrInvalid)
		assert.ErrorContains(t, err, tc.want)
	}
}

func TestPrecedenceFileEnvFlag(t *testing.T) {
	dir := repo(t)
	file := filepath.Join(t.TempDir(), "stepserve.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`
server:
  addr: "127.0.0.1:7000"
  max_body_bytes: 1MiB
  shutdown_grace: 5s
model_repository: `+dir+`
log:
  level: debug
  format: json
`), 0o644))

	c, err := Load([]string{"--config", file})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:7000", c.Server.Addr, "file over default")
	assert.Equal(t, int64(1<<20), c.Server.MaxBodyBytes)
	assert.Equal(t, 5*time.Second, c.Server.ShutdownGrace)
	assert.Equal(t, slog.LevelDebug, c.Log.Level)
	assert.Equal(t, "json", c.Log.Format)
	assert.Equal(t, file, c.File)

	t.Setenv("STEPSERVE_SERVER_ADDR", "127.0.0.1:7001")
	t.Setenv("STEPSERVE_LOG_FORMAT", "text")
	c, err = Load([]string{"--config", file})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:7001", c.Server.Addr, "env over file")
	assert.Equal(t, "text", c.Log.Format)
	assert.Equal(t, int64(1<<20), c.Server.MaxBodyBytes, "file keys env does not set are kept")

	assert.False(t, c.Server.EnableModelControl)
	t.Setenv("STEPSERVE_SERVER_ENABLE_MODEL_CONTROL", "true")
	c, err = Load([]string{"--config", file})
	require.NoError(t, err)
	assert.True(t, c.Server.EnableModelControl, "env sets a boolean")
	c, err = Load([]string{"--config", file, "--server.enable_model_control=false"})
	require.NoError(t, err)
	assert.False(t, c.Server.EnableModelControl, "flag over env")
	t.Setenv("STEPSERVE_SERVER_ENABLE_MODEL_CONTROL", "")

	c, err = Load([]string{"--config", file, "--server.addr", "127.0.0.1:7002"})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:7002", c.Server.Addr, "flag over env")

	other := repo(t)
	t.Setenv("STEPSERVE_MODEL_REPOSITORY", other)
	c, err = Load(nil)
	require.NoError(t, err)
	assert.Equal(t, other, c.ModelRepository)
}

func TestInvalidValuesNameKeyValueAndWant(t *testing.T) {
	dir := repo(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--server.addr", "8000"}, `server.addr: "8000"; want host:port`},
		{[]string{"--server.max_body_bytes", "lots"}, `server.max_body_bytes: "lots"; want a size`},
		{[]string{"--server.max_body_bytes", "10"}, `server.max_body_bytes: "10"; want a size of at least 1KiB`},
		{[]string{"--server.max_response_bytes", "100"}, `server.max_response_bytes: "100"; want a size of at least 1KiB`},
		{[]string{"--server.max_inflight_bytes", "1KiB"}, `server.max_inflight_bytes: "1KiB"; want 0 (half the memory limit) or a size of at least 1MiB`},
		{[]string{"--server.shutdown_grace", "soon"}, `server.shutdown_grace: "soon"; want a duration`},
		{[]string{"--server.shutdown_grace", "-1s"}, `server.shutdown_grace: "-1s"`},
		{[]string{"--server.read_header_timeout", "0s"}, `server.read_header_timeout: "0s"; want a positive duration`},
		{[]string{"--batching.max_queue_delay", "1 sec"}, `batching.max_queue_delay: "1 sec"; want a duration`},
		{[]string{"--batching.max_queue_size", "0"}, `batching.max_queue_size: "0"; want an integer of at least 1`},
		{[]string{"--batching.default_timeout", "-2s"}, `batching.default_timeout: "-2s"`},
		{[]string{"--batching.priority_levels", "many"}, `batching.priority_levels: "many"; want an integer in 1..100`},
		{[]string{"--log.level", "loud"}, `log.level: "loud"; want debug, info, warn or error`},
		{[]string{"--log.format", "xml"}, `log.format: "xml"; want text or json`},
		{[]string{"--model_repository", filepath.Join(dir, "nope")}, `model_repository: "` + filepath.Join(dir, "nope") + `"; want an existing directory`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			args := append([]string{"--model_repository", dir}, tt.args...)
			_, err := Load(args)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalid), "%v", err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestEngineAndRBLN(t *testing.T) {
	dir := repo(t)
	c, err := Load([]string{"--model_repository", dir})
	require.NoError(t, err)
	assert.Equal(t, Engine{Default: "cpu", Failover: "none"}, c.Engine)
	assert.Equal(t, "/usr/bin/python3", c.RBLN.Python)
	assert.Nil(t, c.RBLN.Devices, "left to the engine: the server's RBLN_VISIBLE_DEVICES, else 0")
	assert.Empty(t, c.RBLN.Env)
	assert.Equal(t, 10*time.Second, c.RBLN.StallTimeout)
	assert.Equal(t, 30*time.Minute, c.RBLN.CompileTimeout)
	assert.True(t, c.RBLN.StrictWarmup, "a warm-up that is not clean refuses readiness by default")
	assert.Equal(t, 1, c.RBLN.TorchWorkers)

	file := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`
engine: {default: rbln, failover: cpufallback}
rbln:
  devices: [0, 1]
  env: {RBLN_DEVICE_MAP: "0:0,1", RBLN_NPUS_PER_DEVICE: 2}
  strict_warmup: false
  compile_cache_dir: /var/cache/rbln
  compile_timeout: 2h
  torch_workers: 3
`), 0o644))
	c, err = Load([]string{"--config", file, "--model_repository", dir})
	require.NoError(t, err)
	assert.Equal(t, Engine{Default: "rbln", Failover: "cpufallback"}, c.Engine)
	assert.Equal(t, []string{"0", "1"}, c.RBLN.Devices)
	assert.Equal(t, map[string]string{"RBLN_DEVICE_MAP": "0:0,1", "RBLN_NPUS_PER_DEVICE": "2"}, c.RBLN.Env)
	assert.False(t, c.RBLN.StrictWarmup)
	assert.Equal(t, "/var/cache/rbln", c.RBLN.CompileCacheDir)
	assert.Equal(t, 2*time.Hour, c.RBLN.CompileTimeout)
	assert.Equal(t, 3, c.RBLN.TorchWorkers)

	require.NoError(t, os.WriteFile(file, []byte("engine: {default: torch, failover: torch}\nrbln: {devices: []}\n"), 0o644))
	c, err = Load([]string{"--config", file, "--model_repository", dir})
	require.NoError(t, err)
	assert.Equal(t, Engine{Default: "torch", Failover: "torch"}, c.Engine)
	assert.Nil(t, c.RBLN.Devices, "an empty list leaves the devices to the engine")

	t.Setenv("STEPSERVE_RBLN_DEVICES", "2, 3")
	t.Setenv("STEPSERVE_RBLN_ENV", "A=1,B=x=y")
	c, err = Load([]string{"--model_repository", dir})
	require.NoError(t, err)
	assert.Equal(t, []string{"2", "3"}, c.RBLN.Devices)
	assert.Equal(t, map[string]string{"A": "1", "B": "x=y"}, c.RBLN.Env)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine.default", "gpu"}, `engine.default: "gpu"; want cpu or torch or rbln`},
		{[]string{"--engine.failover", "yes"}, `engine.failover: "yes"; want none or cpufallback or torch`},
		{[]string{"--engine.cpu_threads", "-1"}, `engine.cpu_threads: "-1"; want an integer in 0..1024`},
		{[]string{"--rbln.env", "NOEQUALS"}, `rbln.env: "NOEQUALS"; want KEY=VALUE pairs`},
		{[]string{"--rbln.devices", " , "}, `rbln.devices`},
		{[]string{"--rbln.devices", "[0,1"}, `device group "[0,1" has no closing ]`},
		{[]string{"--rbln.devices", "[0,0]"}, `NPU 0 twice`},
		{[]string{"--rbln.devices", "npu0"}, `device "npu0" is not an NPU index`},
		{[]string{"--rbln.npus_per_device", "3"}, `rbln.npus_per_device: "3"; want 1, 2, 4, 8, 16 or 32`},
		{[]string{"--rbln.stall_timeout", "0s"}, `rbln.stall_timeout: "0s"; want a positive duration`},
		{[]string{"--rbln.compile_timeout", "-1m"}, `rbln.compile_timeout: "-1m"; want a positive duration`},
		{[]string{"--rbln.torch_workers", "0"}, `rbln.torch_workers: "0"; want an integer in 1..64`},
	} {
		t.Setenv("STEPSERVE_RBLN_DEVICES", "")
		_, err := Load(append([]string{"--model_repository", dir}, tc.args...))
		assert.ErrorContains(t, err, tc.want)
	}
}

// rbln.devices names RSD groups alike from a flag, the environment and
// YAML (a list of lists); a plain comma list is single NPUs (issue 33,
// item 1).
func TestRBLNDeviceGroups(t *testing.T) {
	dir := repo(t)
	t.Setenv("STEPSERVE_RBLN_DEVICES", "")
	c, err := Load([]string{"--model_repository", dir, "--rbln.devices", "[0,1],[2, 3],4"})
	require.NoError(t, err)
	assert.Equal(t, []string{"0,1", "2,3", "4"}, c.RBLN.Devices, "from a flag")
	c, err = Load([]string{"--model_repository", dir, "--rbln.devices", "0,1"})
	require.NoError(t, err)
	assert.Equal(t, []string{"0", "1"}, c.RBLN.Devices, "a plain list is single NPUs")

	t.Setenv("STEPSERVE_RBLN_DEVICES", "[0,1],[2,3]")
	c, err = Load([]string{"--model_repository", dir})
	require.NoError(t, err)
	assert.Equal(t, []string{"0,1", "2,3"}, c.RBLN.Devices, "from the environment")
	t.Setenv("STEPSERVE_RBLN_DEVICES", "")

	file := filepath.Join(t.TempDir(), "stepserve.yaml")
	require.NoError(t, os.WriteFile(file, []byte("rbln:\n  devices: [[0, 1], [2, 3], 4, \"[5,6]\"]\n  npus_per_device: 1\n"), 0o644))
	c, err = Load([]string{"--model_repository", dir, "--config", file})
	require.NoError(t, err)
	assert.Equal(t, []string{"0,1", "2,3", "4", "5,6"}, c.RBLN.Devices, "from YAML, lists of lists")

	c, err = Load([]string{"--model_repository", dir, "--rbln.npus_per_device", "4"})
	require.NoError(t, err)
	assert.Equal(t, 4, c.RBLN.NPUsPerDevice)
}

func TestInvalidBoolean(t *testing.T) {
	t.Setenv("STEPSERVE_SERVER_ENABLE_MODEL_CONTROL", "maybe")
	_, err := Load([]string{"--model_repository", repo(t)})
	assert.ErrorContains(t, err, `server.enable_model_control: "maybe"; want true or false`)
}

func TestFileErrors(t *testing.T) {
	dir := repo(t)
	file := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(file, []byte("server:\n  adr: :9000\n"), 0o644))
	_, err := Load([]string{"--config", file, "--model_repository", dir})
	assert.ErrorContains(t, err, `unknown key "server.adr"; did you mean "server.addr"?`)

	_, err = Load([]string{"--config", filepath.Join(dir, "missing.yaml")})
	assert.ErrorContains(t, err, "missing.yaml")

	_, err = Load([]string{"--no-such-flag"})
	assert.ErrorContains(t, err, "unknown flag --no-such-flag")

	_, err = Load([]string{"--model_repository", dir, "extra"})
	assert.ErrorContains(t, err, `unexpected argument "extra"`)

	_, err = Load([]string{"-h"})
	assert.ErrorIs(t, err, pflag.ErrHelp)
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1024": 1024, "64MiB": 64 << 20, "2 KiB": 2048, "1GB": 1e9, "3Mi": 3 << 20, "7B": 7} {
		got, err := ParseBytes(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "MiB", "-1", "1.5MiB", "1TiB", "99999999999GiB"} {
		_, err := ParseBytes(bad)
		assert.Error(t, err, bad)
	}
}

func TestConnectionAndAuthKeys(t *testing.T) {
	dir := repo(t)
	c, err := Load([]string{"--model_repository", dir})
	require.NoError(t, err)
	assert.Zero(t, c.Server.MaxConnections, "0: from the descriptor limit")
	assert.False(t, c.Auth.RepositoryAnonymous)

	t.Setenv("STEPSERVE_SERVER_MAX_CONNECTIONS", "50")
	t.Setenv("STEPSERVE_AUTH_REPOSITORY_ALLOW_ANONYMOUS", "true")
	c, err = Load([]string{"--model_repository", dir})
	require.NoError(t, err)
	assert.Equal(t, 50, c.Server.MaxConnections)
	assert.True(t, c.Auth.RepositoryAnonymous)

	_, err = Load([]string{"--model_repository", dir, "--server.max_connections", "-1"})
	assert.ErrorContains(t, err, `server.max_connections: "-1"; want an integer in 0..16777216`)
}

// TestRepositoryAPIWithoutTokenIsRefused: model control with a token on
// inference only is refused unless anonymous access is chosen.
func TestRepositoryAPIWithoutTokenIsRefused(t *testing.T) {
	dir := repo(t)
	const inf, rep = "inference-token-0123456789", "repository-token-0123456789"
	for _, tc := range []struct {
		name string
		args []string
		want string // "" when the combination is accepted
	}{
		{"control, inference token only", []string{"--server.enable_model_control", "--auth.inference.token", inf},
			"server.enable_model_control is on and auth.inference.token (or token_file) guards inference, but the repository API, which loads and unloads models, has no token: " +
				"set auth.repository.token or auth.repository.token_file, or auth.repository.allow_anonymous: true"},
		{"control, both tokens", []string{"--server.enable_model_control", "--auth.inference.token", inf, "--auth.repository.token", rep}, ""},
		{"control, anonymous on purpose", []string{"--server.enable_model_control", "--auth.inference.token", inf, "--auth.repository.allow_anonymous"}, ""},
		{"control, no token anywhere", []string{"--server.enable_model_control"}, ""},
		{"no control, inference token only", []string{"--auth.inference.token", inf}, ""},
		{"anonymous and a token", []string{"--auth.repository.token", rep, "--auth.repository.allow_anonymous"}, "auth.repository.allow_anonymous is true but"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(append([]string{"--model_repository", dir}, tc.args...))
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalid)
			assert.ErrorContains(t, err, tc.want)
			assert.NotContains(t, err.Error(), inf, "a token is never echoed")
		})
	}
}

// TestTokenFileReload: Reload re-reads the files; a bad file is an error
// that names the file and line, never the token, and leaves the caller's
// tokens alone.
func TestTokenFileReload(t *testing.T) {
	dir := repo(t)
	file := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(file, []byte("# v1\nold-token-0123456789\n"), 0o600))
	c, err := Load([]string{"--model_repository", dir, "--auth.inference.token_file", file, "--auth.repository.token", "repository-token-0123456789"})
	require.NoError(t, err)
	assert.Equal(t, []string{"old-token-0123456789"}, c.Auth.InferenceTokens)

	require.NoError(t, os.WriteFile(file, []byte("new-token-0123456789\nnext-token-0123456789\n"), 0o600))
	a, err := c.Auth.Reload()
	require.NoError(t, err)
	assert.Equal(t, []string{"new-token-0123456789", "next-token-0123456789"}, a.InferenceTokens)
	assert.Equal(t, []string{"repository-token-0123456789"}, a.RepositoryTokens, "a token key keeps its value")
	assert.Equal(t, []string{"old-token-0123456789"}, c.Auth.InferenceTokens, "the caller's copy is untouched")

	for content, want := range map[string]string{
		"new-token-0123456789\nshort-secret\n": "token_file " + file + ", line 2: a token must be at least 16 characters",
		"# nothing\n\n":                        "token_file " + file + " holds no token",
	} {
		require.NoError(t, os.WriteFile(file, []byte(content), 0o600))
		_, err = c.Auth.Reload()
		require.ErrorIs(t, err, ErrInvalid)
		assert.ErrorContains(t, err, "auth.inference: "+want)
		assert.NotContains(t, err.Error(), "short-secret")
	}
	require.NoError(t, os.Remove(file))
	_, err = c.Auth.Reload()
	assert.ErrorContains(t, err, "no such file")
}

func TestMemoryBoundKeys(t *testing.T) {
	dir := repo(t)
	t.Setenv("STEPSERVE_SERVER_MAX_INFLIGHT_BYTES", "512MiB")
	c, err := Load([]string{"--model_repository", dir, "--server.max_response_bytes", "1MiB"})
	require.NoError(t, err)
	assert.Equal(t, int64(512<<20), c.Server.MaxInflightBytes, "from the environment")
	assert.Equal(t, int64(1<<20), c.Server.MaxResponseBytes, "from a flag")
}

func TestUnknownFlagSuggestsTheNearest(t *testing.T) {
	_, err := Load([]string{"--modle_repository", "x"})
	assert.EqualError(t, err, "config: unknown flag --modle_repository; did you mean --model_repository? (stepserve --help lists the flags)")
	_, err = Load([]string{"--server.adr=:1"})
	assert.EqualError(t, err, "config: unknown flag --server.adr; did you mean --server.addr? (stepserve --help lists the flags)")
	_, err = Load([]string{"--nothing-like-it"})
	assert.EqualError(t, err, "config: unknown flag --nothing-like-it (stepserve --help lists the flags)")
	_, err = Load([]string{"--version"})
	assert.ErrorIs(t, err, ErrVersion)
}

func TestCLIAndEnvironmentMistakes(t *testing.T) {
	_, err := Load([]string{"--server.addr", ":99999"})
	assert.ErrorContains(t, err, `server.addr: ":99999"; want host:port`)
	_, err = Load([]string{"--server.enable_model_control=maybe"})
	assert.ErrorContains(t, err, `server.enable_model_control: "maybe"; want true or false`)
	c, err := Load([]string{"--server.enable_model_control", "--model_repository", t.TempDir()})
	require.NoError(t, err)
	assert.True(t, c.Server.EnableModelControl, "a boolean flag alone means true")
	_, err = Load([]string{"version"})
	assert.ErrorIs(t, err, ErrVersion)
	t.Setenv("STEPSERVE_LOG_LEVLE", "debug")
	_, err = Load(nil)
	assert.EqualError(t, err, "config: environment variable STEPSERVE_LOG_LEVLE names no setting; did you mean STEPSERVE_LOG_LEVEL?")
}

func TestGRPCAddr(t *testing.T) {
	dir := repo(t)
	c, err := Load([]string{"--model_repository", dir})
	require.NoError(t, err)
	assert.Equal(t, ":8001", c.Server.GRPCAddr, "Triton's gRPC port")

	c, err = Load([]string{"--model_repository", dir, "--server.grpc_addr="})
	require.NoError(t, err)
	assert.Empty(t, c.Server.GRPCAddr, "empty: no gRPC")

	file := filepath.Join(t.TempDir(), "stepserve.yaml")
	require.NoError(t, os.WriteFile(file, []byte("server:\n  grpc_addr: \"\"\nmodel_repository: "+dir+"\n"), 0o644))
	c, err = Load([]string{"--config", file})
	require.NoError(t, err)
	assert.Empty(t, c.Server.GRPCAddr, "empty in the file: no gRPC")

	t.Setenv("STEPSERVE_SERVER_GRPC_ADDR", "127.0.0.1:9001")
	c, err = Load([]string{"--model_repository", dir})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9001", c.Server.GRPCAddr)

	_, err = Load([]string{"--model_repository", dir, "--server.grpc_addr", "8001"})
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, `server.grpc_addr: "8001"; want host:port, e.g. :8001, or empty to serve no gRPC`)
}

// TestDocsKeyTableIsCurrent holds docs/configuration.md's key table to the
// keys: every key documented once, none that does not exist, each with its
// default and environment variable (issue 34). The meaning column is the
// docs' own prose.
func TestDocsKeyTableIsCurrent(t *testing.T) {
	b, err := os.ReadFile("../docs/configuration.md")
	require.NoError(t, err)
	defaults := map[string]string{}
	for _, k := range keys {
		defaults[k.name] = k.def
	}
	tick := regexp.MustCompile("`([^`]+)`")
	documented := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cols := strings.Split(line, " | ")
		require.GreaterOrEqual(t, len(cols), 4, line)
		names := tick.FindAllStringSubmatch(cols[0], -1)
		for i, n := range names {
			name := n[1]
			_, ok := defaults[name]
			require.True(t, ok, "docs/configuration.md documents %q, which is not a key", name)
			require.False(t, documented[name], "%q is documented twice", name)
			documented[name] = true
			if i > 0 {
				continue // the row's other keys (a token's token_file) share its columns
			}
			def := strings.Trim(cols[1], "`")
			if defaults[name] == "" {
				assert.Contains(t, []string{"(empty)", "(none)", "(required)"}, def, "%s's default", name)
			} else {
				assert.Equal(t, defaults[name], def, "%s's default", name)
			}
			env := tick.FindStringSubmatch(cols[2])
			require.NotNil(t, env, "%s's environment variable", name)
			assert.Equal(t, envName(name), env[1], "%s's environment variable", name)
		}
	}
	for _, name := range Keys() {
		assert.True(t, documented[name], "docs/configuration.md lacks %s", name)
	}
}

// The system shared-memory limits are configuration keys (issue 30's
// review): defaults as the server had them, set by flag, refused out of
// range.
func TestSharedMemoryLimits(t *testing.T) {
	dir := repo(t)
	c, err := Load([]string{"--model_repository", dir})
	require.NoError(t, err)
	assert.Equal(t, 64, c.Server.MaxSharedMemoryRegions)
	assert.Equal(t, int64(16<<30), c.Server.MaxSharedMemoryBytes)
	c, err = Load([]string{"--model_repository", dir, "--server.shared_memory.max_regions", "2", "--server.shared_memory.max_bytes", "1GiB"})
	require.NoError(t, err)
	assert.Equal(t, 2, c.Server.MaxSharedMemoryRegions)
	assert.Equal(t, int64(1<<30), c.Server.MaxSharedMemoryBytes)
	_, err = Load([]string{"--model_repository", dir, "--server.shared_memory.max_regions", "0"})
	assert.ErrorContains(t, err, `server.shared_memory.max_regions: "0"; want an integer in 1..4096`)
}
