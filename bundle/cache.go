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
	"sort"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Compiler is what the .cwasm cache needs from the engine; sandbox/engine.Engine
// implements it.
type Compiler interface {
	// Fingerprint names the engine configuration compiled code depends on.
	Fingerprint() string
	// Precompile compiles a module's bytes to the engine's serialized form.
	Precompile(wasm []byte) ([]byte, error)
	// Snapshot initialises the reactor wasm with argv, the host directory lib
	// preopened read-only at guestLib, and returns the module rewritten to start
	// in the state its initialisation left.
	Snapshot(wasm []byte, lib, guestLib string, argv []string) ([]byte, error)
	// Check loads the .cwasm at path, proving the engine accepts it on this host.
	Check(path string) error
}

// Sidecar is the JSON file written beside each .cwasm. It records what the .cwasm was
// compiled from and for, and the size and SHA-256 of the .cwasm itself.
type Sidecar struct {
	Key         string `json:"key"`
	Fingerprint string `json:"fingerprint"`
	WasmSHA256  string `json:"wasm_sha256"`
	// BootstrapSHA256 is the SHA-256 of the bootstrap the snapshot ran.
	BootstrapSHA256 string `json:"bootstrap_sha256"`
	// HashSeed is the snapshot's hash seed (see HashSeedName).
	HashSeed uint32 `json:"hash_seed"`
	Size     int64  `json:"size"`
	SHA256   string `json:"sha256"`
}

// ErrStale is wrapped by CheckPrecompiled when a .cwasm cannot be trusted: no
// sidecar, another key, another size or SHA-256, or the engine refuses it.
var ErrStale = errors.New("bundle: precompiled module is stale or damaged")

// Key is the cache key of a .cwasm: the first 32 hex digits of the SHA-256 of the
// engine fingerprint, the python.wasm SHA-256, and the SHA-256s of what the
// snapshot also depends on (this build's bootstrap, the pinned standard library).
func Key(fingerprint, wasmSHA256 string) string {
	sum := sha256.Sum256([]byte(fingerprint + "\x00" + wasmSHA256 + "\x00" + hashBytes([]byte(bootstrap)) +
		"\x00" + Pinned().Stdlib.SHA256))
	return hex.EncodeToString(sum[:16])
}

// CheckpointKey names what a session's checkpoint (its interpreter's memory)
// needs to run again: this build's python.wasm, bootstrap and standard library,
// as Key without the engine (a checkpoint is WebAssembly state, which any engine
// version restores). 32 hex digits.
func CheckpointKey() string { return Key("", Pinned().Wasm.SHA256) }

// PrecompiledName is the file name of the .cwasm for key.
func PrecompiledName(key string) string { return "python-" + key + ".cwasm" }

// CompressedName is the file name of the zstd-compressed .cwasm for key, which a
// bundle may ship instead of the .cwasm (the OCI image does, to stay small: `zstd
// -19` makes 30 MB 8.7 MB); its sidecar is the .cwasm's, PrecompiledName(key)+".json",
// describing the uncompressed bytes. Precompiled unpacks it into the cache directory.
func CompressedName(key string) string { return PrecompiledName(key) + ".zst" }

// Precompiled says where the usable .cwasm is and how it was found.
type Precompiled struct {
	// Path is the .cwasm to pass to workers.
	Path string
	// Key is its cache key.
	Key string
	// Unpacked is true when it was decompressed just now from the bundle's
	// CompressedName(Key).
	Unpacked bool
	// Rebuilt is true when it was compiled just now; Stale then says why the
	// existing files were not used.
	Rebuilt bool
	Stale   []string
}

// Precompiled returns a .cwasm for c that passes CheckPrecompiled: the bundle
// directory's own, else cacheDir's, else one decompressed from the bundle's
// CompressedName into cacheDir, else a new one compiled from the verified
// python.wasm into cacheDir (which may be the bundle directory). Compiling takes
// seconds; results are written atomically, so concurrent callers are safe.
func (b *Bundle) Precompiled(c Compiler, cacheDir string) (Precompiled, error) {
	key := Key(c.Fingerprint(), Pinned().Wasm.SHA256)
	out := Precompiled{Key: key}
	dirs := []string{b.Dir}
	if cacheDir != "" && filepath.Clean(cacheDir) != filepath.Clean(b.Dir) {
		dirs = append(dirs, cacheDir)
	} else {
		cacheDir = b.Dir
	}
	for _, d := range dirs {
		p := filepath.Join(d, PrecompiledName(key))
		err := CheckPrecompiled(c, p, key)
		if err == nil {
			out.Path = p
			return out, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			out.Stale = append(out.Stale, err.Error())
		}
	}
	if _, err := os.Stat(filepath.Join(b.Dir, CompressedName(key))); err == nil {
		p, err := b.Unpack(c, key, cacheDir)
		if err == nil {
			out.Path, out.Unpacked = p, true
			return out, nil
		}
		out.Stale = append(out.Stale, err.Error())
	}
	p, err := b.Precompile(c, cacheDir)
	if err != nil {
		return out, err
	}
	out.Path, out.Rebuilt = p, true
	return out, nil
}

// maxPrecompiled bounds a sidecar's size field: no .cwasm of ours comes near it.
const maxPrecompiled = 1 << 30

// Unpack decompresses the bundle's CompressedName(key) into dir as
// PrecompiledName(key) with its sidecar, checking the bytes against the bundle's
// sidecar before they are renamed into place, and returns the .cwasm's path after
// CheckPrecompiled accepts it. Errors wrap ErrStale.
func (b *Bundle) Unpack(c Compiler, key, dir string) (string, error) {
	name := CompressedName(key)
	src := filepath.Join(b.Dir, PrecompiledName(key))
	side, err := os.ReadFile(src + ".json")
	if err != nil {
		return "", fmt.Errorf("%w: %s: no sidecar: %v", ErrStale, name, err)
	}
	var sc Sidecar
	if err := json.Unmarshal(side, &sc); err != nil || sc.Key != key || sc.Size <= 0 || sc.Size > maxPrecompiled {
		return "", fmt.Errorf("%w: %s: bad sidecar", ErrStale, name)
	}
	f, err := os.Open(filepath.Join(b.Dir, name))
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrStale, name, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || checkOwner(st) != nil {
		return "", fmt.Errorf("%w: %s is writable by others or owned by another user", ErrStale, name)
	}
	zr, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrStale, name, err)
	}
	defer zr.Close()
	code, err := io.ReadAll(io.LimitReader(zr, sc.Size+1))
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrStale, name, err)
	}
	if int64(len(code)) != sc.Size || hashBytes(code) != sc.SHA256 {
		return "", fmt.Errorf("%w: %s: its contents do not match the sidecar", ErrStale, name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("bundle: create %s: %w", dir, err)
	}
	p := filepath.Join(dir, PrecompiledName(key))
	// Sidecar last, as in Precompile.
	if err := writeAtomic(p, code, 0o644); err != nil {
		return "", err
	}
	if err := writeAtomic(p+".json", side, 0o644); err != nil {
		return "", err
	}
	if err := CheckPrecompiled(c, p, key); err != nil {
		return "", err
	}
	pruneSuperseded(dir, sc.Fingerprint, key)
	return p, nil
}

// Precompile makes the snapshot of the bundle's python.wasm (SnapshotWasm, with the
// hash seed of dir, see HashSeed), compiles it for c into dir and writes its
// sidecar. It returns the .cwasm's path.
func (b *Bundle) Precompile(c Compiler, dir string) (string, error) {
	wasm, err := os.ReadFile(b.WasmPath())
	if err != nil {
		return "", fmt.Errorf("bundle: read %s: %w", Pinned().Wasm.Name, err)
	}
	// The bytes we compile are the bytes we hash: a file swapped after Open is caught.
	if sum := hashBytes(wasm); sum != Pinned().Wasm.SHA256 {
		return "", fmt.Errorf("%w: %s: sha256 %s, expected %s", ErrMismatch, Pinned().Wasm.Name, sum, Pinned().Wasm.SHA256)
	}
	// The directory first: compiling takes seconds, wasted if the result has nowhere to go.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("bundle: create %s: %w", dir, err)
	}
	seed, err := HashSeed(dir)
	if err != nil {
		return "", err
	}
	snap, err := b.snapshot(c, wasm, seed)
	if err != nil {
		return "", err
	}
	code, err := c.Precompile(snap)
	if err != nil {
		return "", err
	}
	key := Key(c.Fingerprint(), Pinned().Wasm.SHA256)
	sc := Sidecar{Key: key, Fingerprint: c.Fingerprint(), WasmSHA256: Pinned().Wasm.SHA256,
		BootstrapSHA256: hashBytes([]byte(bootstrap)), HashSeed: seed, Size: int64(len(code)), SHA256: hashBytes(code)}
	side, err := json.MarshalIndent(sc, "", "  ")
	if err != nil {
		return "", fmt.Errorf("bundle: encode sidecar: %w", err)
	}
	p := filepath.Join(dir, PrecompiledName(key))
	// Sidecar last: a .cwasm without its matching sidecar is never trusted.
	if err := writeAtomic(p, code, 0o644); err != nil {
		return "", err
	}
	if err := writeAtomic(p+".json", append(side, '\n'), 0o644); err != nil {
		return "", err
	}
	pruneSuperseded(dir, sc.Fingerprint, key)
	return p, nil
}

// keepSuperseded is how many superseded .cwasm files pruneSuperseded leaves (the
// newest): two builds or versions that share a cache directory (the CLI's, during
// an upgrade) would otherwise remove each other's and recompile (10 s) in turn.
const keepSuperseded = 2

// pruneSuperseded removes from dir the .cwasm files (with their sidecars and stamps)
// that key's has replaced, past the keepSuperseded newest: those of the same engine
// fingerprint under another key (another interpreter, bootstrap or library), each
// about 40 MB, which would otherwise pile up at every upgrade. One a bundle ships
// compressed keeps its sidecar. Workers that run an old one hold a sealed copy of it
// (see package sandbox), so removing it ends nothing. Best effort.
func pruneSuperseded(dir, fingerprint, key string) {
	paths, _ := filepath.Glob(filepath.Join(dir, PrecompiledName("*")))
	type old struct {
		path, key string
		mtime     time.Time
	}
	var olds []old
	for _, p := range paths {
		if p == filepath.Join(dir, PrecompiledName(key)) {
			continue
		}
		raw, err := os.ReadFile(p + ".json")
		var sc Sidecar
		st, serr := os.Lstat(p)
		if err != nil || serr != nil || json.Unmarshal(raw, &sc) != nil || sc.Fingerprint != fingerprint {
			continue
		}
		olds = append(olds, old{p, sc.Key, st.ModTime()})
	}
	sort.Slice(olds, func(i, j int) bool { return olds[i].mtime.After(olds[j].mtime) })
	for _, o := range olds[min(keepSuperseded, len(olds)):] {
		os.Remove(o.path)
		os.Remove(o.path + ".verified")
		if _, err := os.Stat(filepath.Join(dir, CompressedName(o.key))); err != nil {
			os.Remove(o.path + ".json")
		}
	}
}

// checkOwner refuses a file that another user could have written: it must be owned
// by root or by this process's user and not be writable by group or others. The
// sidecar's hash only detects damage; these checks keep out a writer who could forge
// both files. (The same rule as OpenSSH's StrictModes.)
func checkOwner(st os.FileInfo) error {
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("mode %v is writable by group or others", st.Mode().Perm())
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid != 0 && int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("owned by uid %d, not root or this user", sys.Uid)
	}
	return nil
}

// CheckPrecompiled verifies the .cwasm at path for key: it, its sidecar and their
// directory are owned by root or this user and writable by no one else, the sidecar names key, the file
// has the recorded size and SHA-256, and c loads it. Errors wrap ErrStale, or
// fs.ErrNotExist when the .cwasm does not exist.
func CheckPrecompiled(c Compiler, path, key string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("bundle: %w", err)
	}
	defer f.Close()
	side, err := os.Open(path + ".json")
	if err != nil {
		return fmt.Errorf("%w: %s: no sidecar: %v", ErrStale, filepath.Base(path), err)
	}
	defer side.Close()
	if st, err := side.Stat(); err != nil || checkOwner(st) != nil {
		return fmt.Errorf("%w: %s: sidecar is writable by others or owned by another user", ErrStale, filepath.Base(path))
	}
	raw, err := io.ReadAll(io.LimitReader(side, 64<<10))
	if err != nil {
		return fmt.Errorf("%w: %s: sidecar: %v", ErrStale, filepath.Base(path), err)
	}
	var sc Sidecar
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc); err != nil {
		return fmt.Errorf("%w: %s: bad sidecar: %v", ErrStale, filepath.Base(path), err)
	}
	if sc.Key != key || sc.Key != Key(sc.Fingerprint, sc.WasmSHA256) {
		return fmt.Errorf("%w: %s: sidecar key %s, expected %s", ErrStale, filepath.Base(path), sc.Key, key)
	}
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("bundle: stat %s: %w", path, err)
	}
	if err := checkOwner(st); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrStale, filepath.Base(path), err)
	}
	if dst, err := os.Stat(filepath.Dir(path)); err != nil || checkOwner(dst) != nil {
		return fmt.Errorf("%w: %s: its directory is writable by others or owned by another user", ErrStale, filepath.Base(path))
	}
	if st.Size() != sc.Size {
		return fmt.Errorf("%w: %s: size %d, sidecar says %d", ErrStale, filepath.Base(path), st.Size(), sc.Size)
	}
	if stampHolds(path, sc, st) {
		return nil
	}
	sum, err := hashReader(f)
	if err != nil {
		return fmt.Errorf("bundle: read %s: %w", path, err)
	}
	if sum != sc.SHA256 {
		return fmt.Errorf("%w: %s: sha256 %s, sidecar says %s", ErrStale, filepath.Base(path), sum, sc.SHA256)
	}
	if err := c.Check(path); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrStale, filepath.Base(path), err)
	}
	writeStamp(path, sc, st)
	return nil
}

// A stamp (PATH.verified, beside a .cwasm) records that the .cwasm at PATH, as the
// file it was then (device, inode, size, modification and change times), had its
// sidecar's SHA-256 and loaded. While the file is still that file, CheckPrecompiled
// trusts the stamp instead of hashing 40 MB and loading it again (about 30 ms of
// every `sandcell run`). Any write, truncation, chmod or replacement of the file
// changes its change time or inode, which no one but root can set back; the stamp,
// the file and their directory pass checkOwner like the sidecar, so only this user
// or root could forge one, and either could as well rewrite the file and its
// sidecar. A stamp that cannot be written (a read-only bundle) is only a cost.
type stamp struct {
	Key     string `json:"key"`
	SHA256  string `json:"sha256"`
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
	CtimeNS int64  `json:"ctime_ns"`
}

// stampOf is the stamp of a .cwasm with sidecar sc and stat st.
func stampOf(sc Sidecar, st os.FileInfo) (stamp, bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return stamp{}, false
	}
	return stamp{Key: sc.Key, SHA256: sc.SHA256, Dev: uint64(sys.Dev), Ino: sys.Ino, Size: sys.Size,
		MtimeNS: sys.Mtim.Nano(), CtimeNS: sys.Ctim.Nano()}, true
}

// stampHolds reports whether path's stamp matches the file as st shows it now.
func stampHolds(path string, sc Sidecar, st os.FileInfo) bool {
	want, ok := stampOf(sc, st)
	if !ok {
		return false
	}
	f, err := os.Open(path + ".verified")
	if err != nil {
		return false
	}
	defer f.Close()
	if fst, err := f.Stat(); err != nil || checkOwner(fst) != nil {
		return false
	}
	var got stamp
	dec := json.NewDecoder(io.LimitReader(f, 4<<10))
	dec.DisallowUnknownFields()
	return dec.Decode(&got) == nil && got == want
}

// writeStamp records that path, as st shows it, was verified (best effort).
func writeStamp(path string, sc Sidecar, st os.FileInfo) {
	if s, ok := stampOf(sc, st); ok {
		if b, err := json.Marshal(s); err == nil {
			writeAtomic(path+".verified", append(b, '\n'), 0o644)
		}
	}
}
