package bundle

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// makeRoot writes a small native root and its manifest under dir/native and
// returns the manifest's digest.
func makeRoot(t *testing.T, dir string) string {
	t.Helper()
	root := filepath.Join(dir, NativeDir, NativeRootDir)
	for _, d := range []string{"usr/bin", "tmp"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	syscall.Chmod(filepath.Join(root, "tmp"), 0o1777)
	os.WriteFile(filepath.Join(root, "usr/bin/python3.13"), []byte("ELF"), 0o755)
	os.WriteFile(filepath.Join(root, "usr/lib.py"), []byte("x = 1\n"), 0o644)
	os.Symlink("python3.13", filepath.Join(root, "usr/bin/python3"))
	var lines []string
	filepath.Walk(root, func(p string, info os.FileInfo, _ error) error {
		rel, _ := filepath.Rel(root, p)
		name := "./" + rel
		if rel == "." {
			name = "."
		}
		mode := info.Mode().Perm()
		if info.Mode()&os.ModeSticky != 0 {
			mode |= 0o1000
		}
		switch {
		case info.IsDir():
			lines = append(lines, fmt.Sprintf("%s\td\t%04o\t0\t-", name, mode))
		case info.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			lines = append(lines, fmt.Sprintf("%s\tl\t0777\t0\t%s", name, target))
		default:
			b, _ := os.ReadFile(p)
			sum := sha256.Sum256(b)
			lines = append(lines, fmt.Sprintf("%s\tf\t%04o\t%d\t%s", name, mode, len(b), hex.EncodeToString(sum[:])))
		}
		return nil
	})
	sort.Strings(lines)
	manifest := []byte(strings.Join(lines, "\n") + "\n")
	os.WriteFile(filepath.Join(dir, NativeDir, NativeManifest), manifest, 0o644)
	sum := sha256.Sum256(manifest)
	return hex.EncodeToString(sum[:])
}

// Every kind of difference between a native root and its manifest is found, by the
// whole verification and by the stamped one (which must notice any change since).
func TestNativeRootVerified(t *testing.T) {
	for name, change := range map[string]func(root string){
		"content, same size": func(r string) { os.WriteFile(filepath.Join(r, "usr/lib.py"), []byte("x = 2\n"), 0o644) },
		"added file":         func(r string) { os.WriteFile(filepath.Join(r, "usr/evil.py"), nil, 0o644) },
		"removed file":       func(r string) { os.Remove(filepath.Join(r, "usr/lib.py")) },
		"mode":               func(r string) { os.Chmod(filepath.Join(r, "usr/lib.py"), 0o666) },
		"setuid":             func(r string) { syscall.Chmod(filepath.Join(r, "usr/bin/python3.13"), 0o4755) },
		"link target": func(r string) {
			os.Remove(filepath.Join(r, "usr/bin/python3"))
			os.Symlink("/usr/bin/sh", filepath.Join(r, "usr/bin/python3"))
		},
		"file made a link": func(r string) {
			os.Remove(filepath.Join(r, "usr/lib.py"))
			os.Symlink("/etc/passwd", filepath.Join(r, "usr/lib.py"))
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			pinned := makeRoot(t, dir)
			if _, err := openNativeStamped(dir, pinned); err != nil {
				t.Fatalf("intact root: %v", err)
			}
			if _, err := os.Stat(filepath.Join(dir, NativeDir, nativeStamp)); err != nil {
				t.Fatalf("no stamp after a whole verification: %v", err)
			}
			time.Sleep(10 * time.Millisecond) // a change time of its own
			change(filepath.Join(dir, NativeDir, NativeRootDir))
			if _, err := openNativeStamped(dir, pinned); err == nil || !strings.Contains(err.Error(), "differs from its manifest") {
				t.Fatalf("stamped: %v", err)
			}
			if _, err := openNative(dir, pinned); err == nil {
				t.Fatal("whole: no error")
			}
		})
	}
	dir := t.TempDir()
	pinned := makeRoot(t, dir)
	if _, err := openNative(dir, strings.Repeat("0", 64)); err == nil || !strings.Contains(err.Error(), "pinned") {
		t.Fatalf("another manifest: %v", err)
	}
	os.RemoveAll(filepath.Join(dir, NativeDir))
	if _, err := openNative(dir, pinned); err != ErrNoNative {
		t.Fatalf("no native root: %v", err)
	}
}
