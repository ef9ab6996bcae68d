package api_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

func (d *daemon) newWorkspace(t *testing.T) string {
	t.Helper()
	resp, body := d.do(t, "POST", "/v1/workspaces", "")
	var w struct{ ID string }
	if resp.StatusCode != 201 || json.Unmarshal(body, &w) != nil || w.ID == "" ||
		resp.Header.Get("Location") != "/v1/workspaces/"+w.ID {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	return w.ID
}

func (d *daemon) run(t *testing.T, body string) wire.View {
	t.Helper()
	resp, b := d.do(t, "POST", "/v1/runs", body)
	var v wire.View
	if resp.StatusCode != 200 || json.Unmarshal(b, &v) != nil || v.Result == nil {
		t.Fatalf("run: %d %s", resp.StatusCode, b)
	}
	return v
}

func TestWorkspaceFiles(t *testing.T) {
	d := start(t, setup{})
	id := d.newWorkspace(t)
	files := "/v1/workspaces/" + id + "/files/"
	if resp, body := d.do(t, "PUT", files+"data/in%20put.txt", "hello"); resp.StatusCode != 201 ||
		!bytes.Contains(body, []byte(`"path":"data/in put.txt"`)) {
		t.Fatalf("put: %d %s", resp.StatusCode, body)
	}
	v := d.run(t, `{"workspace":"`+id+`","code":"s = open('data/in put.txt').read()\nopen('out.txt', 'w').write(s.upper())\nprint(s)"}`)
	if string(v.Result.Stdout) != "hello\n" {
		t.Fatalf("run: %+v", v.Result)
	}
	if resp, body := d.do(t, "GET", files+"out.txt", ""); resp.StatusCode != 200 || string(body) != "HELLO" ||
		resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("get: %d %s", resp.StatusCode, body)
	}
	resp, body := d.do(t, "GET", "/v1/workspaces/"+id, "")
	var info struct {
		Usage     workspace.Usage
		Files     []workspace.File
		OverQuota bool `json:"over_quota"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &info) != nil || info.Usage != (workspace.Usage{Bytes: 10, Files: 3}) ||
		len(info.Files) != 3 || info.OverQuota {
		t.Fatalf("list: %d %s", resp.StatusCode, body)
	}
	for _, p := range []string{"..%2F..%2Fetc%2Fpasswd", "a//b", "./a", "%00"} {
		resp, body := d.do(t, "GET", files+p, "")
		wantProblem(t, resp, body, 400, "bad_request")
	}
	resp, body = d.do(t, "GET", files+"missing", "")
	wantProblem(t, resp, body, 404, "not_found")
	if resp, body := d.do(t, "DELETE", files+"data", ""); resp.StatusCode != 204 {
		t.Fatalf("delete: %d %s", resp.StatusCode, body)
	}
	resp, body = d.do(t, "GET", files+"data/in%20put.txt", "")
	wantProblem(t, resp, body, 404, "not_found")
	// Runs and file operations of a workspace are audited.
	evs, _ := d.store.Events(t.Context(), d.since, "", 100)
	kinds := map[string]int{}
	for _, e := range evs {
		kinds[string(e.Kind)]++
	}
	// Reads refused for a bad path are recorded too.
	if kinds["workspace.created"] != 1 || kinds["workspace.file_written"] != 1 || kinds["workspace.file_read"] < 2 ||
		kinds["workspace.file_removed"] != 1 {
		t.Fatalf("audit: %v", kinds)
	}
	if resp, _ := d.do(t, "DELETE", "/v1/workspaces/"+id, ""); resp.StatusCode != 204 {
		t.Fatalf("delete workspace: %d", resp.StatusCode)
	}
	resp, body = d.do(t, "GET", "/v1/workspaces/"+id, "")
	wantProblem(t, resp, body, 404, "not_found")
	resp, body = d.do(t, "POST", "/v1/runs", `{"workspace":"`+id+`","code":"print(1)"}`)
	wantProblem(t, resp, body, 404, "not_found")
}

// Guest code plants symbolic links (to host paths and inside), hard links and, from
// the host side (WASI has no mkfifo), a FIFO at names the API then reads, writes
// and deletes: nothing outside the workspace is read, written or removed, and the
// daemon never blocks.
func TestWorkspacePlantedLinks(t *testing.T) {
	d := start(t, setup{})
	id := d.newWorkspace(t)
	files := "/v1/workspaces/" + id + "/files/"
	outDir := t.TempDir()
	secret := filepath.Join(outDir, "secret")
	os.WriteFile(secret, []byte("host secret"), 0o600)

	code := `import os
open('plain', 'w').write('plain')
for name, target in [('abs', ` + "'" + secret + "'" + `), ('absdir', ` + "'" + outDir + "'" + `), ('up', '../../../..'), ('inner', 'plain')]:
    try:
        os.symlink(target, name)
        print('symlink', name)
    except OSError as e:
        print('symlink', name, 'refused', e.errno)
open('shared', 'w').write('shared')
os.link('shared', 'hard')
print('link')`
	body, _ := json.Marshal(map[string]string{"workspace": id, "code": code})
	v := d.run(t, string(body))
	if !strings.Contains(string(v.Result.Stdout), "link\n") {
		t.Fatalf("plant: %s %s", v.Result.Stdout, v.Result.Stderr)
	}
	t.Logf("guest: %q", v.Result.Stdout)
	// wasmtime refuses symbolic links with absolute targets; another interpreter (or
	// a bug) might not, so what the guest could not plant is planted from outside.
	wsDir := filepath.Join(d.workspaces, id, "files")
	for name, target := range map[string]string{"abs": secret, "absdir": outDir} {
		if _, err := os.Lstat(filepath.Join(wsDir, name)); err != nil {
			if err := os.Symlink(target, filepath.Join(wsDir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := syscall.Mkfifo(filepath.Join(wsDir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"abs", "absdir/secret", "up/etc/passwd", "inner", "hard", "shared", "fifo"} {
		resp, body := d.do(t, "GET", files+p, "")
		wantProblem(t, resp, body, 409, "unsafe_file")
	}
	if resp, body := d.do(t, "GET", files+"plain", ""); resp.StatusCode != 200 || string(body) != "plain" {
		t.Fatalf("plain: %d %s", resp.StatusCode, body)
	}
	for _, p := range []string{"abs", "hard", "fifo", "inner"} {
		if resp, body := d.do(t, "PUT", files+p, "new"); resp.StatusCode != 201 {
			t.Fatalf("put %s: %d %s", p, resp.StatusCode, body)
		}
		if resp, body := d.do(t, "GET", files+p, ""); resp.StatusCode != 200 || string(body) != "new" {
			t.Fatalf("get %s after put: %d %s", p, resp.StatusCode, body)
		}
	}
	for _, p := range []string{"absdir/secret", "up/x"} {
		resp, body := d.do(t, "PUT", files+p, "new")
		wantProblem(t, resp, body, 409, "unsafe_file")
	}
	for _, p := range []string{"absdir", "up"} {
		if resp, body := d.do(t, "DELETE", files+p, ""); resp.StatusCode != 204 {
			t.Fatalf("delete %s: %d %s", p, resp.StatusCode, body)
		}
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "host secret" {
		t.Fatalf("the host file changed: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(wsDir, "shared")); err != nil || string(b) != "shared" {
		t.Fatalf("writing a hard link's name changed its other name: %q %v", b, err)
	}
	if resp, _ := d.do(t, "DELETE", "/v1/workspaces/"+id, ""); resp.StatusCode != 204 {
		t.Fatalf("delete workspace: %d", resp.StatusCode)
	}
	if _, err := os.Stat(secret); err != nil {
		t.Fatalf("deleting the workspace removed a host file: %v", err)
	}
}

// Uploads past the quota are refused; guest code that writes past it leaves a
// workspace that refuses runs and uploads until files are removed (the run itself
// ends as soon as the daemon measures it past: TestRunEndsAtQuota).
func TestWorkspaceQuota(t *testing.T) {
	d := start(t, setup{quota: workspace.Quota{Bytes: 64 << 10, Files: 10}})
	id := d.newWorkspace(t)
	files := "/v1/workspaces/" + id + "/files/"
	resp, body := d.do(t, "PUT", files+"big", strings.Repeat("x", 65<<10))
	wantProblem(t, resp, body, 507, "quota_exceeded")
	// One file cannot exceed the quota (RLIMIT_FSIZE); two together can, and the
	// run ends with them or is ended for them (then before its exit could flush
	// stdout: the first line is flushed at once, under load it failed 5 in 50).
	v := d.run(t, `{"workspace":"`+id+`","code":"import os\ntry:\n  with open('one','wb') as f: f.write(b'x'*(65<<10))\nexcept OSError as e:\n  print('one', e.strerror, flush=True)\nos.remove('one')\nfor n in 'ab': open(n,'wb').write(b'x'*(40<<10))\nprint('done')"}`)
	if out := string(v.Result.Stdout); !strings.HasPrefix(out, "one File too large\n") ||
		!(out == "one File too large\ndone\n" || v.Result.Reason == protocol.QuotaExceeded) {
		t.Fatalf("run: %s %q %q", v.Result.Reason, v.Result.Stdout, v.Result.Stderr)
	}
	resp, body = d.do(t, "POST", "/v1/runs", `{"workspace":"`+id+`","code":"print(1)"}`)
	wantProblem(t, resp, body, 507, "quota_exceeded")
	resp, body = d.do(t, "PUT", files+"c", "x")
	wantProblem(t, resp, body, 507, "quota_exceeded")
	if resp, _ := d.do(t, "DELETE", files+"a", ""); resp.StatusCode != 204 {
		t.Fatal("delete")
	}
	if v := d.run(t, `{"workspace":"`+id+`","code":"print(len(open('b','rb').read()))"}`); string(v.Result.Stdout) != "40960\n" {
		t.Fatalf("after delete: %q", v.Result.Stdout)
	}
}

// A run whose workspace grows past its quota is ended quota_exceeded as soon as
// the daemon measures it (it had run on until its time ran out: 1 GiB written in
// 4.7 s against a quota of 256 MiB, in files each under RLIMIT_FSIZE), whether the
// workspace is a named one or the run's private one, and whether bytes, names or
// files deleted while open pass the quota; a run that keeps rewriting what it has stays within it and ends
// by itself.
func TestRunEndsAtQuota(t *testing.T) {
	d := start(t, setup{quota: workspace.Quota{Bytes: 1 << 20, Files: 100}})
	id := d.newWorkspace(t)
	bytesForever := `import itertools\nfor i in itertools.count():\n  open('/ws/f%d' % i, 'wb').write(b'x' * (200 << 10))`
	namesForever := `import itertools\nfor i in itertools.count():\n  open('/ws/n%d' % i, 'wb').close()`
	// Files deleted while open hold the disk with no name a walk could count.
	heldUnnamed := `import os, time\nkept = []\nfor i in range(20):\n  f = open('/ws/h%d' % i, 'wb')\n  os.unlink('/ws/h%d' % i)\n  f.write(b'x' * (200 << 10))\n  f.flush()\n  kept.append(f)\ntime.sleep(15)`
	for _, c := range []struct{ name, body string }{
		{"bytes, named workspace", `{"workspace":"` + id + `","code":"` + bytesForever + `","limits":{"timeout_ms":20000}}`},
		{"bytes, private workspace", `{"code":"` + bytesForever + `","limits":{"timeout_ms":20000}}`},
		{"names, private workspace", `{"code":"` + namesForever + `","limits":{"timeout_ms":20000}}`},
		{"deleted while open, named workspace", `{"workspace":"` + d.newWorkspace(t) + `","code":"` + heldUnnamed + `","limits":{"timeout_ms":20000}}`},
	} {
		v := d.run(t, c.body)
		r := v.Result
		t.Logf("%s: %s after %.0f ms: %v", c.name, r.Reason, r.ElapsedMS, r.Diagnostics)
		if r.Reason != protocol.QuotaExceeded || r.ElapsedMS > 10000 || len(r.Diagnostics) != 1 ||
			!strings.Contains(r.Diagnostics[0], "past its quota") {
			t.Fatalf("%s: %s after %.0f ms, %v, stderr %q", c.name, r.Reason, r.ElapsedMS, r.Diagnostics, r.Stderr)
		}
	}
	resp, body := d.do(t, "GET", "/v1/workspaces/"+id, "")
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"over_quota":true`) {
		t.Fatalf("the workspace after: %d %.300s", resp.StatusCode, body)
	}
	v := d.run(t, `{"code":"import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end:\n  open('/ws/f', 'wb').write(b'x' * (600 << 10))\nprint('kept')"}`)
	if v.Result.Reason != protocol.Exited || string(v.Result.Stdout) != "kept\n" {
		t.Fatalf("a run within its quota: %s %q %v", v.Result.Reason, v.Result.Stdout, v.Result.Diagnostics)
	}
}

// A workspace request refused before it reaches a workspace (one that does not exist,
// or is another caller's) is in the audit log.
func TestWorkspaceRefusalsAudited(t *testing.T) {
	d := start(t, setup{})
	resp, body := d.do(t, "GET", "/v1/workspaces/01ARZ3NDEKTSV4RRFFQ69G5FAV/files/a.txt", "")
	wantProblem(t, resp, body, 404, wire.CodeNotFound)
	evs, _ := d.store.Events(t.Context(), d.since, "", 10)
	if len(evs) != 1 || evs[0].Kind != "workspace.refused" || !bytes.Contains(evs[0].Detail, []byte(`"code":"not_found"`)) ||
		!bytes.Contains(evs[0].Detail, []byte(`"path":"/v1/workspaces/01ARZ3NDEKTSV4RRFFQ69G5FAV/files/a.txt"`)) {
		t.Fatalf("%+v", evs)
	}
}
