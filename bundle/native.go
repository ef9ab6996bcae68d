package bundle

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// The native backend's root file system (see bundle/native): Debian trixie's
// CPython with its scientific stack, extracted from pinned packages. In a bundle
// directory it is NativeDir, holding NativeRootDir (the files) and NativeManifest
// (one line per entry: path, type, mode, size, SHA-256 or link target), whose own
// SHA-256 is pinned in this build (nativeManifestSHA256). It is optional: a bundle
// without it serves the wasm backend alone.
const (
	NativeDir      = "native"
	NativeRootDir  = "rootfs"
	NativeManifest = "MANIFEST"
)

// ErrNoNative is returned by OpenNative for a bundle without a native root.
var ErrNoNative = errors.New("bundle: no native root (make native installs one)")

// NativeRoot is a verified native root.
type NativeRoot struct {
	// Dir is the root file system's directory.
	Dir string
	// ManifestSHA256 is the hex SHA-256 of its manifest (the pinned one).
	ManifestSHA256 string
	// Entries is the number of files, directories and links; Bytes the files' size.
	Entries int
	Bytes   int64
}

// NativeManifestSHA256 returns the pinned digest of the native root's manifest.
func NativeManifestSHA256() string { return nativeManifestSHA256 }

// OpenNative verifies the native root of the bundle in dir and returns it: the
// manifest must have the pinned digest, and the root must hold exactly its entries,
// each of its type and permission bits (no set-id, sticky only where listed), files
// of its size and SHA-256, links to its target, every entry owned by root or by this
// process's user. It reads every file (about 400 MB, hashed on every CPU). A bundle
// without the native part gives ErrNoNative; any difference is an error naming the
// first entries that differ, expected and actual.
func OpenNative(dir string) (*NativeRoot, error) { return openNative(dir, nativeManifestSHA256) }

// openNative is OpenNative with the manifest's digest pinned.
func openNative(dir, pinned string) (*NativeRoot, error) {
	base := filepath.Join(dir, NativeDir)
	manifest, err := os.ReadFile(filepath.Join(base, NativeManifest))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoNative
	}
	if err != nil {
		return nil, fmt.Errorf("bundle: native manifest: %w", err)
	}
	if got := hashBytes(manifest); got != pinned {
		return nil, fmt.Errorf("bundle: native manifest: SHA-256 %s, pinned %s (a root built from other packages or by another recipe)", got, pinned)
	}
	want, err := parseManifest(manifest)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(base, NativeRootDir)
	n := &NativeRoot{Dir: root, ManifestSHA256: pinned, Entries: len(want)}
	if err := checkTree(root, want, n); err != nil {
		return nil, fmt.Errorf("bundle: native root %s: %w", root, err)
	}
	return n, nil
}

// nativeStamp is the name, in NativeDir, of the record of the last full
// verification: the manifest's digest and the stat digest (see statDigest) of the
// root as it was then.
const nativeStamp = "VERIFIED"

// OpenNativeStamped is OpenNative for a daemon's start and the CLI's runs: a root
// whose every entry has the same device, inode, type, permissions, size and times
// (the change time included, which any write or chmod moves and no unprivileged
// caller can set back) as when OpenNative last verified it whole, recorded in
// NativeDir/VERIFIED where the bundle directory is writable, is not read again
// (about 60 ms of stat calls instead of hashing 570 MB). Any difference, or no
// record, verifies it whole and records it.
func OpenNativeStamped(dir string) (*NativeRoot, error) {
	return openNativeStamped(dir, nativeManifestSHA256)
}

func openNativeStamped(dir, pinned string) (*NativeRoot, error) {
	base := filepath.Join(dir, NativeDir)
	root := filepath.Join(base, NativeRootDir)
	before, entries, size, statErr := statDigest(root)
	if statErr == nil {
		if rec, err := os.ReadFile(filepath.Join(base, nativeStamp)); err == nil && string(rec) == pinned+" "+before+"\n" {
			if st, err := os.Stat(filepath.Join(base, nativeStamp)); err == nil && checkOwner(st) == nil {
				return &NativeRoot{Dir: root, ManifestSHA256: pinned, Entries: entries, Bytes: size}, nil
			}
		}
	}
	n, err := openNative(dir, pinned)
	if err != nil || statErr != nil {
		return n, err
	}
	// The digest taken before the whole verification: an entry changed while it
	// ran has another change time, and is verified again next time.
	writeAtomic(filepath.Join(base, nativeStamp), []byte(pinned+" "+before+"\n"), 0o644)
	return n, nil
}

// statDigest is the SHA-256 of every entry of the tree at root as lstat(2) sees
// it (path, device, inode, mode, size, change and modification times), with the
// number of entries and the files' total size.
func statDigest(root string) (string, int, int64, error) {
	h := sha256.New()
	entries, size := 0, int64(0)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return errors.New("no stat")
		}
		entries++
		if info.Mode().IsRegular() {
			size += info.Size()
		}
		fmt.Fprintf(h, "%s\t%d\t%d\t%o\t%d\t%d\t%d\n", p, st.Dev, st.Ino, st.Mode, st.Size, st.Ctim.Nano(), st.Mtim.Nano())
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), entries, size, err
}

// manifestEntry is one line of a manifest.
type manifestEntry struct {
	kind byte // 'd', 'f' or 'l'
	mode fs.FileMode
	size int64
	sum  string // SHA-256 (f) or link target (l)
}

func parseManifest(b []byte) (map[string]manifestEntry, error) {
	out := map[string]manifestEntry{}
	for i, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		f := strings.Split(string(line), "\t")
		if len(f) != 5 || len(f[1]) != 1 || !strings.Contains("dfl", f[1]) {
			return nil, fmt.Errorf("bundle: native manifest line %d: not path, type, mode, size, hash", i+1)
		}
		mode, err1 := strconv.ParseUint(f[2], 8, 32)
		size, err2 := strconv.ParseInt(f[3], 10, 64)
		if err1 != nil || err2 != nil || mode > 0o7777 {
			return nil, fmt.Errorf("bundle: native manifest line %d: bad mode or size", i+1)
		}
		out[f[0]] = manifestEntry{kind: f[1][0], mode: fs.FileMode(mode), size: size, sum: f[4]}
	}
	return out, nil
}

// checkTree compares the tree at root with want, hashing files on every CPU.
func checkTree(root string, want map[string]manifestEntry, n *NativeRoot) error {
	var (
		mu     sync.Mutex
		diffs  []string
		files  = make(chan [2]string) // path on disk, manifest path
		wg     sync.WaitGroup
		seen   = map[string]bool{}
		uid    = os.Getuid()
		differ = func(format string, a ...any) {
			mu.Lock()
			diffs = append(diffs, fmt.Sprintf(format, a...))
			mu.Unlock()
		}
		workers = max(runtime.GOMAXPROCS(0), 1)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range files {
				got, err := hashFile(f[0])
				if err != nil {
					differ("%s: %v", f[1], err)
				} else if w := want[f[1]].sum; got != w {
					differ("%s: SHA-256 %s, manifest %s", f[1], got, w)
				}
			}
		}()
	}
	walkErr := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		name := "./" + filepath.ToSlash(rel)
		if rel == "." {
			name = "."
		}
		seen[name] = true
		w, ok := want[name]
		if !ok {
			differ("%s: not in the manifest", name)
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := info.Sys().(*syscall.Stat_t)
		if st == nil || (st.Uid != 0 && int(st.Uid) != uid) {
			differ("%s: owned by another user", name)
		}
		kind, mode := byte('f'), info.Mode()
		switch {
		case mode.IsDir():
			kind = 'd'
		case mode&fs.ModeSymlink != 0:
			kind = 'l'
		case !mode.IsRegular():
			kind = '?'
		}
		perm := mode.Perm()
		if mode&fs.ModeSticky != 0 {
			perm |= 0o1000
		}
		if mode&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			perm |= 0o6000
		}
		if kind != w.kind || (kind != 'l' && perm != w.mode) {
			differ("%s: %c %04o, manifest %c %04o", name, kind, perm, w.kind, w.mode)
			return nil
		}
		switch kind {
		case 'l':
			if target, err := os.Readlink(p); err != nil || target != w.sum {
				differ("%s: link to %q, manifest %q", name, target, w.sum)
			}
		case 'f':
			if info.Size() != w.size {
				differ("%s: %d bytes, manifest %d", name, info.Size(), w.size)
				return nil
			}
			n.Bytes += info.Size()
			files <- [2]string{p, name}
		}
		return nil
	})
	close(files)
	wg.Wait()
	if walkErr != nil {
		return walkErr
	}
	for name := range want {
		if !seen[name] {
			diffs = append(diffs, name+": missing")
		}
	}
	if len(diffs) > 0 {
		if len(diffs) > 5 {
			diffs = append(diffs[:5], fmt.Sprintf("and %d more", len(diffs)-5))
		}
		return fmt.Errorf("differs from its manifest: %s", strings.Join(diffs, "; "))
	}
	return nil
}

func hashFile(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, bufio.NewReaderSize(f, 256<<10)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
