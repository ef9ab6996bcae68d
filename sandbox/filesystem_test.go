package sandbox_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/bundle/bundletest"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// fsProbe defines t(label, f, *args), which prints the label and what the call
// returned ("ok" and a short form of the value) or the errno's name of the OSError it
// raised. The working directory is the workspace (the guest's /ws); "@" in a label or
// path stands for it, so the same script runs in the guest and under the host's
// python3.
const fsProbe = `import errno, os, shutil, stat, sys
WS = os.getcwd()
def r(p): return p.replace("@", WS)
def t(label, f, *a, **k):
    try:
        v = f(*a, **k)
        if isinstance(v, list): v = sorted(v)
        if isinstance(v, os.stat_result): v = "dir" if stat.S_ISDIR(v.st_mode) else "file"
        if isinstance(v, str): v = v.replace(WS, "@")
        if hasattr(v, "close"):
            v.close()
            v = type(v).__name__
        print(label, "ok", v)
    except OSError as e:
        print(label, type(e).__name__, errno.errorcode.get(e.errno))
`

// trailingSlashes are calls with a trailing "/" (and their neighbours), each as
// Linux answers it.
const trailingSlashes = fsProbe + `
os.makedirs("full/sub"); open("full/f", "w").close()
for d in ("empty", "empty2", "empty3"): os.mkdir(d)
open("file", "w").close()
t("mkdir new/", os.mkdir, "new/")
t("mkdir new// again", os.mkdir, "new//")
t("mkdir @/new2/", os.mkdir, r("@/new2/"))
t("mkdir file/", os.mkdir, "file/")
t("mkdir missing/x/", os.mkdir, "missing/x/")
t("makedirs x/y/z/", os.makedirs, "x/y/z/")
t("makedirs x/y/z/ exist_ok", os.makedirs, "x/y/z/", exist_ok=True)
t("makedirs x/y/z/ again", os.makedirs, "x/y/z/")
t("listdir full/", os.listdir, "full/")
t("listdir full//", os.listdir, "full//")
t("listdir @/full/", os.listdir, r("@/full/"))
t("listdir file/", os.listdir, "file/")
t("listdir missing/", os.listdir, "missing/")
t("scandir full/", lambda p: sorted(e.name for e in os.scandir(p)), "full/")
t("stat full/", os.stat, "full/")
t("stat file/", os.stat, "file/")
t("lstat file/", os.lstat, "file/")
t("isdir full/", os.path.isdir, "full/")
t("exists file/", os.path.exists, "file/")
t("open file/", open, "file/")
t("open newfile/ w", open, "newfile/", "w")
t("open full/", open, "full/")
t("utime file/", os.utime, "file/")
t("rmdir empty/", os.rmdir, "empty/")
t("rmdir @/empty2/", os.rmdir, r("@/empty2/"))
t("rmdir empty3//", os.rmdir, "empty3//")
t("rmdir full/", os.rmdir, "full/")
t("rmdir full", os.rmdir, "full")
t("rmdir full/sub/", os.rmdir, "full/sub/")
t("rmdir file/", os.rmdir, "file/")
t("rmdir file", os.rmdir, "file")
t("rmdir missing/", os.rmdir, "missing/")
t("rmdir .", os.rmdir, ".")
t("rmdir x/.", os.rmdir, "x/.")
t("rmdir x/./", os.rmdir, "x/./")
t("rmdir ..", os.rmdir, "..")
t("rmdir x/y/..", os.rmdir, "x/y/..")
t("rmdir b'x/y/z/'", os.rmdir, b"x/y/z/")
os.makedirs("x/y/z")
import pathlib
t("Path(x/y/z/).rmdir", pathlib.Path("x/y/z/").rmdir)
os.makedirs("x/y/z")
t("rmdir z/ dir_fd", lambda: os.rmdir("z/", dir_fd=os.open("x/y", os.O_RDONLY)))
t("removedirs x/y/", os.removedirs, "x/y/")
t("unlink file/", os.unlink, "file/")
t("unlink full/", os.unlink, "full/")
t("remove full/", os.remove, "full/")
os.mkdir("r1"); open("r1/a", "w").close()
t("rename r1/ r2", os.rename, "r1/", "r2")
t("rename r2 r3/", os.rename, "r2", "r3/")
t("rename r3/ r4/", os.rename, "r3/", "r4/")
t("rename file/ file2", os.rename, "file/", "file2")
t("rename file file2/", os.rename, "file", "file2/")
t("replace file file2/", os.replace, "file", "file2/")
t("replace r4/ r5/", os.replace, "r4/", "r5/")
os.mkdir("r6")
t("rename r5/ r6/ (onto an empty directory)", os.rename, "r5/", "r6/")
t("listdir r6", os.listdir, "r6")
t("rmtree full/", shutil.rmtree, "full/")
t("exists full", os.path.exists, "full")
os.makedirs("t1/a/b"); open("t1/a/f", "w").close()
t("rmtree @/t1/", shutil.rmtree, r("@/t1/"))
os.makedirs("t1/a/b"); open("t1/a/f", "w").close()
t("copytree t1/ t2/", lambda: shutil.copytree("t1/", "t2/") and None)
t("move t2/ t3/", lambda: shutil.move("t2/", "t3/") and None)
t("walk t1/", lambda: [(d, sorted(ds), sorted(fs)) for d, ds, fs in os.walk("t1/")])
t("chdir t1/", os.chdir, "t1/")
t("getcwd", os.getcwd)
t("chdir a/../", os.chdir, "a/../")
t("getcwd", os.getcwd)
t("chdir ..", os.chdir, "..")
t("getcwd", os.getcwd)
t("rmtree missing/", shutil.rmtree, "missing/")
t("listdir .", os.listdir, ".")
`

// What Linux (CPython on a Linux file system, any user) prints for trailingSlashes.
const trailingSlashesOnLinux = `mkdir new/ ok None
mkdir new// again FileExistsError EEXIST
mkdir @/new2/ ok None
mkdir file/ FileExistsError EEXIST
mkdir missing/x/ FileNotFoundError ENOENT
makedirs x/y/z/ ok None
makedirs x/y/z/ exist_ok ok None
makedirs x/y/z/ again FileExistsError EEXIST
listdir full/ ok ['f', 'sub']
listdir full// ok ['f', 'sub']
listdir @/full/ ok ['f', 'sub']
listdir file/ NotADirectoryError ENOTDIR
listdir missing/ FileNotFoundError ENOENT
scandir full/ ok ['f', 'sub']
stat full/ ok dir
stat file/ NotADirectoryError ENOTDIR
lstat file/ NotADirectoryError ENOTDIR
isdir full/ ok True
exists file/ ok False
open file/ NotADirectoryError ENOTDIR
open newfile/ w IsADirectoryError EISDIR
open full/ IsADirectoryError EISDIR
utime file/ NotADirectoryError ENOTDIR
rmdir empty/ ok None
rmdir @/empty2/ ok None
rmdir empty3// ok None
rmdir full/ OSError ENOTEMPTY
rmdir full OSError ENOTEMPTY
rmdir full/sub/ ok None
rmdir file/ NotADirectoryError ENOTDIR
rmdir file NotADirectoryError ENOTDIR
rmdir missing/ FileNotFoundError ENOENT
rmdir . OSError EINVAL
rmdir x/. OSError EINVAL
rmdir x/./ OSError EINVAL
rmdir .. OSError ENOTEMPTY
rmdir x/y/.. OSError ENOTEMPTY
rmdir b'x/y/z/' ok None
Path(x/y/z/).rmdir ok None
rmdir z/ dir_fd ok None
removedirs x/y/ ok None
unlink file/ NotADirectoryError ENOTDIR
unlink full/ IsADirectoryError EISDIR
remove full/ IsADirectoryError EISDIR
rename r1/ r2 ok None
rename r2 r3/ ok None
rename r3/ r4/ ok None
rename file/ file2 NotADirectoryError ENOTDIR
rename file file2/ NotADirectoryError ENOTDIR
replace file file2/ NotADirectoryError ENOTDIR
replace r4/ r5/ ok None
rename r5/ r6/ (onto an empty directory) ok None
listdir r6 ok ['a']
rmtree full/ ok None
exists full ok False
rmtree @/t1/ ok None
copytree t1/ t2/ ok None
move t2/ t3/ ok None
walk t1/ ok [('t1/', ['a'], []), ('t1/a', ['b'], ['f']), ('t1/a/b', [], [])]
chdir t1/ ok None
getcwd ok @/t1
chdir a/../ ok None
getcwd ok @/t1
chdir .. ok None
getcwd ok @
rmtree missing/ FileNotFoundError ENOENT
listdir . ok ['file', 'new', 'new2', 'r6', 't1', 't3']
`

// A path with a trailing "/" means what it means on Linux, errno included: rmdir
// ("d/", which wasmtime's WASI took for rmdir of "." in d: EINVAL, even for a
// directory that is not empty), shutil.rmtree("d/"), a rename with a trailing slash
// whose source is a file (which wasmtime renamed), os.getcwd() after chdir("d/").
// The expectation is what the host's CPython prints in a directory of its own; the
// test runs the script there too when the host has a python3.
func TestTrailingSlashesAsOnLinux(t *testing.T) {
	t.Parallel()
	res, _ := run(t, trailingSlashes, nil)
	wantOutput(t, res, trailingSlashesOnLinux)
	if py, err := exec.LookPath("python3"); err == nil {
		cmd := exec.Command(py, "-c", trailingSlashes)
		cmd.Dir = t.TempDir()
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != trailingSlashesOnLinux {
			t.Fatalf("the host's python3 (%s) prints otherwise (%v):\n%s", py, err, out)
		}
	}
}

// outside are changes and reads of paths outside /ws and /tmp.
const outside = fsProbe + `
open("/ws/f", "w").close()
t("open /etc/passwd", open, "/etc/passwd")
t("open /etc/passwd w", open, "/etc/passwd", "w")
t("listdir /usr", os.listdir, "/usr")
t("stat /nonexistent", os.stat, "/nonexistent")
t("open ../x", open, "../x")
t("open ../x w", open, "../x", "w")
t("open /x w", open, "/x", "w")
t("open /x x", open, "/x", "x")
t("os.open /x", os.open, "/x", os.O_CREAT | os.O_WRONLY)
t("open / w", open, "/", "w")
t("mkdir /x", os.mkdir, "/x")
t("mkdir ../x", os.mkdir, "../x")
t("mkdir /ws", os.mkdir, "/ws")
t("mkdir /etc/x", os.mkdir, "/etc/x")
t("makedirs /a/b", os.makedirs, "/a/b")
t("rmdir /ws", os.rmdir, "/ws")
t("rmdir /tmp/", os.rmdir, "/tmp/")
t("rmdir /", os.rmdir, "/")
t("rmdir /x", os.rmdir, "/x")
t("unlink /ws", os.unlink, "/ws")
t("unlink /x", os.unlink, "/x")
t("rename /ws /x", os.rename, "/ws", "/x")
t("rename /ws/f /f", os.rename, "/ws/f", "/f")
t("rename /ws/f ../f", os.rename, "/ws/f", "../f")
t("rename /x /ws/y", os.rename, "/x", "/ws/y")
t("link /ws/f /g", os.link, "/ws/f", "/g")
t("link /ws/missing /g", os.link, "/ws/missing", "/g")
t("link /ws/f /tmp", os.link, "/ws/f", "/tmp")
t("symlink /ws/f /g", os.symlink, "/ws/f", "/g")
t("symlink f /tmp", os.symlink, "f", "/tmp")
t("open /tmp xw", os.open, "/tmp", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
t("utime /", os.utime, "/")
t("utime /ws", os.utime, "/ws")
t("utime /x", os.utime, "/x")
t("rmtree /tmp", shutil.rmtree, "/tmp")
t("chdir /", os.chdir, "/")
t("open x w (in /)", open, "x", "w")
t("rmdir ws (in /)", os.rmdir, "ws")
t("mkdir x dir_fd /", lambda: os.mkdir("x", dir_fd=os.open("/", os.O_RDONLY)))
t("listdir /", os.listdir, "/")
`

// What the guest prints for outside. Linux, for a user other than root, says EACCES
// for every change in a directory that is not theirs (as here in "/"); ENOENT where
// the guest has no such directory (/etc, /usr: Linux would read /etc/passwd, and
// refuse its change with EACCES); EBUSY, EINVAL and ENOTEMPTY for rmdir of "/", "."
// and ".." whoever asks.
const outsideInGuest = `open /etc/passwd FileNotFoundError ENOENT
open /etc/passwd w FileNotFoundError ENOENT
listdir /usr FileNotFoundError ENOENT
stat /nonexistent FileNotFoundError ENOENT
open ../x FileNotFoundError ENOENT
open ../x w PermissionError EACCES
open /x w PermissionError EACCES
open /x x PermissionError EACCES
os.open /x PermissionError EACCES
open / w IsADirectoryError EISDIR
mkdir /x PermissionError EACCES
mkdir ../x PermissionError EACCES
mkdir /ws FileExistsError EEXIST
mkdir /etc/x FileNotFoundError ENOENT
makedirs /a/b PermissionError EACCES
rmdir /ws PermissionError EACCES
rmdir /tmp/ PermissionError EACCES
rmdir / OSError EBUSY
rmdir /x FileNotFoundError ENOENT
unlink /ws PermissionError EACCES
unlink /x FileNotFoundError ENOENT
rename /ws /x PermissionError EACCES
rename /ws/f /f PermissionError EACCES
rename /ws/f ../f PermissionError EACCES
rename /x /ws/y FileNotFoundError ENOENT
link /ws/f /g PermissionError EACCES
link /ws/missing /g FileNotFoundError ENOENT
link /ws/f /tmp FileExistsError EEXIST
symlink /ws/f /g PermissionError EACCES
symlink f /tmp FileExistsError EEXIST
open /tmp xw FileExistsError EEXIST
utime / PermissionError EACCES
utime /ws ok None
utime /x FileNotFoundError ENOENT
rmtree /tmp PermissionError EACCES
chdir / ok None
open x w (in /) PermissionError EACCES
rmdir ws (in /) PermissionError EACCES
mkdir x dir_fd / PermissionError EACCES
listdir / ok ['tmp', 'ws']
`

// Outside /ws and /tmp the guest's "/" is read-only: a change there is refused with
// EACCES, as Linux refuses a user other than root, never EIO (what wasmtime's WASI
// made of the host's EROFS); what is not there is ENOENT.
func TestOutsideWorkspaceAsOnLinux(t *testing.T) {
	t.Parallel()
	res, _ := run(t, outside, nil)
	wantOutput(t, res, outsideInGuest)
	// Without a mount namespace of its own (a policy that allows it) the guest's
	// "/" is not there at all (ENOENT) and wasmtime refuses a path that leaves /ws
	// (EPERM): nothing is EIO either.
	res, _ = run(t, outside, func(r *protocol.Request) {
		limits, _ := policy.Default().Resolve(r.Limits)
		r.Hardening = policy.Default().Hardening(limits)
		r.Hardening.Namespaces, r.Hardening.Require = false, nil
	})
	wantExit(t, res, 0)
	if out := string(res.Stdout); strings.Contains(out, "EIO") || !strings.Contains(out, "open /x w FileNotFoundError ENOENT\n") {
		t.Fatalf("without a mount namespace:\n%s", out)
	}
}

// Every run has a private, writable /tmp: tempfile works there (not in /ws); two
// runs at once never see each other's, and a run's is gone when it ends; it is
// bounded by the workspace's quota; a rename between /ws and /tmp fails with EXDEV,
// as between two file systems, and shutil.move copies.
func TestPrivateTmp(t *testing.T) {
	t.Parallel()
	code := `import os, sys, tempfile, shutil, time, errno
name = sys.argv[1]
print(tempfile.gettempdir(), os.listdir("/tmp"))
fd, p = tempfile.mkstemp(suffix=".txt")
os.write(fd, b"mkstemp"); os.close(fd)
with tempfile.NamedTemporaryFile("w+", delete=True) as f:
    f.write("named"); f.flush(); f.seek(0)
    print(f.read(), os.path.dirname(f.name))
with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, "x"), "w").write("x")
    print(os.path.dirname(d), os.listdir(d))
print(os.path.exists(d), open(p).read(), os.path.dirname(p))
open("/tmp/" + name, "w").write(name)
open("/ws/moved", "w").write("m")
try:
    os.rename("/ws/moved", "/tmp/moved")
except OSError as e:
    print("rename", errno.errorcode[e.errno])
shutil.move("/ws/moved", "/tmp/moved")
time.sleep(1)  # the other run writes its file meanwhile
print(sorted(n for n in os.listdir("/tmp") if not n.startswith("tmp")), os.listdir("/ws"))
try:
    with open("/tmp/big", "wb") as f:
        f.write(b"x" * (2 << 20))
except OSError as e:
    print("big", errno.errorcode[e.errno])
`
	quota := func(args ...string) func(*protocol.Request) {
		return func(r *protocol.Request) { r.Args, r.WorkspaceQuota = args, 1<<20 }
	}
	var wg sync.WaitGroup
	out := make([]protocol.Result, 2)
	for i, name := range []string{"first", "second"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], _ = run(t, code, quota(name))
		}()
	}
	wg.Wait()
	for i, kept := range []string{"'first', 'moved'", "'moved', 'second'"} {
		want := "/tmp []\nnamed /tmp\n/tmp ['x']\nFalse mkstemp /tmp\nrename EXDEV\n[" + kept + "] []\nbig ENOSPC\n"
		wantOutput(t, out[i], want)
	}
	res, _ := run(t, "import os; print(os.listdir('/tmp'))", nil)
	wantOutput(t, res, "[]\n")

	// A quota of gigabytes does not size /tmp (memory that no memory limit counts):
	// it stays protocol.DefaultTmpBytes.
	res, _ = run(t, `import errno
n = 0
try:
    with open("/tmp/big", "wb") as f:
        for _ in range(128):
            f.write(b"x" * (1 << 20)); f.flush(); n += 1
except OSError as e:
    print(n, errno.errorcode[e.errno])`, func(r *protocol.Request) { r.WorkspaceQuota = 8 << 30 })
	wantOutput(t, res, fmt.Sprintf("%d ENOSPC\n", protocol.DefaultTmpBytes>>20))
}

// shutil.disk_usage (CPython has it only where os.statvfs is, which WASI lacks)
// reports the workspace's quota: total, what /ws and /tmp hold, and the rest, for
// any path; without a quota, /tmp its own size and the workspace its file system's
// figures. A path that is not there fails as statvfs would.
func TestDiskUsage(t *testing.T) {
	t.Parallel()
	code := `import os, shutil, sys
os.makedirs("/ws/sub")
open("/ws/sub/a", "wb").write(b"x" * 300000)
open("/tmp/b", "wb").write(b"y" * 200000)
u = shutil.disk_usage("/ws")
print(type(u).__name__, u._fields, u == shutil.disk_usage("/ws/sub") == shutil.disk_usage("."))
print(*u)
print(*shutil.disk_usage("/tmp"))
try:
    shutil.disk_usage("/ws/missing")
except FileNotFoundError as e:
    print("missing", e.filename)
print("disk_usage" in shutil.__all__)
`
	res, _ := run(t, code, func(r *protocol.Request) {
		r.WorkspaceQuota = 10 << 20
		r.Env = map[string]string{"SANDCELL_QUOTA": "1"} // nothing in the environment counts
	})
	q := 10 << 20
	wantOutput(t, res, fmt.Sprintf("usage ('total', 'used', 'free') True\n%d 500000 %d\n%d 500000 %d\nmissing /ws/missing\nTrue\n",
		q, q-500000, q, q-500000))

	res, ws := run(t, code, nil)
	wantExit(t, res, 0)
	lines := strings.Split(string(res.Stdout), "\n")
	var st unix.Statfs_t
	if err := unix.Statfs(ws, &st); err != nil {
		t.Fatal(err)
	}
	var total, used, free int64
	if len(lines) > 1 {
		fmt.Sscan(lines[1], &total, &used, &free)
	}
	if len(lines) < 3 || total != int64(st.Blocks)*st.Frsize || used <= 0 || free <= 0 {
		t.Fatalf("without a quota, the workspace's file system (%d bytes): %q", int64(st.Blocks)*st.Frsize, res.Stdout)
	}
	if want := fmt.Sprintf("%d 200000 %d", protocol.DefaultTmpBytes, protocol.DefaultTmpBytes-200000); lines[2] != want {
		t.Fatalf("/tmp without a quota: %q, want %q", lines[2], want)
	}
}

// pbkdf2Vectors are hash, password (hex), salt (hex), iterations, dklen (-1: none)
// and the key (hex): RFC 6070's (but the one of 16777216 iterations) and random
// ones of sha1, sha256, sha512 and others, with the keys CPython 3.13 and OpenSSL
// derive on the host.
const pbkdf2Vectors = `[
["sha1", "70617373776f7264", "73616c74", 1, 20, "0c60c80f961f0e71f3a9b524af6012062fe037a6"],
["sha1", "70617373776f7264", "73616c74", 2, 20, "ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957"],
["sha1", "70617373776f7264", "73616c74", 4096, 20, "4b007901b765489abead49d926f721d065a429c1"],
["sha1", "70617373776f726450415353574f524470617373776f7264", "73616c7453414c5473616c7453414c5473616c7453414c5473616c7453414c5473616c74", 4096, 25, "3d2eec4fe41c849b80c8d83662c0e44a8b291a964cf2f07038"],
["sha1", "7061737300776f7264", "7361006c74", 4096, 16, "56fa6aa75548099dcc37d7f03425e0c3"],
["sha1", "9f05437978049a", "12aa4d4f2622aa9ebeffd372e294da39c445c0f259b2668ef0f267dba87028328d", 3, 33, "6e7b11f6897dadc3bbb3b0ed80657bf4be7f0ae4f715830a53036d70d751991a67"],
["sha1", "c3eb8e86e84d8cef00ca64ee9d5dc13d3822a55224e67e75cfa82d47d9e75b63d3a021c2d6ce263b91874e6824d617f7e0530c3675f1a0d159da899fc96d0388b515880d95c9cfd627cfb3acda74e5035411ae37675bd60f3451e4cb6a99832f2e1e643eaff5aa39b47ef7a90611d5f1fcd29aaa16bc637d54895c6e9373a9bf", "3b726e8ae3318c0dbb05b8a136bdea6210f6a4dd3f7d887886f57e6687cd158f47", 2, 64, "e9787644007d99981778bb5179dad7ac3e9b5d9c49f332a05e33a76510e0f25d9214151eafd895f27b14fdfb1dae3936b9bc84aadb92b1d367439635d255e341"],
["sha1", "23", "3c0fc8f24d5f66942933ded2140d10e1", 1, -1, "11bd619e2662bb3952d7b79cdec8d831d55c7dba"],
["sha1", "2dc5604a55d9e2200dd21aa9265263e216e9802e77eb15f58c867b38071fb4df14c28e84ca772b8ecaa4b0f0ff94ca15da686e93433b0c2cbf1f503e9d90a8c37e", "", 3, 64, "5981a4e14fb0184b67431f9b218ad1ec7269b65b7d519fc8149af5b12c48c29d28833ab7d4cfa3e4903c865c7d5d26591aa96b41340ae3061dcf3174bcec616c"],
["sha256", "", "", 3, -1, "b372796454d37ac042a195b62eeb7cfed38ddd92f757e2fee04210df03ac1d2e"],
["sha256", "5313efb424f80e2fd5533cb068791c865b7d6d73fccd1f77c4777942cab9ad983cdcf9e66fc0fd23ecf389c91983f8827c95667be8ec3ed2b4f96c86beb2efd4f20c63c8c67005a1a17077cb4efc3a50125c23726b06ccbdc1eb1974e01cc54a473ee993fa1902bfd8e2d3782d1994c20e7a5da5998e67b6679f08dd200aa4024c", "", 2, 16, "4a330108697680af1bfeac209afea149"],
["sha256", "b5288c78981edb5a1d25085c8e1b25b16d7225148f9b6992221cf7ca11bd00992cdc6382a58fb1748ded356ca7809450b5dde68a4f038f51c7a43fb921ea77a6", "2c0d0aa7fd5be582", 2, 16, "5aa09d6308a9c91ea3d65bc2b0801539"],
["sha256", "b03197e10f5224136db1af001cf88194bdea90d07efa5bd3a42c485dfdc8b4c764a06d36fdcd617b80f6f22c13f129dd1cac353918a67f4ffe18b987976c5bde", "0261eccfd89d58496b92e050b578c274", 1500, 1, "6c"],
["sha512", "2f1113bfcd02b66ed4a37fb06f5f2c0802f88c7ff8c0dec907065541e345336d189b3be692acf7704861294e5d3a525c9be9aabeb6be3c4799dabe332c53ba14", "9331d646a51ef05a", 3, 100, "48ba33872502a1bc1d367724c1691c0d6009914da1923500cb869dd413a62b66a50b941ba55345b005a8abd6e6213686a45bcbf7b8d309f04d17aa41ef1e8ec1c7c8da82eaffc2b426ab36ff4d8ba9b304267b8cc83a87f6bedd3d29c25658307fc3a03c"],
["sha512", "b4", "", 1, -1, "4c9322276aabef337a48ddd3aa67c848e8b18113e46062c3dcfcf825503095b5b60dcb2f343e04ee4b46dd8cd518ea7ce62da582aec1d7a55b7c7a6eb546a120"],
["sha512", "8d", "b92c88b4ea6a661f908eb6685b8c59a7ac5edfc2c237becee7045fdd5d661102dd", 2, 16, "8543621575bcec81e5660e4bee21ea22"],
["sha512", "1345574e9866849cafd1b3b9bb960b686af81991ca77608f1a3f7c5fd92cf5280350faf3f64afbe04bc25d9a367cdb2f911339a58ba60bf0c082669a472be006545852cb3f5f90054177119320b0ef3a82ed7de0bd79270ee1fc67ee0bfa292a03bf8dc80ac4d035e5e7f0be88076c3b1fd80739313d26a76c74413d7cfd7769ac8c82a8a28ec188c0396dbdd134fee11d740a303ae44540edfa2c41cb3a415d7e5342c860508793645ece5ea897f41fe2edaa870ffe8914e65c6f32fdf89f971409d02065ef6242", "e85de31f8c31e5adc271a146c2ef6826b3acf0fef0185287630c1dd663aec6ec01", 1000, 16, "19680f668456dd81076292d39eda650b"],
["md5", "70", "73", 10, -1, "57e8393d7fed838e7692d8915029d103"],
["sha3_256", "70", "73", 10, 50, "4c586d5b42a47a2a3c766df8897dc00ecec5ec9f1ffc8270631bcd4c4d937b00e15539a103faefec4e3332885789911c4c7c"]
]`

// pbkdf2Program prints the key hashlib.pbkdf2_hmac derives for each of the JSON
// vectors on stdin (hash, password hex, salt hex, iterations, dklen or -1), one a
// line.
const pbkdf2Program = `import hashlib, json, sys
for name, pw, salt, n, dklen, *_ in json.load(sys.stdin):
    print(hashlib.pbkdf2_hmac(name, bytes.fromhex(pw), bytes.fromhex(salt), n, None if dklen < 0 else dklen).hex())
`

// hashlib.pbkdf2_hmac, which CPython takes from OpenSSL (absent here) since 3.12,
// derives the keys OpenSSL derives (RFC 6070's, and random ones, also against the
// host's python3 when it has one), refuses what CPython refuses, and 100,000 rounds
// of SHA-256 take well under the run's time.
func TestPBKDF2(t *testing.T) {
	t.Parallel()
	var vectors [][]any
	if err := json.Unmarshal([]byte(pbkdf2Vectors), &vectors); err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for _, v := range vectors {
		want.WriteString(v[5].(string) + "\n")
	}
	res, _ := run(t, pbkdf2Program, func(r *protocol.Request) { r.Stdin = []byte(pbkdf2Vectors) })
	wantOutput(t, res, want.String())

	if py, err := exec.LookPath("python3"); err == nil {
		var random [][]any
		for i := range 24 {
			pw, salt := make([]byte, []int{0, 3, 64, 65, 129, 200}[i%6]), make([]byte, []int{0, 8, 16, 33}[i%4])
			rand.Read(pw)
			rand.Read(salt)
			random = append(random, []any{[]string{"sha1", "sha256", "sha512"}[i%3], hex.EncodeToString(pw),
				hex.EncodeToString(salt), []int{1, 2, 7, 1000}[i%4], []int{-1, 1, 20, 32, 64, 100}[i%6]})
		}
		in, _ := json.Marshal(random)
		cmd := exec.Command(py, "-c", pbkdf2Program)
		cmd.Stdin = strings.NewReader(string(in))
		host, err := cmd.Output()
		if err != nil {
			t.Fatalf("the host's python3: %v", err)
		}
		res, _ := run(t, pbkdf2Program, func(r *protocol.Request) { r.Stdin = in })
		wantOutput(t, res, string(host))
	}

	res, _ = run(t, `import hashlib, time
for a in [("sha256", "text", b"s", 1), ("sha256", b"p", b"s", 0), ("sha256", b"p", b"s", 1.0), ("sha256", b"p", b"s", 1, 0),
          ("nope", b"p", b"s", 1), (b"sha256", b"p", b"s", 1), ("sha256", b"p", b"s", 2**32)]:
    try:
        hashlib.pbkdf2_hmac(*a)
    except Exception as e:
        print(type(e).__name__, e)
print(hashlib.pbkdf2_hmac(hash_name="SHA256", password=bytearray(b"p"), salt=memoryview(b"s"), iterations=1, dklen=5).hex())
start = time.perf_counter()
print(hashlib.pbkdf2_hmac("sha256", b"password", b"salt", 100000).hex())
print("pbkdf2_hmac" in hashlib.__all__, time.perf_counter() - start)
`, nil)
	wantExit(t, res, 0)
	want2 := "TypeError a bytes-like object is required, not 'str'\n" +
		"ValueError iteration value must be greater than 0.\n" +
		"TypeError 'float' object cannot be interpreted as an integer\n" +
		"ValueError key length must be greater than 0.\n" +
		"ValueError unsupported hash type nope\n" +
		"TypeError pbkdf2_hmac() argument 'hash_name' must be str, not bytes\n" +
		"OverflowError iteration value is too great.\n" +
		"372cc98152\n" +
		"0394a2ede332c9a13eb82e9b24631604c31df978b4e2f0fbd2c549944f9d79a5\n"
	got, last, _ := strings.Cut(string(res.Stdout), "\nTrue ")
	if got+"\n" != want2 {
		t.Fatalf("stdout:\n%s\nwant:\n%s", res.Stdout, want2)
	}
	var secs float64
	if _, err := fmt.Sscan(last, &secs); err != nil || secs > 5 {
		t.Fatalf("100,000 rounds of SHA-256: %q", last)
	}
	t.Logf("100,000 rounds of SHA-256: %.2f s", secs)
}

// A session's cells share one /tmp, its own (another session's is another), and
// disk_usage reports the session's quota.
func TestSessionTmp(t *testing.T) {
	open := func() *sandbox.Session {
		limits, err := policy.Default().Resolve(protocol.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		req := protocol.Request{Workspace: t.TempDir(), Limits: limits, Hardening: policy.Default().Hardening(limits),
			ModulePath: bundletest.Module(t, false), LibDir: bundletest.LibDir(t), WorkspaceQuota: 8 << 20}
		ss, err := sandbox.NewSpawner().OpenSession(context.Background(), req)
		if err != nil {
			t.Fatalf("open session: %v", err)
		}
		t.Cleanup(func() { ss.Close() })
		return ss
	}
	a, b := open(), open()
	if res := cell(t, a, "open('/tmp/kept', 'w').write('a' * 1000)", nil); res.Reason != protocol.Exited {
		t.Fatalf("%s %q", res.Reason, res.Stderr)
	}
	res := cell(t, a, "import shutil; print(open('/tmp/kept').read(4), shutil.disk_usage('/tmp'))", nil)
	if want := fmt.Sprintf("aaaa usage(total=%d, used=1000, free=%d)\n", 8<<20, 8<<20-1000); string(res.Stdout) != want {
		t.Fatalf("%q %q, want %q", res.Stdout, res.Stderr, want)
	}
	if res := cell(t, b, "import os; print(os.listdir('/tmp'))", nil); string(res.Stdout) != "[]\n" {
		t.Fatalf("another session's /tmp: %q %q", res.Stdout, res.Stderr)
	}
}

// A listing of a directory of thousands of names, of every length to the longest a
// name may have, is the host's: os.listdir (twice), os.scandir's kinds, os.walk and
// glob. The interpreter
// reads a directory with a buffer of its own that grows (bundle/interpreter/
// sandcell.c), so entries are cut at the buffer's end and read again, and a listing
// takes a few reads of the directory instead of one per 4 KiB of names (which made
// a listing of 2,000 names take seconds).
func TestDirectoryListing(t *testing.T) {
	t.Parallel()
	// Each list is printed as the SHA-256 of its lines, sorted (the whole would pass
	// the output limit).
	res, ws := run(t, `import hashlib, json, os, pathlib
def digest(lines):
    return [len(lines), hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()]
with os.scandir("/ws/d") as it:
    kinds = [e.name + ":" + ("d" if e.is_dir(follow_symlinks=False) else "f") for e in it]
walked = [os.path.relpath(os.path.join(top, n), "/ws") for top, dirs, files in os.walk("/ws") for n in dirs + files]
print(json.dumps({"names": digest(os.listdir("/ws/d")), "again": digest(os.listdir("/ws/d")), "kinds": digest(kinds),
                  "walked": digest(walked), "glob": digest([p.name for p in pathlib.Path("/ws/d").glob("*")]),
                  "empty": os.listdir("/ws/empty")}))
`, func(r *protocol.Request) {
		d := filepath.Join(r.Workspace, "d")
		if err := os.MkdirAll(filepath.Join(r.Workspace, "empty"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range 3000 {
			name := fmt.Sprintf("%04d", i) + strings.Repeat("x", i%252)
			if i%100 == 0 {
				if err := os.Mkdir(filepath.Join(d, name), 0o755); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := os.WriteFile(filepath.Join(d, name), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})
	wantExit(t, res, 0)
	var got struct {
		Names, Again, Kinds, Walked, Glob []any
		Empty                             []string
	}
	if err := json.Unmarshal(res.Stdout, &got); err != nil {
		t.Fatalf("%v: %s %s", err, res.Stdout, res.Stderr)
	}
	digest := func(lines []string) []any {
		slices.Sort(lines)
		sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
		return []any{float64(len(lines)), hex.EncodeToString(sum[:])}
	}
	entries, err := os.ReadDir(filepath.Join(ws, "d"))
	if err != nil {
		t.Fatal(err)
	}
	var names, kinds []string
	for _, e := range entries {
		names = append(names, e.Name())
		kinds = append(kinds, e.Name()+":"+map[bool]string{true: "d", false: "f"}[e.IsDir()])
	}
	var walked []string
	filepath.WalkDir(ws, func(p string, _ fs.DirEntry, err error) error {
		if p != ws {
			rel, _ := filepath.Rel(ws, p)
			walked = append(walked, rel)
		}
		return err
	})
	want := digest(names)
	switch {
	case len(names) != 3000 || !slices.Equal(got.Names, want) || !slices.Equal(got.Again, want):
		t.Fatalf("os.listdir: %v and %v, want %v", got.Names, got.Again, want)
	case !slices.Equal(got.Kinds, digest(kinds)):
		t.Fatalf("os.scandir's kinds: %v, want %v", got.Kinds, digest(kinds))
	case !slices.Equal(got.Walked, digest(walked)):
		t.Fatalf("os.walk: %v, want %v", got.Walked, digest(walked))
	case !slices.Equal(got.Glob, want) || len(got.Empty) != 0:
		t.Fatalf("glob %v, empty directory %q", got.Glob, got.Empty)
	}
}
