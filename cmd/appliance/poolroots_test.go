package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sandcellclient "github.com/sandcell/sandcell/client"
)

// A mount beneath one of the warm pool's roots (an operator's tmpfs in the daemon's
// workspaces directory), which a warm worker can neither clone the root without nor
// be given, is named with its mount point: by /readyz?verbose, which stays 200 (runs
// beneath that root start cold, the others stay warm), and by `sandcell selftest`,
// as a warning.
func TestServeNamesUnusablePoolRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root; CI runs as root")
	}
	dir := t.TempDir()
	state, sock := filepath.Join(dir, "state"), filepath.Join(dir, "s.sock")
	cmd := cliCmd(t, "serve", "--socket", sock, "--state-dir", state)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	client := sandcellclient.HTTP(sock)
	waitReady(t, client, logs.String)

	mnt := filepath.Join(state, "workspaces", "mounted-by-the-operator")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	// A run takes a warm worker; the one that replaces it is prepared without the root.
	resp, err := client.Post("http://sandcell/v1/runs", "application/json", strings.NewReader(`{"code":"print(6*7)"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"stdout":"42\n"`)) {
		t.Fatalf("run: %d %s", resp.StatusCode, body)
	}
	want := filepath.Join(state, "workspaces") + " has mounts beneath it (" + mnt + ")"
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := client.Get("http://sandcell/readyz?verbose")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("readyz: %d %s", resp.StatusCode, body)
		}
		if bytes.Contains(body, []byte(`"name":"pool"`)) && bytes.Contains(body, []byte(want)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz?verbose does not name the root: %s\n%s", body, logs.String())
		}
	}
	t.Logf("readyz?verbose: %s", body)
	if !strings.Contains(logs.String(), "runs beneath a workspace root start cold") {
		t.Errorf("not logged:\n%s", logs.String())
	}

	sc := cliCmd(t, "selftest")
	sc.Env = append(sc.Env, "SANDCELL_STATE_DIR="+state)
	out, err := sc.Output()
	line := ""
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, " pool roots ") {
			line = l
		}
	}
	if err != nil || !strings.HasPrefix(line, "[ warn ]") || !strings.Contains(line, want) {
		t.Fatalf("selftest: %v\n%s", err, out)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, logs.String())
	}
}
