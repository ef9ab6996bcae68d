// Package bundle pins the Python interpreter Sandcell runs and manages its
// precompiled form (.cwasm).
//
// The interpreter is CPython built for WASI from Debian's sources by
// bundle/interpreter (see its README): a python.wasm and its standard library as one
// stored zip. Pinned describes it: versions, sizes, SHA-256s, sources and licences
// are constants, so a binary accepts only the interpreter it was built for. A bundle
// directory holds:
//
//	python.wasm                  the interpreter, checked against Pinned.Wasm
//	lib/python313.zip            the standard library, checked against Pinned.Stdlib
//	lib/python3.13/lib-dynload/  empty: CPython's landmark for its exec_prefix
//	lib/python3.13/site-packages/  the site layer's libraries (unpacked site.zip)
//	lib/zoneinfo/                the site layer's IANA time zone database (site.zip,
//	                             checked against Pinned.Site, unpacked; the files are
//	                             checked against Pinned.SiteTree)
//	MANIFEST                     JSON: the Interpreter the directory was installed from
//	BUILDINFO, LICENSE.*         how it was built; the licences of what it contains
//	python-<key>.cwasm(.json)    the snapshot precompiled for one engine configuration
//	hash-seed                    the hash seed of the snapshots compiled here
//
// python.wasm is a WASI reactor. What workers run is its snapshot (snapshot.go):
// python.wasm initialised once with bootstrap.py and a hash seed, its memory and
// globals written back into the module, then precompiled. Workers see lib/ read-only
// at /usr/local/lib, where the interpreter looks for its library, and its zoneinfo
// at /usr/share/zoneinfo, where zoneinfo, dateutil and pytz look. The .cwasm cache
// key covers the wasmtime version, the engine configuration, the target, the
// python.wasm hash and what the snapshot also depends on (Key). This package does
// not import wasmtime: the engine is passed in as a Compiler.
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

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// Artifact describes one pinned file.
type Artifact struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Source is one pinned input of the interpreter build.
type Source struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// Interpreter describes a pinned interpreter build.
type Interpreter struct {
	// Version is the CPython version, e.g. "3.13.5".
	Version string `json:"version"`
	// Build names how it was built: compiler, flags, target.
	Build string `json:"build"`
	// Wasm is python.wasm; Stdlib is the standard library zip.
	Wasm   Artifact `json:"wasm"`
	Stdlib Artifact `json:"stdlib"`
	// Sources are the upstream tarballs (as Debian ships them) it was built from.
	Sources []Source `json:"sources"`
	// Licenses names the licence of each part; the texts ship as LICENSE.* files.
	Licenses []string `json:"licenses"`
	// Site is the site layer: the pure-Python libraries a run finds on sys.path
	// (site-packages) and the IANA time zone database, one stored zip
	// (bundle/interpreter/build-site.sh) installed unpacked into LibDir.
	Site Artifact `json:"site"`
	// SiteTree is the digest of the site layer unpacked: the SHA-256 of the sorted
	// list of its directories ("NAME/\n") and files ("NAME SIZE SHA256\n"), NAME
	// relative to LibDir, SHA256 in hex.
	SiteTree string `json:"site_tree"`
	// SitePackages are the Debian packages the site layer is made of (its
	// site-recipe.sh pins them); their copyright files ship as LICENSE.<package>.
	SitePackages []Source `json:"site_packages"`
}

// Pinned is the interpreter this build accepts: CPython 3.13.5 for wasm32-wasip1 at
// -O3 with zlib, bz2, lzma and sqlite3, built reproducibly by
// bundle/interpreter/build.sh from the sources listed (its recipe.sh pins them).
func Pinned() Interpreter {
	return Interpreter{
		Version: "3.13.5",
		Build:   "clang 19.1.7 -O3 -DNDEBUG, wasi-libc 0.0~git20241209.574b88d-2, wasm32-wasip1, Debian trixie",
		Wasm: Artifact{
			Name:   "python.wasm",
			Size:   wasmSize,
			SHA256: wasmSHA256,
		},
		Stdlib: Artifact{
			Name:   "python313.zip",
			Size:   stdlibSize,
			SHA256: stdlibSHA256,
		},
		Sources: []Source{
			{"python3.13_3.13.5.orig.tar.xz", "93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640"},
			{"zlib_1.3.dfsg+really1.3.1.orig.tar.gz", "60dd315c07f616887caa029408308a018ace66e3d142726a97db164b3b8f69fb"},
			{"sqlite3_3.46.1.orig.tar.xz", "d0cdd2ece271b29e7ce18095745d892517ee26d0f270065b3a25c2e9eb11639c"},
			{"bzip2_1.0.8.orig.tar.gz", "ab5a03176ee106d3f0fa90e381da478ddae405918153cca248e682cd0c4a2269"},
			{"xz-utils_5.8.1.orig.tar.xz", "0b54f79df85912504de0b14aec7971e3f964491af1812d83447005807513cd9e"},
		},
		Licenses: []string{"PSF-2.0 (CPython)", "Zlib (zlib)", "blessing (SQLite, public domain)", "bzip2-1.0.6 (bzip2)", "0BSD (liblzma)",
			"site layer, as each package's Debian copyright file (LICENSE.<package>) states: public domain (tzdata), " +
				"BSD-3-Clause (dateutil, xlrd, babel and its locale data, isodate), MIT (pytz, six, openpyxl, et_xmlfile, petl, tabulate, " +
				"agate, leather, slugify, pytimeparse), Apache-2.0 (parsedatetime), Artistic-1.0-Perl OR GPL-1.0-or-later (text_unidecode)"},
		Site: Artifact{
			Name:   "site.zip",
			Size:   siteSize,
			SHA256: siteSHA256,
		},
		SiteTree:     siteTreeSHA256,
		SitePackages: sitePackages(),
	}
}

// Files of a bundle directory.
const (
	ManifestName = "MANIFEST"
	// LibDir is the directory the guest sees read-only at GuestLibDir.
	LibDir = "lib"
	// GuestLibDir is where the interpreter looks for its library (prefix /usr/local).
	GuestLibDir = protocol.GuestLibDir
	// GuestExecutable is the interpreter's argv[0]: CPython finds its library by
	// searching upwards from the executable's directory.
	GuestExecutable = "/usr/local/bin/python"
	dynloadDir      = "python3.13/lib-dynload"
	// SitePackagesDir, within LibDir, holds the site layer's libraries: the guest
	// finds them last on sys.path, at /usr/local/lib/python3.13/site-packages (an
	// isolated program, the daemon's own, does not).
	SitePackagesDir = "python3.13/site-packages"
	// ZoneDir, within LibDir, holds the site layer's IANA time zone database; the
	// guest sees it at protocol.GuestZoneDir too.
	ZoneDir = protocol.LibZoneDir
)

// Errors returned by this package; match them with errors.Is.
var (
	// ErrMismatch: a file's size or SHA-256 differs from the pinned value.
	ErrMismatch = errors.New("bundle: artifact does not match the pinned hash")
	// ErrManifest: MANIFEST is missing, unreadable, or describes another interpreter.
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

// Install verifies the interpreter build in src (python.wasm, python313.zip, site.zip,
// and the BUILDINFO and LICENSE.* files beside them) against Pinned and installs it
// with its MANIFEST into dir, creating dir if needed: site.zip unpacked into LibDir
// (each of its directories replaced whole, once the unpacked files match
// Pinned.SiteTree), the other files replaced atomically. Nothing is written when an
// artifact does not match.
func Install(src, dir string) error {
	wasm, err := readVerified(Pinned().Wasm, filepath.Join(src, Pinned().Wasm.Name))
	if err != nil {
		return err
	}
	stdlib, err := readVerified(Pinned().Stdlib, filepath.Join(src, Pinned().Stdlib.Name))
	if err != nil {
		return err
	}
	site, err := readVerified(Pinned().Site, filepath.Join(src, Pinned().Site.Name))
	if err != nil {
		return err
	}
	manifest, err := json.MarshalIndent(Pinned(), "", "  ")
	if err != nil {
		return fmt.Errorf("bundle: encode manifest: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, LibDir, dynloadDir), 0o755); err != nil {
		return fmt.Errorf("bundle: create %s: %w", dir, err)
	}
	if err := unpackSite(site, filepath.Join(dir, LibDir)); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, Pinned().Wasm.Name), wasm, 0o644); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, LibDir, Pinned().Stdlib.Name), stdlib, 0o644); err != nil {
		return err
	}
	if err := pruneLib(filepath.Join(dir, LibDir)); err != nil {
		return err
	}
	extras, _ := filepath.Glob(filepath.Join(src, "LICENSE.*"))
	for _, p := range append(extras, filepath.Join(src, "BUILDINFO")) {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("bundle: %w", err)
		}
		if err := writeAtomic(filepath.Join(dir, filepath.Base(p)), b, 0o644); err != nil {
			return err
		}
	}
	return writeAtomic(filepath.Join(dir, ManifestName), append(manifest, '\n'), 0o644)
}

// readVerified reads the file at path and checks the bytes it read against a.
func readVerified(a Artifact, path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	if int64(len(b)) != a.Size {
		return nil, fmt.Errorf("%w: %s: size %d bytes, expected %d", ErrMismatch, a.Name, len(b), a.Size)
	}
	if sum := hashBytes(b); sum != a.SHA256 {
		return nil, fmt.Errorf("%w: %s: sha256 %s, expected %s", ErrMismatch, a.Name, sum, a.SHA256)
	}
	return b, nil
}

// Bundle is an opened bundle directory whose MANIFEST names the pinned interpreter.
type Bundle struct {
	// Dir is the bundle directory.
	Dir string
}

// Open checks that dir holds a MANIFEST that describes the pinned interpreter. It
// does not hash the artifacts: Verify does, and so does Precompile before compiling,
// so the interpreter is checked whenever its bytes are used. Errors wrap ErrManifest,
// or fs.ErrNotExist when the bundle was never installed (run `make bundle`).
func Open(dir string) (*Bundle, error) {
	raw, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	var m Interpreter
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	if m.Version != Pinned().Version || m.Wasm != Pinned().Wasm || m.Stdlib != Pinned().Stdlib || m.Site != Pinned().Site || m.SiteTree != Pinned().SiteTree {
		return nil, fmt.Errorf("%w: it names CPython %s python.wasm sha256 %s, site layer %s, this build pins CPython %s sha256 %s, site layer %s (reinstall the bundle)",
			ErrManifest, m.Version, m.Wasm.SHA256, m.SiteTree, Pinned().Version, Pinned().Wasm.SHA256, Pinned().SiteTree)
	}
	return &Bundle{Dir: dir}, nil
}

// Verify checks the bundle's python.wasm, standard library and site layer against
// Pinned (the site layer's files by their digest: the same names, the same bytes,
// nothing else). A difference wraps ErrMismatch.
func (b *Bundle) Verify() error {
	if err := Pinned().Wasm.Verify(b.WasmPath()); err != nil {
		return err
	}
	if err := Pinned().Stdlib.Verify(filepath.Join(b.LibPath(), Pinned().Stdlib.Name)); err != nil {
		return err
	}
	return verifySite(b.LibPath())
}

// WasmPath is the path of python.wasm.
func (b *Bundle) WasmPath() string { return filepath.Join(b.Dir, Pinned().Wasm.Name) }

// LibPath is the host directory to preopen read-only at GuestLibDir.
func (b *Bundle) LibPath() string { return filepath.Join(b.Dir, LibDir) }

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
