// Package bundletest gives tests the real, verified python.wasm and its .cwasm. It
// never skips: a test that needs the interpreter fails with the command that installs
// it, so a machine without the bundle cannot pass by running nothing.
package bundletest

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/sandbox/engine"
)

var (
	mu    sync.Mutex
	cache = map[engine.Variant]string{}
)

// Dir returns the bundle directory: $SANDCELL_BUNDLE_DIR, else build/bundle at the
// root of the source tree.
func Dir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("SANDCELL_BUNDLE_DIR"); d != "" {
		return d
	}
	return filepath.Join(sourceRoot(t), "build", "bundle")
}

// sourceRoot is the directory holding go.mod above the working directory.
func sourceRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no go.mod above %s", wd)
		}
	}
}

// BuildDir returns the directory of the interpreter build the bundle is installed
// from (python.wasm, python313.zip, site.zip: what bundle.Install takes):
// build/interpreter at the root of the source tree, which `make interpreter` fills.
func BuildDir(t testing.TB) string {
	t.Helper()
	b := filepath.Join(sourceRoot(t), "build", "interpreter")
	if _, err := os.Stat(filepath.Join(b, bundle.Pinned().Site.Name)); err != nil {
		t.Fatalf("the interpreter build is not in %s (run `make interpreter`): %v", b, err)
	}
	return b
}

// Open returns the opened, verified bundle.
func Open(t testing.TB) *bundle.Bundle {
	t.Helper()
	dir := Dir(t)
	b, err := bundle.Open(dir)
	if err != nil {
		t.Fatalf("the pinned interpreter is not installed in %s (run `make bundle`): %v", dir, err)
	}
	return b
}

// LibDir returns the bundle's library directory (preopened at /usr/local/lib).
func LibDir(t testing.TB) string {
	t.Helper()
	return Open(t).LibPath()
}

// Module returns the path of a verified .cwasm for the plain (fuel=false) or the
// fuel-metered engine variant, compiling it into the bundle directory if needed.
func Module(t testing.TB, fuel bool) string {
	t.Helper()
	if fuel {
		return VariantModule(t, engine.Fuel)
	}
	return VariantModule(t, engine.Plain)
}

// VariantModule returns the path of a verified .cwasm for the engine variant v,
// compiling it into the bundle directory if needed.
func VariantModule(t testing.TB, v engine.Variant) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if p, ok := cache[v]; ok {
		return p
	}
	b := Open(t)
	pre, err := b.Precompiled(engine.New(v.Options()), b.Dir)
	if err != nil {
		t.Fatalf("precompile: %v", err)
	}
	cache[v] = pre.Path
	return pre.Path
}

// Copy copies the bundle (MANIFEST, python.wasm, the library, the .cwasm files with
// their sidecars) into a new temporary directory, for tests that damage it.
func Copy(t testing.TB) string {
	t.Helper()
	for _, v := range engine.Variants() {
		VariantModule(t, v)
	}
	src, dst := Dir(t), t.TempDir()
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == bundle.NativeDir {
			return filepath.SkipDir // the native root (570 MiB) is not the interpreter's: left out
		}
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// Damage flips the byte at offset at of the file at path.
func Damage(t testing.TB, path string, at int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}
