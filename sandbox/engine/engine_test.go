package engine_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/bundle/bundletest"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

func TestWasmtimeVersionMatchesGoMod(t *testing.T) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build info")
	}
	for _, d := range info.Deps {
		if strings.HasPrefix(d.Path, "github.com/bytecodealliance/wasmtime-go/") {
			if d.Version != "v"+engine.WasmtimeVersion {
				t.Fatalf("go.mod has %s %s, engine.WasmtimeVersion says %s", d.Path, d.Version, engine.WasmtimeVersion)
			}
			return
		}
	}
	t.Fatal("wasmtime-go not in the build")
}

func TestFingerprintNamesTheConfiguration(t *testing.T) {
	plain, fuel := engine.New(engine.Options{}).Fingerprint(), engine.New(engine.Options{Fuel: true}).Fingerprint()
	if plain == fuel || !strings.Contains(plain, "wasmtime="+engine.WasmtimeVersion) || !strings.Contains(fuel, "fuel=1") {
		t.Fatalf("%q %q", plain, fuel)
	}
}

// A module compiled for one configuration does not load into another.
func TestLoadRefusesOtherConfiguration(t *testing.T) {
	fuelModule := bundletest.Module(t, true)
	if _, err := engine.New(engine.Options{}).Load(fuelModule); err == nil {
		t.Fatal("a fuel-metered module loaded into a plain engine")
	}
	if err := engine.New(engine.Options{Fuel: true}).Check(fuelModule); err != nil {
		t.Fatal(err)
	}
	// The direction that matters for CPU limits: a module without epoch checks must
	// not load into an engine that would rely on them, nor the reverse.
	epochless, plain := bundletest.VariantModule(t, engine.Epochless), bundletest.Module(t, false)
	if _, err := engine.New(engine.Plain.Options()).Load(epochless); err == nil {
		t.Fatal("an epochless module loaded into a plain engine")
	}
	if _, err := engine.New(engine.Epochless.Options()).Load(plain); err == nil {
		t.Fatal("a plain module loaded into an epochless engine")
	}
	if fp := engine.New(engine.Epochless.Options()).Fingerprint(); !strings.Contains(fp, "epoch=0") {
		t.Fatalf("epochless fingerprint %q", fp)
	}
}

// spec runs code as the worker would, with a fresh workspace: the snapshot reads the
// program from its stdin (see bundle/bootstrap.py).
func spec(t testing.TB, code string) (engine.Spec, string) {
	ws := t.TempDir()
	header := "code\x00" + code + "\x00<string>\x00\x000" // MODE, SOURCE, NAME, DISK (none), N
	stdin := filepath.Join(t.TempDir(), "stdin")
	if err := os.WriteFile(stdin, fmt.Appendf(nil, "%010d%s", len(header), header), 0o600); err != nil {
		t.Fatal(err)
	}
	return engine.Spec{
		Argv:      []string{bundle.GuestExecutable},
		StdinFile: stdin,
		Preopens: []engine.Preopen{
			{Host: ws, Guest: "/ws"},
			{Host: bundletest.LibDir(t), Guest: bundle.GuestLibDir, ReadOnly: true},
		},
		MemoryBytes: 128 << 20,
	}, ws
}

func runIn(t testing.TB, e *engine.Engine, mod *engine.Module, code string, fuel uint64) (engine.Outcome, string) {
	s, ws := spec(t, code)
	s.Fuel = fuel
	return e.Run(mod, s), ws
}

func TestRunInProcess(t *testing.T) {
	e := engine.New(engine.Options{})
	mod, err := e.Load(bundletest.Module(t, false))
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close()
	out, ws := runIn(t, e, mod, "open('/ws/r', 'w').write(str(6*7)); raise SystemExit(5)", 0)
	if out.Reason != protocol.Exited || out.ExitCode != 5 {
		t.Fatalf("%+v", out)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "r")); string(b) != "42" {
		t.Fatalf("guest wrote %q", b)
	}
	if out := e.Run(mod, engine.Spec{Argv: []string{"python"}, MemoryBytes: 128 << 20, Fuel: 5}); out.Reason != protocol.InternalError {
		t.Fatalf("fuel budget on a plain engine: %+v", out)
	}
	// Less memory than the snapshot's 20 MiB: instantiation fails cleanly.
	if out := e.Run(mod, engine.Spec{Argv: []string{"python"}, MemoryBytes: 1 << 20}); out.Reason == protocol.Exited {
		t.Fatalf("ran with 1 MiB: %+v", out)
	}
}

func TestCPULimitInProcess(t *testing.T) {
	e := engine.New(engine.Options{})
	mod, err := e.Load(bundletest.Module(t, false))
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close()
	s, _ := spec(t, "while True: pass")
	s.CPU = 200 * time.Millisecond
	out := e.Run(mod, s)
	if out.Reason != protocol.CPULimit || out.Diagnostics[0] != "cpu time limit reached" {
		t.Fatalf("%+v", out)
	}
}

// An epochless engine cannot stop the guest: at its CPU limit it hands the outcome
// to Spec.Overrun (a worker's ends the process) while the guest runs on; without an
// Overrun a call with a CPU limit is refused before the guest starts.
func TestEpochlessCPULimit(t *testing.T) {
	e := engine.New(engine.Epochless.Options())
	mod, err := e.Load(bundletest.VariantModule(t, engine.Epochless))
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close()
	const code = "import sys; sum(i*i for i in range(3_000_000)); open('/ws/ran', 'w').write('ok')"
	s, ws := spec(t, code)
	s.CPU = 50 * time.Millisecond
	if out := e.Run(mod, s); out.Reason != protocol.InternalError {
		t.Fatalf("a CPU limit without Overrun: %+v", out)
	}
	if _, err := os.Stat(filepath.Join(ws, "ran")); err == nil {
		t.Fatal("the guest ran without a way to enforce its CPU limit")
	}
	s, ws = spec(t, code)
	s.CPU = 50 * time.Millisecond
	over := make(chan engine.Outcome, 2)
	s.Overrun = func(out engine.Outcome) { over <- out }
	if out := e.Run(mod, s); out.Reason != protocol.Exited || out.ExitCode != 0 {
		t.Fatalf("the guest, left to run on: %+v", out)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "ran")); string(b) != "ok" {
		t.Fatalf("the guest did not run to its end: %q", b)
	}
	if len(over) != 1 {
		t.Fatalf("Overrun called %d times, want 1", len(over))
	}
	if out := <-over; out.Reason != protocol.CPULimit || out.Diagnostics[0] != "cpu time limit reached" {
		t.Fatalf("overrun: %+v", out)
	}
	if !slices.Contains(engine.Variants(), engine.Epochless) || e.Fingerprint() == engine.New(engine.Plain.Options()).Fingerprint() {
		t.Fatalf("the epochless variant is not a configuration of its own: %s", e.Fingerprint())
	}
}

// BenchmarkInterruption measures what the CPU-limit mechanisms cost on CPU-bound
// Python: the same program on engines without interruption, with epoch checks, and
// with fuel metering. Each op is a whole in-process run (instantiate the snapshot, the
// loop); BenchmarkInterruption/*/startup runs `pass` to subtract start-up.
func BenchmarkInterruption(b *testing.B) {
	bd := bundletest.Open(b)
	cache := b.TempDir()
	for _, v := range []struct {
		name string
		e    *engine.Engine
		fuel uint64
	}{
		{"none", engine.New(engine.Options{Epochless: true}), 0},
		{"epoch", engine.New(engine.Options{}), 0},
		{"fuel", engine.New(engine.Options{Fuel: true}), 1 << 62},
	} {
		e := v.e
		pre, err := bd.Precompiled(e, cache)
		if err != nil {
			b.Fatal(err)
		}
		mod, err := e.Load(pre.Path)
		if err != nil {
			b.Fatal(err)
		}
		for _, prog := range []struct{ name, code string }{
			{"startup", "pass"},
			{"sum3M", "sum(i*i for i in range(3_000_000))"},
		} {
			b.Run(v.name+"/"+prog.name, func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					if out, _ := runIn(b, e, mod, prog.code, v.fuel); out.Reason != protocol.Exited || out.ExitCode != 0 {
						b.Fatalf("%+v", out)
					}
				}
			})
		}
		mod.Close()
	}
}

// cpuPrograms are the CPU-bound programs of the interpreter benchmark.
var cpuPrograms = []struct{ name, code string }{
	{"startup", "pass"},
	{"sum3M", "sum(i*i for i in range(3_000_000))"},
	{"fib25", "f = lambda n: n if n < 2 else f(n-1) + f(n-2)\nf(25)"},
	{"json", "import json\nd = [{'k%d' % i: [i, str(i), i * 0.5]} for i in range(20_000)]\nfor _ in range(5): json.loads(json.dumps(d))"},
}

// BenchmarkInterpreter runs start-up (`pass`) and three CPU-bound programs on the
// bundled interpreter in process (instantiate the snapshot, the program and its end;
// no worker process), on native /usr/bin/python3 -S -I as a whole process, and, when
// SANDCELL_NPM_WASM names the npm python.wasm of the walking skeleton, on that.
func BenchmarkInterpreter(b *testing.B) {
	e := engine.New(engine.Options{})
	mod, err := e.Load(bundletest.Module(b, false))
	if err != nil {
		b.Fatal(err)
	}
	defer mod.Close()
	var npm *engine.Module
	if p := os.Getenv("SANDCELL_NPM_WASM"); p != "" {
		wasm, err := os.ReadFile(p)
		if err != nil {
			b.Fatal(err)
		}
		if npm, err = e.Compile(wasm); err != nil {
			b.Fatal(err)
		}
		defer npm.Close()
	}
	for _, prog := range cpuPrograms {
		b.Run("sandcell/"+prog.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if out, _ := runIn(b, e, mod, prog.code, 0); out.Reason != protocol.Exited || out.ExitCode != 0 {
					b.Fatalf("%+v", out)
				}
			}
		})
		if npm != nil {
			b.Run("npm/"+prog.name, func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					s, _ := spec(b, prog.code)
					s.Argv = []string{"python", "-S", "-I", "-c", prog.code}
					s.StdinFile = ""
					s.Preopens = s.Preopens[:1]
					if out := e.Run(npm, s); out.Reason != protocol.Exited || out.ExitCode != 0 {
						b.Fatalf("%+v", out)
					}
				}
			})
		}
		b.Run("native/"+prog.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if err := exec.Command("/usr/bin/python3", "-S", "-I", "-c", prog.code).Run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
