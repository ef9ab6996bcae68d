package workspace

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func newWorkspace(t *testing.T, q Quota) (*Store, *Workspace) {
	t.Helper()
	s, err := Open(t.TempDir(), q)
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(1000, "")
	if err != nil {
		t.Fatal(err)
	}
	return s, w
}

func read(t *testing.T, w *Workspace, path string) (string, error) {
	t.Helper()
	f, _, err := w.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	return string(b), err
}

func TestRoundTrip(t *testing.T) {
	s, w := newWorkspace(t, Quota{Bytes: 1 << 20, Files: 100})
	if _, err := w.Write("a/b/c.txt", strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	if got, err := read(t, w, "a/b/c.txt"); err != nil || got != "hello" {
		t.Fatalf("read %q, %v", got, err)
	}
	files, u, err := listAll(w)
	if err != nil || len(files) != 3 || u.Bytes != 5 || u.Files != 3 {
		t.Fatalf("list %+v %+v %v", files, u, err)
	}
	if files[2] != (File{Path: "a/b/c.txt", Type: "file", Size: 5}) {
		t.Fatalf("list %+v", files)
	}
	got, err := s.Get(w.ID)
	if err != nil || got.Owner != 1000 || got.Dir() != w.Dir() {
		t.Fatalf("get %+v %v", got, err)
	}
	if err := w.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := read(t, w, "a/b/c.txt"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after remove: %v", err)
	}
	if err := s.Delete(w.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(w.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestBadPathsAndIDs(t *testing.T) {
	s, w := newWorkspace(t, Quota{Bytes: 1 << 20, Files: 100})
	for _, p := range []string{"", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", "a\x00b",
		strings.Repeat("x", 256), strings.Repeat("a/", 2049)} {
		if _, err := w.Write(p, strings.NewReader("x")); !errors.Is(err, ErrBadPath) {
			t.Errorf("write %q: %v", p, err)
		}
		if _, _, err := w.Open(p); !errors.Is(err, ErrBadPath) {
			t.Errorf("open %q: %v", p, err)
		}
		if err := w.Remove(p); !errors.Is(err, ErrBadPath) {
			t.Errorf("remove %q: %v", p, err)
		}
	}
	for _, id := range []string{"", "..", "../" + w.ID, strings.ToLower(w.ID), w.ID + "/files"} {
		if _, err := s.Get(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("get %q: %v", id, err)
		}
	}
}

// plant creates what guest code (or anything else with access to the workspace)
// might leave at a name the API then touches.
func plant(t *testing.T, w *Workspace, outside string) {
	t.Helper()
	d := w.Dir()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(outside, filepath.Join(d, "link")))
	must(os.Symlink(filepath.Dir(outside), filepath.Join(d, "dirlink")))
	must(os.WriteFile(filepath.Join(d, "inside"), []byte("inside"), 0o644))
	must(os.Symlink("inside", filepath.Join(d, "innerlink")))
	must(os.Link(outside, filepath.Join(d, "hard")))
	must(syscall.Mkfifo(filepath.Join(d, "fifo"), 0o644))
	must(os.Mkdir(filepath.Join(d, "dir"), 0o755))
}

func TestPlantedNamesAreNotFollowed(t *testing.T) {
	_, w := newWorkspace(t, Quota{Bytes: 1 << 20, Files: 100})
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	plant(t, w, outside)

	// Reads: no link is followed, no FIFO opened (the test would hang), no file with
	// another name served.
	for _, p := range []string{"link", "dirlink/secret", "innerlink", "hard", "fifo", "dir"} {
		done := make(chan error, 1)
		go func() { _, err := read(t, w, p); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrUnsafe) {
				t.Errorf("read %s: want ErrUnsafe, got %v", p, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("read %s blocked", p)
		}
	}
	// Writes replace the name; the file outside is never written.
	for _, p := range []string{"link", "hard", "fifo", "innerlink"} {
		if _, err := w.Write(p, strings.NewReader("new")); err != nil {
			t.Errorf("write %s: %v", p, err)
		}
		if got, err := read(t, w, p); err != nil || got != "new" {
			t.Errorf("after write %s: %q %v", p, got, err)
		}
	}
	for _, p := range []string{"dirlink/x", "dir"} {
		if _, err := w.Write(p, strings.NewReader("new")); !errors.Is(err, ErrUnsafe) {
			t.Errorf("write %s: want ErrUnsafe, got %v", p, err)
		}
	}
	// Removal removes the link, not its target.
	if err := w.Remove("dirlink"); err != nil {
		t.Fatal(err)
	}
	if err := w.Remove("dirlink/secret"); !errors.Is(err, ErrNotFound) {
		t.Errorf("remove through a removed link: %v", err)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "host secret" {
		t.Fatalf("the file outside changed: %q %v", b, err)
	}
	// Listing names links as links and does not descend through them.
	files, _, err := listAll(w)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.Contains(f.Path, "secret") {
			t.Errorf("listing went through a link: %+v", f)
		}
	}
}

func TestQuota(t *testing.T) {
	_, w := newWorkspace(t, Quota{Bytes: 10, Files: 3})
	if _, err := w.Write("a", strings.NewReader("12345678")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write("b", strings.NewReader("123")); !errors.Is(err, ErrQuota) {
		t.Fatalf("over bytes: %v", err)
	}
	// Replacing a file counts the new size only.
	if _, err := w.Write("a", strings.NewReader("1234567890")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write("d/e", strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write("f", strings.NewReader("")); !errors.Is(err, ErrQuota) {
		t.Fatalf("over files: %v", err)
	}
	// A refused upload leaves nothing behind.
	files, u, err := listAll(w)
	if err != nil || u.Files != 3 || u.Bytes != 10 {
		t.Fatalf("after refusals: %+v %+v %v", files, u, err)
	}
	if got, _ := read(t, w, "a"); got != "1234567890" {
		t.Fatalf("a = %q", got)
	}
}

func TestRemoveAndDeleteDoNotFollowLinks(t *testing.T) {
	s, w := newWorkspace(t, Quota{Bytes: 1 << 20, Files: 100})
	hostDir := t.TempDir()
	keep := filepath.Join(hostDir, "keep")
	os.WriteFile(keep, []byte("x"), 0o600)
	os.Symlink(hostDir, filepath.Join(w.Dir(), "escape"))
	os.MkdirAll(filepath.Join(w.Dir(), "d"), 0o755)
	os.Symlink(hostDir, filepath.Join(w.Dir(), "d", "escape"))
	// A link in a parent component is refused, not followed (and not a 500).
	for _, p := range []string{"escape/keep", "d/escape/keep"} {
		if err := w.Remove(p); !errors.Is(err, ErrUnsafe) {
			t.Errorf("remove %s: %v", p, err)
		}
	}
	if err := w.Remove("d/escape"); err != nil { // the link itself goes
		t.Fatal(err)
	}
	if err := w.Remove("d"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(w.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("a file behind a link was removed: %v", err)
	}
}

// Review findings: a refused upload leaves no directory behind; nesting past the
// walk's depth is a client error; an owner has a bounded number of workspaces.
func TestQuotaEdges(t *testing.T) {
	s, w := newWorkspace(t, Quota{Bytes: 1 << 20, Files: 10})
	deep := strings.Repeat("d/", 20) + "f"
	if _, err := w.Write(deep, strings.NewReader("x")); !errors.Is(err, ErrQuota) {
		t.Fatalf("deep upload: %v", err)
	}
	if _, err := w.Write("a/b", strings.NewReader(strings.Repeat("x", 2<<20))); !errors.Is(err, ErrQuota) {
		t.Fatalf("large upload: %v", err)
	}
	if files, u, _ := listAll(w); u.Files != 0 {
		t.Fatalf("a refused upload left %+v", files)
	}
	if _, err := w.Write(strings.Repeat("n/", maxDepth)+"f", strings.NewReader("x")); !errors.Is(err, ErrBadPath) {
		t.Fatalf("an upload nested past the walk's depth: %v", err)
	}
	os.WriteFile(filepath.Join(w.Dir(), "db"), []byte("x"), 0o644)
	os.Link(filepath.Join(w.Dir(), "db"), filepath.Join(w.Dir(), "db2"))
	if err := CheckFile(w.Dir(), "db"); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("a file with two links: %v", err)
	}
	os.Remove(filepath.Join(w.Dir(), "db2"))
	os.Remove(filepath.Join(w.Dir(), "db"))
	os.MkdirAll(filepath.Join(w.Dir(), strings.Repeat("n/", maxDepth+2)), 0o755)
	// The usage walk stops first at the quota of names (130 directories), or at the
	// depth; the listing reaches the depth.
	if u, err := w.Usage(); !errors.Is(err, ErrUnsafe) && !(err == nil && u.AtLeast) {
		t.Fatalf("too deep: %+v %v", u, err)
	}
	if _, _, err := w.List("", 0); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("listing too deep: %v", err)
	}
	for i := 1; i < MaxPerOwner; i++ {
		if _, err := s.Create(1000, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(1000, ""); !errors.Is(err, ErrQuota) {
		t.Fatalf("over the per-owner limit: %v", err)
	}
	if _, err := s.Create(1001, ""); err != nil {
		t.Fatalf("another owner: %v", err)
	}
}

// Under systemd's RestrictSUIDSGID= (the packaged unit) openat2 answers ENOSYS and
// every lookup walks a component at a time: the same tests hold.
func TestWithoutOpenat2(t *testing.T) {
	noOpenat2.Store(true)
	defer noOpenat2.Store(false)
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{{"RoundTrip", TestRoundTrip}, {"BadPathsAndIDs", TestBadPathsAndIDs},
		{"PlantedNamesAreNotFollowed", TestPlantedNamesAreNotFollowed},
		{"RemoveAndDeleteDoNotFollowLinks", TestRemoveAndDeleteDoNotFollowLinks}, {"QuotaEdges", TestQuotaEdges}} {
		t.Run(tc.name, tc.f)
	}
}

// listAll is every name (one page as large as allowed) and the usage.
func listAll(w *Workspace) ([]File, Usage, error) {
	files, _, err := w.List("", MaxPage)
	if err != nil {
		return nil, Usage{}, err
	}
	u, err := w.Usage()
	return files, u, err
}

// A listing comes in pages that together are the whole walk, in order; a usage walk
// stops past the quota of names, whatever a run created, and says so.
func TestListPagesAndBoundedUsage(t *testing.T) {
	_, w := newWorkspace(t, Quota{Bytes: 1 << 30, Files: 50})
	dir := w.Dir()
	var want []string
	for _, d := range []string{"a", "a/x", "b", "c"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	// Made as a run would (past the quota), not through Write.
	for i := 0; i < 40; i++ {
		for _, d := range []string{"a", "a/x", "c"} {
			os.WriteFile(filepath.Join(dir, d, fmt.Sprintf("f%02d", i)), []byte("x"), 0o644)
		}
	}
	all, err := walkAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	want = all
	var got []string
	after := ""
	pages := 0
	for {
		files, next, err := w.List(after, 7)
		if err != nil {
			t.Fatal(err)
		}
		if len(files) > 7 {
			t.Fatalf("a page of %d names", len(files))
		}
		for _, f := range files {
			got = append(got, f.Path)
		}
		pages++
		if next == "" {
			break
		}
		after = next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages gave %d names, the walk %d:\n%v\n%v", len(got), len(want), got, want)
	}
	if pages != (len(want)+6)/7 {
		t.Errorf("%d pages for %d names", pages, len(want))
	}
	u, err := w.Usage()
	if err != nil || !u.AtLeast || u.Files != 51 {
		t.Fatalf("usage past the quota: %+v %v", u, err)
	}
	if over, _, _ := w.OverQuota(); !over {
		t.Fatal("not over quota")
	}
	if _, _, err := w.List("../x", 0); err == nil {
		t.Fatal("after=../x accepted")
	}
}

// walkAll is the walk order of dir: depth first, sorted per directory.
func walkAll(dir string) ([]string, error) {
	var out []string
	var rec func(prefix string) error
	rec = func(prefix string) error {
		ents, err := os.ReadDir(filepath.Join(dir, prefix))
		if err != nil {
			return err
		}
		for _, e := range ents { // os.ReadDir sorts by name
			p := path.Join(prefix, e.Name())
			out = append(out, p)
			if e.IsDir() {
				if err := rec(p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, rec("")
}

// A page ends once its paths add up to MaxPageBytes, however long the names.
func TestListPageBytesBounded(t *testing.T) {
	_, w := newWorkspace(t, Quota{Bytes: 1 << 30, Files: 100_000})
	deep := filepath.Join(w.Dir(), strings.Repeat(strings.Repeat("d", 250)+"/", 12))
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		os.WriteFile(filepath.Join(deep, fmt.Sprintf("f%04d", i)), nil, 0o644)
	}
	files, next, err := w.List("", MaxPage)
	if err != nil {
		t.Fatal(err)
	}
	size := 0
	for _, f := range files {
		size += len(f.Path)
	}
	if size > MaxPageBytes || next == "" || len(files) >= 1012 {
		t.Fatalf("a page of %d names, %d bytes, next %q", len(files), size, next)
	}
}

// A file replaced keeps its permissions; Directory serves a host directory as a
// workspace of its own, with the same rules.
func TestReplacedFileKeepsItsModeAndDirectory(t *testing.T) {
	dir := t.TempDir()
	w, err := Directory(dir, Quota{Bytes: 1 << 20, Files: 100})
	if err != nil || w.ID != DirectoryID || w.Dir() != dir {
		t.Fatalf("%+v %v", w, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "private.env"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write("private.env", strings.NewReader("secret")); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, "private.env")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode after the write: %v %v", st.Mode(), err)
	}
	os.Symlink("/etc/passwd", filepath.Join(dir, "passwd"))
	if _, err := read(t, w, "passwd"); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("a link out of the directory: %v", err)
	}
	if _, err := Directory(filepath.Join(dir, "private.env"), Quota{Bytes: 1, Files: 1}); err == nil {
		t.Fatal("a file served as a directory")
	}
}

// A copy holds the workspace's files and directories, refuses every other kind of
// name (a symbolic link, wherever it leads; a FIFO; a file with another hard link)
// without following it, and stops at the quota.
func TestCopyTo(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o755)
	os.WriteFile(filepath.Join(src, "a", "b", "f.txt"), []byte("hello"), 0o640)
	os.WriteFile(filepath.Join(src, "top"), []byte("x"), 0o600)
	w, err := Directory(src, Quota{Bytes: 100, Files: 10})
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := w.CopyTo(dst); err != nil {
		t.Fatalf("copy: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a", "b", "f.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("the copied file: %q %v", b, err)
	}
	if st, _ := os.Stat(filepath.Join(dst, "a", "b", "f.txt")); st.Mode().Perm() != 0o640 {
		t.Fatalf("the copy's mode: %v", st.Mode())
	}
	for name, mk := range map[string]func(dir string) error{
		"a symbolic link out": func(dir string) error { return os.Symlink("../../../../etc/passwd", filepath.Join(dir, "l")) },
		"a symbolic link in":  func(dir string) error { return os.Symlink("top", filepath.Join(dir, "l")) },
		"a FIFO":              func(dir string) error { return unix.Mkfifo(filepath.Join(dir, "p"), 0o600) },
		"a hard link":         func(dir string) error { return os.Link(filepath.Join(dir, "top"), filepath.Join(dir, "h")) },
	} {
		s := t.TempDir()
		os.WriteFile(filepath.Join(s, "top"), []byte("x"), 0o600)
		if err := mk(s); err != nil {
			t.Fatal(err)
		}
		w, _ := Directory(s, Quota{Bytes: 100, Files: 10})
		d := t.TempDir()
		if err := w.CopyTo(d); !errors.Is(err, ErrUnsafe) {
			t.Errorf("%s: %v", name, err)
		}
		if entries, _ := os.ReadDir(d); len(entries) > 1 {
			t.Errorf("%s: copied %v", name, entries)
		}
		filepath.WalkDir(d, func(p string, e fs.DirEntry, _ error) error {
			if e != nil && e.Type()&fs.ModeSymlink != 0 {
				t.Errorf("%s: a link in the copy: %s", name, p)
			}
			return nil
		})
	}
	big, _ := Directory(src, Quota{Bytes: 5, Files: 10})
	if err := big.CopyTo(t.TempDir()); !errors.Is(err, ErrQuota) {
		t.Errorf("past the bytes: %v", err)
	}
	many, _ := Directory(src, Quota{Bytes: 100, Files: 3})
	if err := many.CopyTo(t.TempDir()); !errors.Is(err, ErrQuota) {
		t.Errorf("past the names: %v", err)
	}
}

// A host directory attached to a store is its workspace DirectoryID: found by
// Get, written beneath it under the store's quota, never deleted (its files are the
// host's); a store without one has no such workspace.
func TestAttach(t *testing.T) {
	s, err := Open(t.TempDir(), Quota{Bytes: 1 << 20, Files: 100})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(DirectoryID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("before Attach: %v", err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "kept.txt"), []byte("the host's"), 0o644)
	if _, err := s.Attach(dir, 1234); err != nil {
		t.Fatal(err)
	}
	w, err := s.Get(DirectoryID)
	if err != nil || w.Dir() != dir || w.Owner != 1234 || w.ID != DirectoryID {
		t.Fatalf("Get: %+v %v", w, err)
	}
	if _, err := w.Write("new.txt", strings.NewReader("from a caller")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write("big", io.LimitReader(zeros{}, 2<<20)); !errors.Is(err, ErrQuota) {
		t.Fatalf("past the store's quota: %v", err)
	}
	if err := s.Delete(DirectoryID); !errors.Is(err, ErrAttached) || strings.Contains(err.Error(), dir) {
		t.Fatalf("Delete: %v", err)
	}
	if got, err := read(t, w, "kept.txt"); err != nil || got != "the host's" {
		t.Fatalf("after Delete: %q %v", got, err)
	}
	if _, err := s.Attach(filepath.Join(dir, "kept.txt"), 1); err == nil {
		t.Fatal("a file attached")
	}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
