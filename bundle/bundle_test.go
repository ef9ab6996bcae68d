package bundle_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/bundle/bundletest"
	"github.com/sandcell/sandcell/sandbox/engine"
)

func TestPinnedInterpreter(t *testing.T) {
	if len(bundle.Pinned().Wasm.SHA256) != 64 || len(bundle.Pinned().Stdlib.SHA256) != 64 || len(bundle.Pinned().Sources) != 5 ||
		len(bundle.Pinned().Site.SHA256) != 64 {
		t.Fatalf("incomplete pin: %+v", bundle.Pinned())
	}
	b := bundletest.Open(t)
	if err := b.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyNamesExpectedAndActual(t *testing.T) {
	dir := t.TempDir()
	pin := bundle.Pinned().Wasm
	p := filepath.Join(dir, "python.wasm")
	os.WriteFile(p, []byte("short"), 0o644)
	err := pin.Verify(p)
	if !errors.Is(err, bundle.ErrMismatch) || !strings.Contains(err.Error(), fmt.Sprintf("size 5 bytes, expected %d", pin.Size)) {
		t.Fatalf("size mismatch: %v", err)
	}
	// Same size, other content: the hash names both values.
	zeros := make([]byte, pin.Size)
	os.WriteFile(p, zeros, 0o644)
	sum := sha256.Sum256(zeros)
	err = pin.Verify(p)
	if !errors.Is(err, bundle.ErrMismatch) || !strings.Contains(err.Error(), pin.SHA256) ||
		!strings.Contains(err.Error(), "sha256 "+hex.EncodeToString(sum[:])) {
		t.Fatalf("hash mismatch: %v", err)
	}
	if err := bundle.Install(dir, filepath.Join(dir, "out")); !errors.Is(err, bundle.ErrMismatch) {
		t.Fatalf("install of a wrong file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("install wrote something for a wrong file: %v", err)
	}
}

// installCopy installs the test bundle's interpreter into a new directory.
func installCopy(t *testing.T) string {
	t.Helper()
	build := buildCopy(t)
	dir := t.TempDir()
	if err := bundle.Install(build, dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The site layer's recipe and Pinned name the same packages with the same hashes.
func TestSitePackagesFollowTheRecipe(t *testing.T) {
	raw, err := os.ReadFile("interpreter/site-recipe.sh")
	if err != nil {
		t.Fatal(err)
	}
	var recipe []string
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) == 2 && strings.HasSuffix(f[0], ".deb") {
			recipe = append(recipe, filepath.Base(f[0])+" "+f[1])
		}
	}
	var pinned []string
	for _, s := range bundle.Pinned().SitePackages {
		pinned = append(pinned, s.Name+" "+s.SHA256)
	}
	if len(recipe) == 0 || strings.Join(recipe, "\n") != strings.Join(pinned, "\n") {
		t.Fatalf("site-recipe.sh pins\n%s\nbundle pins\n%s", strings.Join(recipe, "\n"), strings.Join(pinned, "\n"))
	}
}

// An unpacked site layer that differs from site.zip in any way fails Verify: a file
// changed, one added, one removed, one replaced by a link.
func TestSiteLayerVerified(t *testing.T) {
	lib := func(dir string) string { return filepath.Join(dir, bundle.LibDir) }
	paris := filepath.Join(bundle.ZoneDir, "Europe", "Paris")
	for name, damage := range map[string]func(dir string) error{
		"changed": func(dir string) error { return os.WriteFile(filepath.Join(lib(dir), paris), []byte("TZif"), 0o644) },
		"added": func(dir string) error {
			return os.WriteFile(filepath.Join(lib(dir), bundle.SitePackagesDir, "evil.py"), []byte("x"), 0o644)
		},
		"removed": func(dir string) error { return os.Remove(filepath.Join(lib(dir), paris)) },
		"linked": func(dir string) error {
			p := filepath.Join(lib(dir), paris)
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Symlink("/etc/passwd", p)
		},
		"not unpacked": func(dir string) error { return os.RemoveAll(filepath.Join(lib(dir), bundle.ZoneDir)) },
		"empty directory added": func(dir string) error {
			return os.Mkdir(filepath.Join(lib(dir), bundle.SitePackagesDir, "numpy"), 0o755)
		},
		"module beside it": func(dir string) error {
			return os.WriteFile(filepath.Join(lib(dir), "python3.13", "numpy.py"), []byte("x"), 0o644)
		},
		"writable by others": func(dir string) error { return os.Chmod(filepath.Join(lib(dir), paris), 0o646) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := installCopy(t)
			b, err := bundle.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := damage(dir); err != nil {
				t.Fatal(err)
			}
			if err := b.Verify(); !errors.Is(err, bundle.ErrMismatch) {
				t.Fatalf("Verify of a site layer %s: %v", name, err)
			}
			// Installing again repairs it.
			if err := bundle.Install(buildCopy(t), dir); err != nil {
				t.Fatal(err)
			}
			if err := b.Verify(); err != nil {
				t.Fatalf("after a new install: %v", err)
			}
		})
	}
}

// buildCopy copies the interpreter build's artifacts into a new directory, with a
// BUILDINFO: what Install takes.
func buildCopy(t *testing.T) string {
	t.Helper()
	src, build := bundletest.BuildDir(t), t.TempDir()
	for _, a := range []bundle.Artifact{bundle.Pinned().Wasm, bundle.Pinned().Stdlib, bundle.Pinned().Site} {
		copyFile(t, filepath.Join(src, a.Name), filepath.Join(build, a.Name))
	}
	os.WriteFile(filepath.Join(build, "BUILDINFO"), []byte("test\n"), 0o644)
	return build
}

func TestInstallAndOpen(t *testing.T) {
	dir := installCopy(t)
	b, err := bundle.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(); err != nil {
		t.Fatal(err)
	}
	// A manifest for another artifact is refused.
	raw, _ := os.ReadFile(filepath.Join(dir, bundle.ManifestName))
	os.WriteFile(filepath.Join(dir, bundle.ManifestName), []byte(strings.Replace(string(raw), bundle.Pinned().Version, "3.13.4", 1)), 0o644)
	if _, err := bundle.Open(dir); !errors.Is(err, bundle.ErrManifest) {
		t.Fatalf("foreign manifest: %v", err)
	}
	if _, err := bundle.Open(t.TempDir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("empty dir: %v", err)
	}
}

// A stale or damaged .cwasm is detected and rebuilt, never trusted: a flipped byte, a
// truncated file, a file built for another engine configuration, a missing sidecar.
func TestPrecompiledCache(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles python.wasm several times (about 5 s each)")
	}
	dir := installCopy(t)
	b, _ := bundle.Open(dir)
	eng := engine.New(engine.Options{})
	first, err := b.Precompiled(eng, dir)
	if err != nil || !first.Rebuilt {
		t.Fatalf("first build: %+v %v", first, err)
	}
	again, err := b.Precompiled(eng, dir)
	if err != nil || again.Rebuilt || again.Path != first.Path {
		t.Fatalf("a valid .cwasm was not reused: %+v %v", again, err)
	}
	good, _ := os.ReadFile(first.Path)
	// The check that accepted it left a stamp: the next check trusts the stamp
	// while the file is the same file. Each damage below rewrites the file in place
	// and keeps the stamp, which no longer matches it.
	if _, err := os.Stat(first.Path + ".verified"); err != nil {
		t.Fatalf("no stamp after a check: %v", err)
	}
	// What other keys left (older interpreters, bootstraps or libraries) is removed
	// when a .cwasm is made, but for the two newest; what another engine's key left
	// is kept.
	leftBy := func(key, fingerprint string, age time.Duration) string {
		p := filepath.Join(dir, bundle.PrecompiledName(key))
		os.WriteFile(p, []byte("old"), 0o644)
		side, _ := json.Marshal(bundle.Sidecar{Key: key, Fingerprint: fingerprint, Size: 3})
		os.WriteFile(p+".json", side, 0o644)
		os.Chtimes(p, time.Now().Add(-age), time.Now().Add(-age))
		return p
	}
	superseded := leftBy(strings.Repeat("a", 32), eng.Fingerprint(), 3*time.Hour)
	newer := []string{leftBy(strings.Repeat("c", 32), eng.Fingerprint(), 2*time.Hour),
		leftBy(strings.Repeat("d", 32), eng.Fingerprint(), time.Hour)}
	otherEngine := leftBy(strings.Repeat("b", 32), "another engine", 4*time.Hour)

	damage := map[string]func(p string){
		"flipped byte": func(p string) {
			b := append([]byte(nil), good...)
			b[len(b)/2] ^= 0x01
			os.WriteFile(p, b, 0o644)
		},
		"truncated": func(p string) { os.WriteFile(p, good[:len(good)-4096], 0o644) },
		"other key": func(p string) {
			// The fuel-metered engine's module and sidecar in this key's place.
			other, err := b.Precompile(engine.New(engine.Options{Fuel: true}), t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			copyFile(t, other, p)
			copyFile(t, other+".json", p+".json")
		},
		"no sidecar": func(p string) { os.Remove(p + ".json") },
		"group-writable": func(p string) {
			os.WriteFile(p, good, 0o644)
			os.Chmod(p, 0o664)
		},
	}
	for name, f := range damage {
		t.Run(name, func(t *testing.T) {
			f(first.Path)
			if err := bundle.CheckPrecompiled(eng, first.Path, first.Key); !errors.Is(err, bundle.ErrStale) {
				t.Fatalf("damage not detected: %v", err)
			}
			got, err := b.Precompiled(eng, dir)
			if err != nil || !got.Rebuilt || len(got.Stale) != 1 {
				t.Fatalf("not rebuilt: %+v %v", got, err)
			}
			if err := bundle.CheckPrecompiled(eng, got.Path, got.Key); err != nil {
				t.Fatalf("rebuilt module fails its check: %v", err)
			}
		})
	}
	if _, err := os.Stat(superseded); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a superseded .cwasm was kept: %v", err)
	}
	if _, err := os.Stat(superseded + ".json"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a superseded sidecar was kept: %v", err)
	}
	for _, p := range append(newer, otherEngine) {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(p), err)
		}
	}
}

// A bad .cwasm in a read-only bundle directory is replaced by one in the cache
// directory, and the bundle's own is used again once it is valid.
func TestPrecompiledFallsBackToCacheDir(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles python.wasm (about 5 s)")
	}
	b := bundletest.Open(t)
	eng := engine.New(engine.Options{})
	pre, err := b.Precompiled(eng, b.Dir)
	if err != nil {
		t.Fatal(err)
	}
	dir := installCopy(t)
	copyFile(t, pre.Path, filepath.Join(dir, filepath.Base(pre.Path)))
	os.WriteFile(filepath.Join(dir, filepath.Base(pre.Path))+".json", []byte("{}"), 0o644)
	nb, _ := bundle.Open(dir)
	cache := t.TempDir()
	got, err := nb.Precompiled(eng, cache)
	if err != nil || !got.Rebuilt || filepath.Dir(got.Path) != cache {
		t.Fatalf("%+v %v", got, err)
	}
}

func TestKey(t *testing.T) {
	a := bundle.Key("wasmtime=39.0.1 fuel=0", bundle.Pinned().Wasm.SHA256)
	if a == bundle.Key("wasmtime=39.0.1 fuel=1", bundle.Pinned().Wasm.SHA256) || a == bundle.Key("wasmtime=39.0.1 fuel=0", strings.Repeat("0", 64)) {
		t.Fatal("key ignores an input")
	}
	if len(a) != 32 {
		t.Fatalf("key %q", a)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A compressed .cwasm (the OCI image's) is unpacked into the cache directory and
// checked there; damaged, it is never used: the module is compiled instead.
func TestCompressedPrecompiled(t *testing.T) {
	b := bundletest.Open(t)
	eng := engine.New(engine.Options{})
	pre, err := b.Precompiled(eng, b.Dir)
	if err != nil {
		t.Fatal(err)
	}
	dir := installCopy(t)
	copyFile(t, pre.Path+".json", filepath.Join(dir, filepath.Base(pre.Path))+".json")
	// As `make image-root` does with the zstd command.
	code, _ := os.ReadFile(pre.Path)
	zw, _ := zstd.NewWriter(nil)
	gz := filepath.Join(dir, bundle.CompressedName(pre.Key))
	if err := os.WriteFile(gz, zw.EncodeAll(code, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	nb, _ := bundle.Open(dir)
	cache := t.TempDir()
	got, err := nb.Precompiled(eng, cache)
	if err != nil || !got.Unpacked || got.Rebuilt || filepath.Dir(got.Path) != cache {
		t.Fatalf("not unpacked into the cache: %+v %v", got, err)
	}
	if a, b := fileSHA256(t, got.Path), fileSHA256(t, pre.Path); a != b {
		t.Fatalf("unpacked sha256 %s, want %s", a, b)
	}
	// Next start: the cache's copy is used as it is.
	if again, err := nb.Precompiled(eng, cache); err != nil || again.Unpacked || again.Rebuilt {
		t.Fatalf("cached copy not reused: %+v %v", again, err)
	}

	// A compressed file whose contents differ from the sidecar is refused.
	raw, _ := os.ReadFile(gz)
	raw[len(raw)/2] ^= 0x40
	os.WriteFile(gz, raw, 0o644)
	if _, err := nb.Unpack(eng, pre.Key, t.TempDir()); !errors.Is(err, bundle.ErrStale) {
		t.Fatalf("damaged compressed .cwasm: %v", err)
	}
	if testing.Short() {
		return
	}
	fresh := t.TempDir()
	got, err = nb.Precompiled(eng, fresh)
	if err != nil || got.Unpacked || !got.Rebuilt || len(got.Stale) != 1 {
		t.Fatalf("damaged compressed .cwasm not replaced by a compile: %+v %v", got, err)
	}
}

func fileSHA256(t *testing.T, p string) string {
	t.Helper()
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// A snapshot is a function of python.wasm, the library, the bootstrap and the hash
// seed: made twice, the same bytes (nothing of the time or the random source it was
// made with is in it).
func TestSnapshotIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("makes two snapshots (compiles python.wasm, about 5 s each)")
	}
	b := bundletest.Open(t)
	first, err := b.SnapshotWasm(engine.New(engine.Options{}), 0)
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.SnapshotWasm(engine.New(engine.Options{Fuel: true}), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, again) {
		t.Fatalf("two seed-0 snapshots differ: sha256 %x and %x", sha256.Sum256(first), sha256.Sum256(again))
	}
}
