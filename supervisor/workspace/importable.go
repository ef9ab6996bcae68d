package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// ImportFile is one file of a workspace that Python's import system can load
// instead of, or besides, what a program names: its path (slash-separated, relative
// to the workspace), size in bytes and SHA-256 (hex) as they were read.
type ImportFile struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// MaxImportFiles bounds the files Importable lists: each is shown to an approver.
const MaxImportFiles = 10_000

// importSuffixes are the names the import system loads from a directory on sys.path
// (CPython's SOURCE_SUFFIXES and BYTECODE_SUFFIXES: .py, and .pyc, which includes
// __pycache__'s cached bytecode that is used instead of its source when its header
// says so), or that put more on sys.path or in the import system's reach when a
// program names them (.pth, .zip, .egg and .whl archives, which zipimport loads).
var importSuffixes = []string{".py", ".pyc", ".pth", ".zip", ".egg", ".whl"}

// metadataDirs are the directories whose files importlib.metadata reads from any
// directory on sys.path (entry points name modules to load).
var metadataDirs = []string{".dist-info", ".egg-info"}

// Importable reports whether a program in the guest could import or execute the
// file at p (a workspace path) by a module name: by its suffix, or because it is
// package metadata.
func Importable(p string) bool {
	for _, s := range importSuffixes {
		if strings.HasSuffix(p, s) {
			return true
		}
	}
	for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
		for _, s := range metadataDirs {
			if strings.HasSuffix(dir, s) {
				return true
			}
		}
	}
	return false
}

// ErrTooManyImportFiles: the workspace holds more than MaxImportFiles importable
// files.
var ErrTooManyImportFiles = errors.New("workspace: too many importable files to show an approver")

// ImportFiles lists, in walk order, every file of the workspace that Importable
// names, each read whole and hashed: what an approval of code binds besides the
// code. A name that Importable names but that is not a regular file with one link
// (a symbolic link, which could be pointed at any file after approval; a FIFO; a
// file with other hard links) is ErrUnsafe: no digest can stand for it. Past
// MaxImportFiles it is ErrTooManyImportFiles.
func (w *Workspace) ImportFiles() ([]ImportFile, error) {
	root, err := w.root()
	if err != nil {
		return nil, err
	}
	var out []ImportFile
	err = listDir(root, "", nil, func(f File) error {
		if f.Type == "dir" || !Importable(f.Path) {
			return nil
		}
		if len(out) == MaxImportFiles {
			return fmt.Errorf("%w: more than %d", ErrTooManyImportFiles, MaxImportFiles)
		}
		if f.Type != "file" {
			return fmt.Errorf("%w: %s is a %s where a module could be imported from", ErrUnsafe, f.Path, f.Type)
		}
		r, size, err := w.Open(f.Path)
		if errors.Is(err, ErrNotFound) {
			return nil // removed meanwhile
		}
		if err != nil {
			return err
		}
		defer r.Close()
		h := sha256.New()
		if n, err := io.Copy(h, io.LimitReader(r, size)); err != nil || n != size {
			return fmt.Errorf("workspace: read %s: %d of %d bytes: %v", f.Path, n, size, err)
		}
		out = append(out, ImportFile{Path: f.Path, Size: size, SHA256: hex.EncodeToString(h.Sum(nil))})
		return nil
	})
	return out, err
}
