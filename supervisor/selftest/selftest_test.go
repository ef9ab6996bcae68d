package selftest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/bundle/bundletest"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/worker"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == protocol.WorkerCommand {
		os.Exit(worker.Main())
	}
	os.Exit(m.Run())
}

func options(t *testing.T, bundleDir string) Options {
	return Options{BundleDir: bundleDir, CacheDir: t.TempDir(), Policy: policy.Default(),
		Spawner: sandbox.NewSpawner(), WorkDir: t.TempDir()}
}

func TestPasses(t *testing.T) {
	// The daemon's environment holds a secret; the canary must not see it.
	t.Setenv("SANDCELL_TEST_SECRET", "x")
	var slow []string
	o := options(t, bundletest.Dir(t))
	o.Slow = func(what string) { slow = append(slow, what) }
	r := Run(context.Background(), o)
	if !r.OK() {
		t.Fatalf("%+v", r.Checks)
	}
	names := []string{}
	for _, c := range r.Checks {
		names = append(names, c.Name)
		if c.State != OK {
			t.Errorf("%+v", c)
		}
	}
	if want := "bundle,module,module (fuel),module (epochless),layers,canary,probe network,probe host_file,probe environment,probe write_outside,probe workspace,native"; strings.Join(names, ",") != want {
		t.Fatalf("checks %s", strings.Join(names, ","))
	}
	if r.NativeRoot == "" || r.NativeEnforcement == nil || r.NativeEnforcement.Backend != protocol.BackendNative {
		t.Fatalf("native: %q %+v", r.NativeWhy, r.NativeEnforcement)
	}
	if d := r.Checks[len(r.Checks)-1].Detail; !strings.Contains(d, "probes denied: network, write outside, executable memory, own memory, unshare, exec other, fork") {
		t.Fatalf("native probes: %s", d)
	}
	if len(slow) != 4 || r.Enforcement == nil || len(r.Enforcement.Missing(protocol.Layers())) > 0 {
		t.Fatalf("slow %v, contract %+v", slow, r.Enforcement)
	}
	// The canary is a run as the daemon's runs are: on the epochless engine.
	if r.Enforcement.Engine != string(engine.Epochless) {
		t.Fatalf("the canary ran on the %q engine", r.Enforcement.Engine)
	}
	if err := Light(context.Background(), o, r.Interpreter(false)); err != nil {
		t.Fatal(err)
	}
}

func TestFailures(t *testing.T) {
	t.Run("python.wasm hash", func(t *testing.T) {
		dir := bundletest.Copy(t)
		bundletest.Damage(t, filepath.Join(dir, bundle.Pinned().Wasm.Name), 1000)
		r := Run(context.Background(), options(t, dir))
		if r.OK() || !strings.HasPrefix(r.Failure(), "bundle: ") || !strings.Contains(r.Failure(), "sha256") {
			t.Fatalf("%q", r.Failure())
		}
	})
	t.Run("damaged module, cache unwritable", func(t *testing.T) {
		dir := bundletest.Copy(t)
		cwasm, _ := filepath.Glob(filepath.Join(dir, "*.cwasm"))
		for _, p := range cwasm {
			bundletest.Damage(t, p, 5000)
		}
		o := options(t, dir)
		// Read-only even for root: nothing can be created under /proc.
		o.CacheDir = "/proc/sandcell-selftest-cache"
		os.Chmod(dir, 0o555)
		defer os.Chmod(dir, 0o755)
		r := Run(context.Background(), o)
		if r.OK() || !strings.HasPrefix(r.Failure(), "module: no usable precompiled module") {
			t.Fatalf("%q", r.Failure())
		}
	})
	t.Run("required layer missing", func(t *testing.T) {
		o := options(t, bundletest.Dir(t))
		o.Policy.Disable = []string{"landlock"}
		r := Run(context.Background(), o)
		if r.OK() || r.Failure() != "layers: required but not active: landlock" {
			t.Fatalf("%q %+v", r.Failure(), r.Checks)
		}
	})
	t.Run("optional layer missing", func(t *testing.T) {
		o := options(t, bundletest.Dir(t))
		o.Policy.Disable = []string{"landlock"}
		o.Policy.Require = []string{protocol.LayerSeccomp}
		r := Run(context.Background(), o)
		if !r.OK() {
			t.Fatalf("%q", r.Failure())
		}
		for _, c := range r.Checks {
			if c.Name == "layers" && (c.State != Warn || !strings.Contains(c.Detail, "landlock")) {
				t.Fatalf("%+v", c)
			}
		}
	})
}

// The warm pool's roots: a root with a mount beneath it is named with the mount, a
// warning (its runs start cold); roots without one, or not made yet, are fine.
func TestPoolRoots(t *testing.T) {
	held, clean := t.TempDir(), t.TempDir()
	missing := filepath.Join(t.TempDir(), "not-yet")
	r := &Report{}
	r.poolRoots([]string{held, clean, missing})
	if len(r.Checks) != 1 || r.Checks[0].Name != "pool roots" || r.Checks[0].State != OK {
		t.Fatalf("%+v", r.Checks)
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root; CI runs as root")
	}
	mnt := filepath.Join(held, "mnt")
	os.Mkdir(mnt, 0o755)
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	r = &Report{}
	r.poolRoots([]string{held, clean, missing})
	if len(r.Checks) != 1 || r.Checks[0].State != Warn || !strings.HasPrefix(r.Checks[0].Detail, held+" has mounts beneath it ("+mnt+")") ||
		strings.Contains(r.Checks[0].Detail, clean) || !r.OK() {
		t.Fatalf("%+v", r.Checks)
	}
	t.Log(r.Checks[0].Detail)
}
