package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestResolveFillsDefaults(t *testing.T) {
	got, err := Default().Resolve(protocol.Limits{TimeoutMS: 1000})
	if err != nil {
		t.Fatal(err)
	}
	want := Default().Default
	want.TimeoutMS = 1000
	if got != want {
		t.Fatalf("got %+v want %+v", got, want)
	}
}

// A request may lower limits, never raise them; every offending limit is named.
func TestResolveRefusesAboveMaxima(t *testing.T) {
	_, err := Default().Resolve(protocol.Limits{TimeoutMS: 10_000_000, MemoryBytes: 8192 * MiB, MaxStdoutBytes: -1})
	if !errors.Is(err, ErrLimit) {
		t.Fatalf("%v", err)
	}
	for _, want := range []string{"timeout_ms 10000000 is above", "memory_bytes", "max_stdout_bytes is negative"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	p := Default()
	p.Default.TimeoutMS = 0
	p.Default.MemoryBytes = p.Max.MemoryBytes * 2
	p.EnvAllow = []string{"OK_NAME", "bad name"}
	err := p.Validate()
	for _, want := range []string{"default.timeout_ms must be set", "a wasm32 guest can address", `"bad name" is not a variable name`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
}

func TestFilterEnv(t *testing.T) {
	p := Default()
	if _, err := p.FilterEnv(map[string]string{"HOME": "/root"}); !errors.Is(err, ErrEnv) {
		t.Fatalf("empty allowlist let HOME through: %v", err)
	}
	p.EnvAllow = []string{"LANG"}
	if env, err := p.FilterEnv(map[string]string{"LANG": "C"}); err != nil || env["LANG"] != "C" {
		t.Fatalf("%v %v", env, err)
	}
}

func TestHardening(t *testing.T) {
	p := Default()
	h := p.Hardening(protocol.Limits{TimeoutMS: 1500, CPUMS: 4200})
	if h.Seccomp == nil || !h.Landlock || !h.Namespaces || len(h.Require) != len(protocol.Layers()) {
		t.Fatalf("%+v", h)
	}
	// The CPU backstop: a second above the larger limit, rounded up.
	if h.Rlimits.CPU != 6 || h.Rlimits.FSIZE != 1<<30 || h.Rlimits.NOFILE != 256 || h.Rlimits.NPROC != 256 {
		t.Fatalf("%+v", h.Rlimits)
	}
	p.MaxOpenFiles, p.MaxThreads, p.MaxFileBytes = 3, 0, -1
	err := p.Validate()
	for _, key := range []string{"max_open_files", "max_threads", "max_file_bytes"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("Validate does not name %s: %v", key, err)
		}
	}
}

// gvisor is a native layer: named for wasm runs, or beside Landlock (which gVisor's
// kernel lacks), it is a configuration error, never a run that cannot start.
func TestGVisorRequire(t *testing.T) {
	p := Default()
	p.Require = append(p.Require, protocol.LayerGVisor)
	p.NativeRequire = []string{protocol.LayerGVisor, protocol.LayerLandlock}
	err := p.Validate()
	for _, want := range []string{`require: "gvisor" is a layer of the native backend alone`, `native require: "gvisor" and "landlock" exclude each other`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
	p = Default()
	p.NativeRequire = []string{protocol.LayerGVisor, protocol.LayerSeccomp}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if h := p.NativeHardening(p.Default); !strings.Contains(strings.Join(h.Require, " "), protocol.LayerGVisor) {
		t.Fatalf("native require %v", h.Require)
	}
}
