package bundle

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	_ "embed"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// The guest's bootstrap (bootstrap.py, after display()'s source and sandcell.tools',
// which the native runner shares, as the strings _sandcell_displays_source and
// _sandcell_tools_source: protocol.DisplaysSource, protocol.ToolsSource):
// the init source of the snapshot. It is part of every snapshot and so of every
// .cwasm's Key. (strconv.Quote's escapes are Python's too.)
var bootstrap = "_sandcell_displays_source = " + strconv.Quote(protocol.DisplaysSource()) + "\n" +
	"_sandcell_tools_source = " + strconv.Quote(protocol.ToolsSource()) + "\n" + bootstrapOwn

//go:embed bootstrap.py
var bootstrapOwn string

// HashSeedName is the file in a .cwasm's directory that holds the hash seed of the
// snapshots compiled there: a decimal number in [0, 2^32). CPython's str and bytes
// hashes (and so the order of sets and the layout of dicts) depend on it, and a
// snapshot freezes it: every run from one snapshot hashes alike, as under a fixed
// PYTHONHASHSEED. The seed is drawn at random when the first snapshot is made in a
// directory, so that each installation that compiles its own .cwasm files has its
// own and outside input cannot be built to collide in its hash tables; a package's
// shipped .cwasm carries the seed drawn when the package was built.
const HashSeedName = "hash-seed"

// PrecompileCommand is the hidden argv[1] of the sandcell binary with which the
// daemon compiles a new hash secret's modules in a child process: `sandcell
// __precompile BUNDLE_DIR INTO_DIR` (Precompile of each engine variant into
// INTO_DIR, with INTO_DIR's seed, a new one when it has none).
const PrecompileCommand = "__precompile"

// HashSeed returns the hash seed of dir (see HashSeedName), drawing and writing a new
// one if dir has none. A file that does not hold a seed is an error, never replaced.
func HashSeed(dir string) (uint32, error) {
	p := filepath.Join(dir, HashSeedName)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		var r [4]byte
		if _, err := rand.Read(r[:]); err != nil {
			return 0, err
		}
		seed := binary.LittleEndian.Uint32(r[:])
		// Written beside, then linked into place, which fails if another process
		// drew one first: then there is one seed, theirs.
		tmp := fmt.Sprintf("%s.%d.new", p, os.Getpid())
		if err := writeAtomic(tmp, []byte(strconv.FormatUint(uint64(seed), 10)+"\n"), 0o644); err != nil {
			return 0, err
		}
		err := os.Link(tmp, p)
		os.Remove(tmp)
		if err != nil && !errors.Is(err, os.ErrExist) {
			return 0, fmt.Errorf("bundle: %w", err)
		}
		return HashSeed(dir)
	}
	if err != nil {
		return 0, fmt.Errorf("bundle: %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("bundle: %s does not hold a hash seed (a number below 2^32)", p)
	}
	return uint32(v), nil
}

// snapshotArgv is the WASI argv of the snapshot's initialisation for seed: the
// interpreter's name, the hash seed, the bootstrap (see
// bundle/interpreter/sandcell.c).
func snapshotArgv(seed uint32) []string {
	return []string{GuestExecutable, strconv.FormatUint(uint64(seed), 10), bootstrap}
}

// SnapshotWasm makes the snapshot of the bundle's verified python.wasm for seed with
// c, afresh. The same bundle directory and seed give the same bytes. (Not across
// directories: CPython's import system records what it reads of the library
// directory's metadata at start-up, its modification times, in the snapshot.)
func (b *Bundle) SnapshotWasm(c Compiler, seed uint32) ([]byte, error) {
	wasm, err := readVerified(Pinned().Wasm, b.WasmPath())
	if err != nil {
		return nil, err
	}
	if err := Pinned().Stdlib.Verify(filepath.Join(b.LibPath(), Pinned().Stdlib.Name)); err != nil {
		return nil, err
	}
	snap, err := c.Snapshot(wasm, b.LibPath(), GuestLibDir, snapshotArgv(seed))
	if err != nil {
		return nil, fmt.Errorf("bundle: snapshot: %w", err)
	}
	return snap, nil
}

// lastSnapshot keeps the most recent snapshot made in this process: the .cwasm files
// of every engine variant compile the same snapshot,
// which takes seconds to make.
var lastSnapshot struct {
	sync.Mutex
	key  string
	wasm []byte
}

// snapshot is SnapshotWasm for wasm, python.wasm as verified by the caller, through
// lastSnapshot.
func (b *Bundle) snapshot(c Compiler, wasm []byte, seed uint32) ([]byte, error) {
	key := hashBytes(wasm) + "\x00" + strconv.FormatUint(uint64(seed), 10) + "\x00" + b.LibPath()
	lastSnapshot.Lock()
	defer lastSnapshot.Unlock()
	if lastSnapshot.key == key {
		return lastSnapshot.wasm, nil
	}
	// (What the initialisation imports from the library is frozen into the
	// snapshot: SnapshotWasm verifies the library first.)
	snap, err := b.SnapshotWasm(c, seed)
	if err != nil {
		return nil, err
	}
	lastSnapshot.key, lastSnapshot.wasm = key, snap
	return snap, nil
}
