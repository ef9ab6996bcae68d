// Package workspace keeps the daemon's named workspaces: directories that runs read
// and write as /ws and that callers fill and read through the API.
//
// Everything here touches files that guest code may have planted: any name in a
// workspace may be a symbolic link, a hard link to another file, a FIFO or a
// directory, and may change while the daemon looks at it (host code touching such
// files has been the weakest point of past sandbox escapes). So no path is ever resolved by the host's usual
// rules: every lookup is openat2(2) beneath the workspace's directory fd with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV, files are
// first opened O_PATH and their type checked on the open fd (never check-then-open),
// uploads are written to a new file and renamed over the name (so a planted link is
// replaced, never written through), and removal is os.Root's, which does not follow
// links.
//
// On disk, Dir/<id>/meta.json holds the owner (outside the guest's reach) and
// Dir/<id>/files is the workspace itself.
package workspace

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"
)

// Errors, mapped by the API to stable problem codes.
var (
	ErrNotFound = errors.New("workspace: no such workspace or file")
	ErrBadPath  = errors.New("workspace: bad path")
	ErrQuota    = errors.New("workspace: quota exceeded")
	// ErrUnsafe: the name is not a regular file with a single link (a directory, a
	// symbolic link, a FIFO, a device, a file with other hard links), or a path
	// component is a symbolic link.
	ErrUnsafe = errors.New("workspace: not a plain file")
	// ErrAttached: the workspace is a host directory attached to the store
	// (Attach), whose files are the host's: it is never deleted.
	ErrAttached = errors.New("workspace: an attached host directory is not deleted")
)

// Quota bounds one workspace.
type Quota struct {
	// Bytes bounds the sum of the apparent sizes of its regular files.
	Bytes int64 `json:"bytes"`
	// Files bounds its names (files, directories, links, anything).
	Files int `json:"files"`
}

// Store is the set of workspaces under one directory. Its methods are safe for
// concurrent use.
type Store struct {
	dir   string
	quota Quota

	mu    sync.Mutex
	locks map[string]*sync.Mutex // per workspace: one upload at a time (quota accounting)
	// attached is the host directory served as workspace DirectoryID (Attach),
	// or nil.
	attached atomic.Pointer[Workspace]
}

// Open returns the store in dir (created 0700 if missing).
func Open(dir string, q Quota) (*Store, error) {
	if q.Bytes <= 0 || q.Files <= 0 {
		return nil, fmt.Errorf("workspace: quota %+v", q)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	// Half-created or half-deleted workspaces of a daemon that died.
	for _, pattern := range []string{".new-*", ".gone-*"} {
		left, _ := filepath.Glob(filepath.Join(dir, pattern))
		for _, p := range left {
			RemoveTree(p)
		}
	}
	return &Store{dir: dir, quota: q, locks: map[string]*sync.Mutex{}}, nil
}

// Quota is every workspace's quota.
func (s *Store) Quota() Quota { return s.quota }

// Workspace is one workspace.
type Workspace struct {
	ID    string `json:"id"`
	Owner int    `json:"owner_uid"`
	// OwnerToken is the bearer token name of an owner that came over TCP (Owner -1).
	OwnerToken string    `json:"owner_token,omitempty"`
	Created    time.Time `json:"created_at"`

	s   *Store
	dir string // a Directory's own; "" for a store's
}

// DirectoryID is the ID of a Directory.
const DirectoryID = "local"

// Directory returns the host directory dir as a workspace of its own, with no store
// around it: the same file operations (beneath dir, no link followed), bounded by
// q. `sandcell mcp --workspace DIR` serves its tools on one.
func Directory(dir string, q Quota) (*Workspace, error) {
	if q.Bytes <= 0 || q.Files <= 0 {
		return nil, fmt.Errorf("workspace: quota %+v", q)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("workspace: %s is not a directory", dir)
	}
	return &Workspace{ID: DirectoryID, Owner: os.Getuid(), Created: st.ModTime().UTC(), dir: dir,
		s: &Store{quota: q, locks: map[string]*sync.Mutex{}}}, nil
}

// Attach serves the host directory dir as the store's workspace DirectoryID,
// owned by uid, under the store's quota: the same file operations as a Directory's
// (beneath dir, no link followed), found by Get, never removed by Delete
// (ErrAttached). `sandcell mcp --workspace DIR` attaches DIR to the daemon it runs
// in process. A store has at most one; Attach again replaces it.
func (s *Store) Attach(dir string, uid int) (*Workspace, error) {
	w, err := Directory(dir, s.quota)
	if err != nil {
		return nil, err
	}
	w.Owner, w.s = uid, s
	s.attached.Store(w)
	return w, nil
}

// validID: a ULID in its canonical upper-case Crockford base32 spelling, so an id
// is never a path.
var validID = regexp.MustCompile(`^[0-9A-HJKMNP-TV-Z]{26}$`)

// MaxPerOwner bounds the workspaces one caller may own.
const MaxPerOwner = 64

// Create makes an empty workspace owned by uid, or by the bearer token named token.
// An owner with MaxPerOwner workspaces gets ErrQuota.
func (s *Store) Create(uid int, token string) (*Workspace, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.owned(uid, token); n >= MaxPerOwner {
		return nil, fmt.Errorf("%w: the caller owns %d workspaces, the most allowed", ErrQuota, n)
	}
	w := &Workspace{ID: ulid.MustNew(ulid.Now(), rand.Reader).String(), Owner: uid, OwnerToken: token,
		Created: time.Now().UTC(), s: s}
	tmp, err := os.MkdirTemp(s.dir, ".new-")
	if err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	meta, _ := json.Marshal(w)
	err = os.Mkdir(filepath.Join(tmp, "files"), 0o755)
	if err == nil {
		err = os.WriteFile(filepath.Join(tmp, "meta.json"), meta, 0o600)
	}
	if err == nil {
		// Visible under its id only when complete.
		err = os.Rename(tmp, filepath.Join(s.dir, w.ID))
	}
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("workspace: %w", err)
	}
	return w, nil
}

// owned counts the workspaces of an owner; s.mu is held.
func (s *Store) owned(uid int, token string) int {
	entries, _ := os.ReadDir(s.dir)
	n := 0
	for _, e := range entries {
		if w, err := s.Get(e.Name()); err == nil && w.Owner == uid && w.OwnerToken == token {
			n++
		}
	}
	return n
}

// Get returns workspace id, or ErrNotFound.
func (s *Store) Get(id string) (*Workspace, error) {
	if w := s.attached.Load(); w != nil && id == DirectoryID {
		return w, nil
	}
	if !validID.MatchString(id) {
		return nil, ErrNotFound
	}
	b, err := os.ReadFile(filepath.Join(s.dir, id, "meta.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	w := &Workspace{s: s}
	if err := json.Unmarshal(b, w); err != nil || w.ID != id {
		return nil, fmt.Errorf("workspace %s: damaged meta.json", id)
	}
	return w, nil
}

// Delete removes workspace id and everything in it. Its id disappears first (a
// rename), so no request sees it half removed.
func (s *Store) Delete(id string) error {
	if w := s.attached.Load(); w != nil && id == DirectoryID {
		return fmt.Errorf("%w: workspace %s is a host directory of its own", ErrAttached, id)
	}
	if _, err := s.Get(id); err != nil {
		return err
	}
	gone := filepath.Join(s.dir, ".gone-"+id)
	if err := os.Rename(filepath.Join(s.dir, id), gone); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	// os.RemoveAll removes with unlinkat and opens directories with O_NOFOLLOW
	// relative to their parent's fd: a link planted inside is removed, never
	// followed.
	s.mu.Lock()
	delete(s.locks, id)
	s.mu.Unlock()
	if err := RemoveTree(gone); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	return nil
}

// Dir is the workspace's directory on the host (what a run gets as /ws).
func (w *Workspace) Dir() string {
	if w.dir != "" {
		return w.dir
	}
	return filepath.Join(w.s.dir, w.ID, "files")
}

// beneath is how every path inside a workspace is resolved (openat2(2)): it stays
// beneath the directory fd, follows no symbolic link (not even one pointing inside),
// no /proc magic link, and crosses no mount point.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// noOpenat2 is set once openat2 answers ENOSYS: systemd's RestrictSUIDSGID= (in the
// packaged unit) and systemd-nspawn refuse it so, since seccomp cannot inspect its
// flags. Lookups then walk one component at a time (walk).
var noOpenat2 atomic.Bool

// openat2 opens path (relative, clean, no "." or "..": see CleanPath) beneath dirfd
// by the rules of beneath.
func openat2(dirfd int, path string, flags uint64) (int, error) {
	for !noOpenat2.Load() {
		fd, err := unix.Openat2(dirfd, path, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: beneath})
		switch err {
		case unix.EAGAIN, unix.EINTR:
			continue // RESOLVE_* lookups may ask for a retry when a rename raced
		case unix.ENOSYS:
			noOpenat2.Store(true)
		default:
			return fd, err
		}
	}
	return walk(dirfd, path, flags)
}

// walk is openat2 without openat2(2): each component is opened with O_NOFOLLOW (a
// symbolic link is ELOOP or ENOTDIR, or, opened O_PATH as the last component, the
// link itself, which callers refuse by its type), must be on dirfd's device (else
// EXDEV), and may not be "." or ".." (EXDEV: it would leave).
func walk(dirfd int, path string, flags uint64) (int, error) {
	var root unix.Stat_t
	if err := unix.Fstat(dirfd, &root); err != nil {
		return -1, err
	}
	comps := strings.Split(path, "/")
	cur := dirfd
	for i, c := range comps {
		if c == "" || c == "." || c == ".." {
			if cur != dirfd {
				unix.Close(cur)
			}
			return -1, unix.EXDEV
		}
		f := uint64(unix.O_PATH | unix.O_DIRECTORY)
		if i == len(comps)-1 {
			f = flags
		}
		next, err := unix.Openat(cur, c, int(f|unix.O_CLOEXEC|unix.O_NOFOLLOW), 0)
		if cur != dirfd {
			unix.Close(cur)
		}
		if err != nil {
			return -1, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil || st.Dev != root.Dev {
			unix.Close(next)
			if err == nil {
				err = unix.EXDEV // a mount point
			}
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// lookupErr maps a failed lookup to the package's errors.
func lookupErr(path string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: %s", ErrNotFound, path)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENOTDIR):
		// ELOOP: a symbolic link; EXDEV: it would leave the workspace or cross a
		// mount; ENOTDIR: a component is not a directory.
		return fmt.Errorf("%w: %s: %v", ErrUnsafe, path, err)
	default:
		return fmt.Errorf("workspace: %s: %w", path, err)
	}
}

// CleanPath checks an API path: relative, slash-separated, no empty, "." or ".."
// component, no NUL, at most 4096 bytes with components of at most 255 (the Linux
// PATH_MAX and NAME_MAX), in directories nested at most maxDepth deep.
func CleanPath(p string) error {
	if p == "" || len(p) > 4096 || strings.ContainsRune(p, 0) || strings.HasPrefix(p, "/") {
		return fmt.Errorf("%w: %q: a relative path of at most 4096 bytes", ErrBadPath, p)
	}
	if strings.Count(p, "/") >= maxDepth {
		// Deeper names could be stored but never listed (see walkDir).
		return fmt.Errorf("%w: %q: directories nested deeper than %d", ErrBadPath, p, maxDepth)
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." || len(c) > 255 {
			return fmt.Errorf("%w: %q: components must be names (not empty, \".\" or \"..\", at most 255 bytes)", ErrBadPath, p)
		}
	}
	return nil
}

// root opens the workspace's directory.
func (w *Workspace) root() (int, error) {
	fd, err := unix.Open(w.Dir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, fmt.Errorf("workspace %s: %w", w.ID, err)
	}
	return fd, nil
}

// Open opens the regular file at path for reading and returns it with its size. A
// name that is anything but a regular file with one link is ErrUnsafe: a FIFO would
// block the daemon, a device would be the host's, and another hard link may be a
// name outside the workspace.
func (w *Workspace) Open(path string) (*os.File, int64, error) {
	if err := CleanPath(path); err != nil {
		return nil, 0, err
	}
	root, err := w.root()
	if err != nil {
		return nil, 0, err
	}
	defer unix.Close(root)
	// O_PATH opens nothing (no FIFO open, no device open): the type is checked on
	// this fd, then the same inode is reopened for reading through it.
	pfd, err := openat2(root, path, unix.O_PATH)
	if err != nil {
		return nil, 0, lookupErr(path, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, 0, fmt.Errorf("workspace: %w", err)
	}
	if err := plainFile(path, &st); err != nil {
		return nil, 0, err
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("workspace: reopen %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), st.Size, nil
}

func plainFile(path string, st *unix.Stat_t) error {
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: %s is a %s", ErrUnsafe, path, typeName(st.Mode))
	}
	if st.Nlink != 1 {
		return fmt.Errorf("%w: %s has %d hard links; a file with other names is not served", ErrUnsafe, path, st.Nlink)
	}
	return nil
}

// Write stores r's bytes at path, creating missing directories. The bytes go to a
// new file in the target's directory, renamed over the name when complete, so
// readers never see half a file and whatever the name was (a link, a FIFO) is
// replaced, not written through; a regular file replaced keeps its permission bits. More bytes than the quota leaves is ErrQuota, and
// nothing is changed.
func (w *Workspace) Write(path string, r io.Reader) (int64, error) {
	if err := CleanPath(path); err != nil {
		return 0, err
	}
	lock := w.s.lock(w.ID)
	lock.Lock()
	defer lock.Unlock()
	u, err := w.Usage()
	if err != nil {
		return 0, err
	}
	root, err := w.root()
	if err != nil {
		return 0, err
	}
	defer unix.Close(root)
	dirPath, name := filepath.Split(path)
	dirPath = strings.TrimSuffix(dirPath, "/")
	// The directories to create count against the quota before any is created.
	missing, err := missingDirs(root, dirPath)
	if err != nil {
		return 0, err
	}
	if u.Files+missing+1 > w.s.quota.Files {
		return 0, fmt.Errorf("%w: the workspace would hold more than %d names", ErrQuota, w.s.quota.Files)
	}
	dir, made, err := mkdirs(root, dirPath)
	if err != nil {
		return 0, err
	}
	defer unix.Close(dir)
	committed := false
	defer func() {
		if !committed {
			removeMade(root, dirPath, made) // a refused upload leaves nothing behind
		}
	}()
	// What the upload replaces no longer counts.
	var old unix.Stat_t
	if unix.Fstatat(dir, name, &old, unix.AT_SYMLINK_NOFOLLOW) == nil {
		if old.Mode&unix.S_IFMT == unix.S_IFDIR {
			return 0, fmt.Errorf("%w: %s is a directory", ErrUnsafe, path)
		}
		u.Files--
		if old.Mode&unix.S_IFMT == unix.S_IFREG {
			u.Bytes -= old.Size
		}
	}
	room := w.s.quota.Bytes - u.Bytes
	tmpName := ".sandcell-upload-" + ulid.MustNew(ulid.Now(), rand.Reader).String()
	fd, err := unix.Openat(dir, tmpName, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return 0, fmt.Errorf("workspace: %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), tmpName)
	if old.Mode&unix.S_IFMT == unix.S_IFREG {
		// A file replaced keeps its permissions (a 0600 file stays private).
		unix.Fchmod(fd, old.Mode&0o777)
	}
	n, err := io.Copy(f, io.LimitReader(r, max(room, 0)+1))
	if err == nil && n > room {
		err = fmt.Errorf("%w: the workspace has %d bytes left of %d", ErrQuota, max(room, 0), w.s.quota.Bytes)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dir, tmpName, dir, name)
		if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			err = fmt.Errorf("%w: %s became a directory", ErrUnsafe, path)
		}
	}
	if err != nil {
		unix.Unlinkat(dir, tmpName, 0)
		return 0, err
	}
	committed = true
	return n, nil
}

// missingDirs counts the components of dir (beneath root) that do not exist yet.
func missingDirs(root int, dir string) (int, error) {
	if dir == "" {
		return 0, nil
	}
	comps := strings.Split(dir, "/")
	for i := len(comps); i > 0; i-- {
		fd, err := openat2(root, strings.Join(comps[:i], "/"), unix.O_PATH|unix.O_DIRECTORY)
		if err == nil {
			unix.Close(fd)
			return len(comps) - i, nil
		}
		if !errors.Is(err, unix.ENOENT) {
			return 0, lookupErr(dir, err)
		}
	}
	return len(comps), nil
}

// removeMade removes the last made components of dir (empty directories this upload
// created), deepest first.
func removeMade(root int, dir string, made int) {
	comps := strings.Split(dir, "/")
	for i := len(comps); i > len(comps)-made && i > 0; i-- {
		parent, name := strings.Join(comps[:i-1], "/"), comps[i-1]
		pfd := root
		if parent != "" {
			fd, err := openat2(root, parent, unix.O_RDONLY|unix.O_DIRECTORY)
			if err != nil {
				return
			}
			pfd = fd
		}
		unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
		if pfd != root {
			unix.Close(pfd)
		}
	}
}

// mkdirs opens dir (a relative path, "" for the root) beneath root, creating missing
// components, and returns the fd and how many it created.
func mkdirs(root int, dir string) (int, int, error) {
	cur, err := unix.Dup(root)
	if err != nil {
		return -1, 0, err
	}
	made := 0
	if dir == "" {
		return cur, 0, nil
	}
	for _, c := range strings.Split(dir, "/") {
		next, err := openat2(cur, c, unix.O_RDONLY|unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(cur, c, 0o755); err == nil {
				made++
			}
			if err == nil || errors.Is(err, unix.EEXIST) {
				next, err = openat2(cur, c, unix.O_RDONLY|unix.O_DIRECTORY)
			}
		}
		unix.Close(cur)
		if err != nil {
			return -1, 0, lookupErr(dir, err)
		}
		cur = next
	}
	return cur, made, nil
}

// Remove deletes the file, link or directory (with its contents) at path. A link
// is removed, never followed.
func (w *Workspace) Remove(path string) error {
	if err := CleanPath(path); err != nil {
		return err
	}
	root, err := w.root()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	// The parent is reached like every other name (openat2 beneath, no symbolic
	// link in any component); only then is the last name looked at, unfollowed.
	parent, name := root, path
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		fd, err := openat2(root, path[:i], unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return lookupErr(path, err)
		}
		defer unix.Close(fd)
		parent, name = fd, path[i+1:]
	}
	var st unix.Stat_t
	if err := unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return lookupErr(path, err)
	}
	// os.Root removes a tree without following links inside it; it is opened on the
	// directory checked above, not on its path.
	r, err := os.OpenRoot("/proc/self/fd/" + strconv.Itoa(parent))
	if err != nil {
		return fmt.Errorf("workspace %s: %w", w.ID, err)
	}
	defer r.Close()
	err = r.RemoveAll(name)
	for pass := 0; (errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE)) && pass < maxHoists; pass++ {
		// Deeper than os.Root's one descriptor per level allows: see RemoveTree.
		fd, oerr := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if oerr != nil {
			break
		}
		top := os.NewFile(uintptr(fd), name)
		moved, _ := hoist(top, pass)
		top.Close()
		if !moved {
			break
		}
		err = r.RemoveAll(name)
	}
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	return nil
}

// File is one name in a workspace listing.
type File struct {
	// Path is relative to the workspace, slash-separated.
	Path string `json:"path"`
	// Type is "file", "dir", "symlink", "fifo", "socket", "device" or "other".
	Type string `json:"type"`
	// Size is the apparent size in bytes (regular files only).
	Size int64 `json:"size"`
}

// Usage is what a workspace holds.
type Usage struct {
	Bytes int64 `json:"bytes"`
	Files int   `json:"files"`
	// AtLeast says the walk stopped once the workspace was over its quota of names:
	// it holds at least Bytes in at least Files names.
	AtLeast bool `json:"at_least,omitempty"`
}

// maxDirNames bounds the names of one directory a listing reads (it sorts them),
// whatever guest code created; a usage walk reads directories in batches and stops
// past the quota instead.
const maxDirNames = 100_000

// maxDepth bounds the directory nesting a walk descends (each level holds an fd).
const maxDepth = 128

// Listing bounds: a page has DefaultPage names unless asked for fewer or more, at
// most MaxPage, and ends early once its paths add up to MaxPageBytes (a name may be
// 32 KB long: 127 nested directories of 255 bytes).
const (
	DefaultPage  = 1000
	MaxPage      = 10_000
	MaxPageBytes = 1 << 20
)

// errStop ends a walk early; callers never see it.
var errStop = errors.New("workspace: walk stopped")

// List returns a page of the names in the workspace, in walk order (depth first,
// sorted per directory): at most limit (0: DefaultPage; at most MaxPage) of those
// that come after the name after ("" for the first page), their paths at most
// MaxPageBytes together, and next, the name to
// pass as after for the following page ("" when there is none). Nothing is
// followed: links are listed as links. A page's cost is bounded by limit and by
// the directories on the way to after, never by everything a run created.
func (w *Workspace) List(after string, limit int) (files []File, next string, err error) {
	if limit <= 0 {
		limit = DefaultPage
	}
	limit = min(limit, MaxPage)
	var from []string
	if after != "" {
		if err := CleanPath(after); err != nil {
			return nil, "", err
		}
		from = strings.Split(after, "/")
	}
	root, err := w.root()
	if err != nil {
		return nil, "", err
	}
	size := 0
	err = listDir(root, "", from, func(f File) error {
		if len(files) == limit || (len(files) > 0 && size+len(f.Path) > MaxPageBytes) {
			next = files[len(files)-1].Path
			return errStop
		}
		files = append(files, f)
		size += len(f.Path)
		return nil
	})
	if errors.Is(err, errStop) {
		err = nil
	}
	return files, next, err
}

// Usage walks the workspace and returns what it holds, stopping (AtLeast) once it
// has counted more names than the quota allows: the walk before every run and
// upload costs at most the quota's names, whatever a run created.
func (w *Workspace) Usage() (Usage, error) {
	root, err := w.root()
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	err = countDir(root, "", &u, w.s.quota.Files)
	if errors.Is(err, errStop) {
		u.AtLeast, err = true, nil
	}
	return u, err
}

// OverQuota reports whether the workspace holds more than its quota (guest code may
// write past it: the quota is checked on uploads, before each run and as a run goes,
// and a run ends once it is past; see runs.Options.WorkspaceQuota).
func (w *Workspace) OverQuota() (bool, Usage, error) {
	u, err := w.Usage()
	return err == nil && (u.Bytes > w.s.quota.Bytes || u.Files > w.s.quota.Files), u, err
}

// countDir adds what the directory dirfd holds to u (closing it), reading it in
// batches, and stops with errStop past max names.
func countDir(dirfd int, prefix string, u *Usage, max int) error {
	d := os.NewFile(uintptr(dirfd), prefix)
	defer d.Close()
	if strings.Count(prefix, "/") >= maxDepth {
		return fmt.Errorf("%w: directories nested deeper than %d", ErrUnsafe, maxDepth)
	}
	for {
		names, err := readNames(d)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("workspace: list %s: %w", prefix, err)
		}
		for _, name := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // removed meanwhile
			}
			if u.Files++; u.Files > max {
				return errStop
			}
			switch typeName(st.Mode) {
			case "file":
				u.Bytes += st.Size
			case "dir":
				sub, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
				if err != nil {
					continue // replaced meanwhile by something that is not a directory
				}
				if err := countDir(sub, prefix+name+"/", u, max); err != nil {
					return err
				}
			}
		}
	}
}

// readNames reads the next names of the directory d, io.EOF at its end. A directory
// removed while it is read (the guest's own temporary directory, SQLite's lock
// directory; Linux's getdents then fails with ENOENT) holds nothing more: io.EOF too.
func readNames(d *os.File) ([]string, error) {
	names, err := d.Readdirnames(1024)
	if errors.Is(err, unix.ENOENT) {
		return nil, io.EOF
	}
	return names, err
}

// listDir calls visit for each name beneath the directory dirfd (closing it), depth
// first and sorted per directory, from the name after the path whose remaining
// components are from (nil: from the start).
func listDir(dirfd int, prefix string, from []string, visit func(File) error) error {
	d := os.NewFile(uintptr(dirfd), prefix)
	defer d.Close()
	if strings.Count(prefix, "/") >= maxDepth {
		return fmt.Errorf("%w: directories nested deeper than %d", ErrUnsafe, maxDepth)
	}
	var names []string
	for {
		batch, err := readNames(d)
		names = append(names, batch...)
		if len(names) > maxDirNames {
			return fmt.Errorf("%w: %s holds more than %d names", ErrQuota, strings.TrimSuffix(prefix, "/"), maxDirNames)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("workspace: list %s: %w", prefix, err)
		}
	}
	slices.Sort(names)
	if len(from) > 0 {
		// Names before from[0] were on earlier pages, with all beneath them.
		i, _ := slices.BinarySearch(names, from[0])
		names = names[i:]
	}
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed meanwhile
		}
		f := File{Path: prefix + name, Type: typeName(st.Mode)}
		var rest []string
		if len(from) > 0 && name == from[0] {
			// The page's start is this name (given already) or beneath it.
			rest = from[1:]
		} else {
			if f.Type == "file" {
				f.Size = st.Size
			}
			if err := visit(f); err != nil {
				return err
			}
		}
		from = nil
		if f.Type == "dir" {
			sub, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
			if err != nil {
				continue // replaced meanwhile by something that is not a directory
			}
			if err := listDir(sub, f.Path+"/", rest, visit); err != nil {
				return err
			}
		}
	}
	return nil
}

func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "device"
	}
	return "other"
}

func (s *Store) lock(id string) *sync.Mutex {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.locks[id]
	if !ok {
		l = &sync.Mutex{}
		s.locks[id] = l
	}
	return l
}

// CheckFile checks that path (an API path, see CleanPath) names a regular file with
// one link beneath the directory dir, reached without a symbolic link: what the SQL tool
// requires of a database file before a worker opens it. It returns ErrBadPath,
// ErrNotFound or ErrUnsafe.
func CheckFile(dir, path string) error {
	if err := CleanPath(path); err != nil {
		return err
	}
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	defer unix.Close(root)
	fd, err := openat2(root, path, unix.O_PATH)
	if err != nil {
		return lookupErr(path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	return plainFile(path, &st)
}
