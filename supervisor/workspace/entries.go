package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Entry is one name of a workspace as an approval binds it: its path
// (slash-separated, relative to the workspace), its type ("file" or "dir"), and for a
// file its size in bytes and SHA-256 (hex) as they were read.
type Entry struct {
	Path   string `json:"path"`
	Type   string `json:"type"`
	Size   int64  `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

// MaxEntries bounds the names Entries lists: each is shown to an approver.
const MaxEntries = 10_000

// ErrChanged: a file changed while it was read (a run in the workspace writing it).
var ErrChanged = errors.New("workspace: a file changed while it was read")

// ErrTooManyEntries: the workspace holds more than MaxEntries names.
var ErrTooManyEntries = errors.New("workspace: too many names to show an approver")

// Entries lists, in walk order, every name of the workspace, each file read whole
// and hashed: what an approval of code binds besides the code. Every one of them
// could decide what runs: a program's `import x` loads x.py, x/ (a package, or an
// empty directory as a namespace package) from the workspace, and a program or an
// earlier cell of its session may have put any file (a zip under any name) on
// sys.path or exec its text. A name that is not a regular file with one link or a
// directory (a symbolic link, which could be pointed elsewhere after approval, or
// make one module another's name; a FIFO; a file with other hard links), and a
// name that is not UTF-8, is ErrUnsafe: no digest can stand for it. Past MaxEntries it is ErrTooManyEntries.
func (w *Workspace) Entries() ([]Entry, error) {
	root, err := w.root()
	if err != nil {
		return nil, err
	}
	out := []Entry{}
	err = listDir(root, "", nil, func(f File) error {
		if len(out) == MaxEntries {
			return fmt.Errorf("%w: more than %d", ErrTooManyEntries, MaxEntries)
		}
		if !utf8.ValidString(f.Path) {
			// JSON, the approver's view and the digest alike, would show it as
			// U+FFFD: two such names would be one.
			return fmt.Errorf("%w: %q is not UTF-8, which an approval cannot show: rename it first", ErrUnsafe, f.Path)
		}
		switch f.Type {
		case "dir":
			out = append(out, Entry{Path: f.Path, Type: f.Type})
			return nil
		case "file":
		default:
			return fmt.Errorf("%w: %s is a %s, which an approval cannot bind: remove it first", ErrUnsafe, f.Path, f.Type)
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
			return fmt.Errorf("%w: %s: read %d of %d bytes: %v", ErrChanged, f.Path, n, size, err)
		}
		out = append(out, Entry{Path: f.Path, Type: f.Type, Size: size, SHA256: hex.EncodeToString(h.Sum(nil))})
		return nil
	})
	return out, err
}
