package inferencepb

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// protocVersion is the protoc `make proto` pins (Debian bookworm's
// protobuf-compiler).
const protocVersion = "libprotoc 3.21.12"

// TestGeneratedCodeIsCurrent regenerates the package as `make proto` does,
// into a temporary directory, and compares it with the checked-in files:
// a .proto or generator change without `make proto` fails here.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		t.Skip("protoc is not installed (make deps installs Debian's protobuf-compiler)")
	}
	out, err := exec.Command(protoc, "--version").Output()
	if err != nil || strings.TrimSpace(string(out)) != protocVersion {
		t.Skipf("protoc is %q; the checked-in code is from %s", strings.TrimSpace(string(out)), protocVersion)
	}
	tmp := t.TempDir()
	for _, plugin := range []string{"google.golang.org/protobuf/cmd/protoc-gen-go", "google.golang.org/grpc/cmd/protoc-gen-go-grpc"} {
		build := exec.Command("go", "build", "-o", filepath.Join(tmp, filepath.Base(plugin)), plugin)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", plugin, err, out)
		}
	}
	gen := filepath.Join(tmp, "gen")
	if err := os.Mkdir(gen, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"-I", "../../proto",
		"--plugin=protoc-gen-go=" + filepath.Join(tmp, "protoc-gen-go"),
		"--plugin=protoc-gen-go-grpc=" + filepath.Join(tmp, "protoc-gen-go-grpc"),
		"--go_out=" + gen, "--go_opt=paths=source_relative",
		"--go-grpc_out=" + gen, "--go-grpc_opt=paths=source_relative",
		"inference.proto"}
	if out, err := exec.Command(protoc, args...).CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, out)
	}
	files, err := filepath.Glob(filepath.Join(gen, "*.go"))
	if err != nil || len(files) != 2 {
		t.Fatalf("protoc generated %v (%v); want 2 files", files, err)
	}
	for _, f := range files {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		have, err := os.ReadFile(filepath.Base(f))
		if err != nil {
			t.Fatalf("%s is generated but not checked in; run make proto", filepath.Base(f))
		}
		if !bytes.Equal(have, want) {
			t.Errorf("%s differs from what make proto generates; run make proto", filepath.Base(f))
		}
	}
}
