package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	sandcellclient "github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// TestHashSecretRotation: a daemon makes a string hash secret of its own in the
// background (bundle.hash_secret_rotation), and new runs and sessions hash with it,
// while a session opened before keeps its own, through a fork and a restart; after a
// restart the daemon's generation is in force from its first run. Before, every run
// of every installation of one package hashed alike, with the package's secret.
func TestHashSecretRotation(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	// What a killed compile and a generation that no longer checks out leave: both go.
	for _, d := range []string{".new-123", "20000101T000000Z"} {
		if err := os.MkdirAll(filepath.Join(state, "interpreter", d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(dir, "s.sock")
	hc := sandcellclient.HTTP(sock)
	c := sandcellclient.NewHTTP(hc)
	ctx := context.Background()
	start := func() (*exec.Cmd, *syncBuffer) {
		cmd := cliCmd(t, "serve", "--socket", sock, "--state-dir", state)
		cmd.Env = append(cmd.Env, "SANDCELL_BUNDLE_HASH_SECRET_ROTATION=1h")
		logs := &syncBuffer{}
		cmd.Stderr = logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		waitReady(t, hc, logs.String)
		return cmd, logs
	}
	const program = `print(hash("sandcell"), hash(b"sandcell"))`
	run := func() string {
		t.Helper()
		v, err := c.Run(ctx, wire.RunRequest{Code: program})
		if err != nil || v.Result == nil || v.Result.ExitCode != 0 {
			t.Fatalf("run: %v %+v", err, v)
		}
		return string(v.Result.Stdout)
	}
	cell := func(id string) string {
		t.Helper()
		a, err := c.Cell(ctx, id, wire.CellRequest{Code: program})
		if err != nil || a.Result.ExitCode != 0 {
			t.Fatalf("cell in %s: %v %+v", id, err, a)
		}
		return string(a.Result.Stdout)
	}
	made := func() string {
		t.Helper()
		resp, err := hc.Get("http://sandcell/v1/info")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var info struct {
			HashSecret struct {
				Rotation string  `json:"rotation"`
				Made     *string `json:"made"`
			} `json:"hash_secret"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&info); err != nil || info.HashSecret.Rotation != "1h0m0s" {
			t.Fatalf("info: %v %+v", err, info)
		}
		if info.HashSecret.Made == nil {
			return ""
		}
		return *info.HashSecret.Made
	}

	daemon, logs := start()
	bundled := run()
	before, err := c.OpenSession(ctx, wire.SessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cell(before.ID); got != bundled {
		t.Fatalf("a session hashes %q, a run %q: one secret", got, bundled)
	}
	// Compiling the two variants takes about 30 s of CPU; allow a loaded machine.
	deadline := time.Now().Add(10 * time.Minute)
	for made() == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no hash secret of the daemon's own after 10 minutes:\n%s", logs.String())
		}
		time.Sleep(time.Second)
	}
	own := run()
	if own == bundled {
		t.Fatalf("runs hash as before the rotation: %q", own)
	}
	if got := cell(before.ID); got != bundled {
		t.Fatalf("the session opened before hashes %q after the rotation, %q before", got, bundled)
	}
	fork, err := c.ForkSession(ctx, before.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := cell(fork.ID); got != bundled {
		t.Fatalf("a fork hashes %q, its source %q", got, bundled)
	}
	if err := c.CloseSession(ctx, fork.ID); err != nil { // two sessions per caller
		t.Fatal(err)
	}
	after, err := c.OpenSession(ctx, wire.SessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cell(after.ID); got != own {
		t.Fatalf("a session opened after the rotation hashes %q, runs %q", got, own)
	}
	entries, _ := os.ReadDir(filepath.Join(state, "interpreter"))
	if len(entries) != 1 || !regexp.MustCompile(`^\d{8}T\d{6}Z$`).MatchString(entries[0].Name()) {
		t.Fatalf("generations left: %v", entries)
	}
	resp, err := hc.Get("http://sandcell/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^sandcell_hash_secret_made_timestamp_seconds [1-9]`).Match(metrics) {
		t.Fatalf("no secret's time in /metrics")
	}
	if t0, _ := time.Parse("20060102T150405Z", entries[0].Name()); made() != t0.Format(time.RFC3339) {
		t.Fatalf("/v1/info says the secret was made at %s, its generation is %s", made(), entries[0].Name())
	}

	// After a restart: the daemon's generation from the first run, no new one made,
	// and the paused sessions resumed with the secrets they had. (Renamed as if
	// made 40 s short of its period: the next rotation comes during this test.)
	daemon.Process.Signal(syscall.SIGTERM)
	if err := daemon.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, logs.String())
	}
	aged := time.Now().UTC().Add(-time.Hour + 40*time.Second).Truncate(time.Second)
	oldDir := filepath.Join(state, "interpreter", aged.Format("20060102T150405Z"))
	if err := os.Rename(filepath.Join(state, "interpreter", entries[0].Name()), oldDir); err != nil {
		t.Fatal(err)
	}
	first := aged.Format(time.RFC3339)
	daemon, logs = start()
	if got := run(); got != own {
		t.Fatalf("after a restart runs hash %q, before it %q (bundled %q)\n%s", got, own, bundled, logs.String())
	}
	if got := made(); got != first {
		t.Fatalf("after a restart the secret was made at %s, before it at %s", got, first)
	}
	if got := cell(before.ID); got != bundled {
		t.Fatalf("a resumed session hashes %q, before the restart %q", got, bundled)
	}
	if got := cell(after.ID); got != own {
		t.Fatalf("a resumed session hashes %q, before the restart %q", got, own)
	}

	// The next rotation keeps the generation it replaced (runs queued before it
	// still find their module); once that is gone too, a live session opened on it
	// still forks, with its own secret, and runs hash with the newest.
	for made() == first {
		if time.Now().After(deadline.Add(5 * time.Minute)) {
			t.Fatalf("no second rotation:\n%s", logs.String())
		}
		time.Sleep(time.Second)
	}
	entries, _ = os.ReadDir(filepath.Join(state, "interpreter"))
	if len(entries) != 2 || entries[0].Name() != filepath.Base(oldDir) {
		t.Fatalf("after the second rotation: %v", entries)
	}
	newest := run()
	if newest == own || newest == bundled {
		t.Fatalf("runs after the second rotation hash %q", newest)
	}
	if err := os.RemoveAll(oldDir); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseSession(ctx, before.ID); err != nil { // two sessions per caller
		t.Fatal(err)
	}
	fork, err = c.ForkSession(ctx, after.ID)
	if err != nil {
		t.Fatalf("a fork of a session whose module is gone: %v", err)
	}
	if got := cell(fork.ID); got != own {
		t.Fatalf("the fork hashes %q, its source %q", got, own)
	}
	if got := run(); got != newest {
		t.Fatalf("runs hash %q, then %q", newest, got)
	}
	daemon.Process.Signal(syscall.SIGTERM)
	daemon.Wait()
}
