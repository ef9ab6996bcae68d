package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/bundle/bundletest"
	sandcellclient "github.com/sandcell/sandcell/client"
)

// notifySocket is a NOTIFY_SOCKET (sd_notify(3)): a datagram socket that records
// every message the daemon sends.
type notifySocket struct {
	path string
	mu   sync.Mutex
	msgs []string
	got  chan string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	n := &notifySocket{path: filepath.Join(t.TempDir(), "notify.sock"), got: make(chan string, 1024)}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			m := string(buf[:k])
			n.mu.Lock()
			n.msgs = append(n.msgs, m)
			n.mu.Unlock()
			n.got <- m
		}
	}()
	return n
}

func (n *notifySocket) all() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return strings.Join(n.msgs, "\n---\n")
}

// wait returns the first message containing s, or fails after d.
func (n *notifySocket) wait(t *testing.T, s string, d time.Duration, logs func() string) string {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case m := <-n.got:
			if strings.Contains(m, s) {
				return m
			}
		case <-deadline:
			t.Fatalf("no %q within %s; got:\n%s\nlogs:\n%s", s, d, n.all(), logs())
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a process's stderr and a test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// READY=1 comes only after the self-test passed and /readyz answers 200; then the
// watchdog is pinged; SIGTERM sends STOPPING=1.
func TestServeNotify(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	n := listenNotify(t)
	cmd := cliCmd(t, "serve", "--socket", sock, "--state-dir", filepath.Join(dir, "state"))
	cmd.Env = append(cmd.Env, "NOTIFY_SOCKET="+n.path, "WATCHDOG_USEC=600000", "SANDCELL_HEALTH_CANARY_INTERVAL=1s")
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	ready := n.wait(t, "READY=1", 60*time.Second, logs.String)
	client := sandcellclient.HTTP(sock)
	resp, err := client.Get("http://sandcell/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("READY=1 before /readyz was 200: %v %v", err, resp)
	}
	resp.Body.Close()
	if !strings.Contains(ready, "STATUS=sandcell") || !strings.Contains(ready, "11 layers active") {
		t.Fatalf("READY message: %q", ready)
	}
	if before := n.all(); strings.Count(before, "READY=1") != 1 || !strings.Contains(before, "STATUS=verifying the sandbox") {
		t.Fatalf("messages before ready:\n%s", before)
	}
	// Pings at half the interval: several within two seconds.
	for i := 0; i < 3; i++ {
		n.wait(t, "WATCHDOG=1", 2*time.Second, logs.String)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	n.wait(t, "STOPPING=1", 10*time.Second, logs.String)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, logs.String())
	}
}

// Six ways to break the sandbox or its surroundings: each start gets no READY=1, a
// STATUS= that says why, and a non-zero exit.
func TestServeSabotaged(t *testing.T) {
	type sabotage struct {
		setup  func(t *testing.T, dir string) (args, env []string)
		status string
	}
	cases := map[string]sabotage{
		"python.wasm hash": {func(t *testing.T, dir string) ([]string, []string) {
			b := bundletest.Copy(t)
			bundletest.Damage(t, filepath.Join(b, bundle.Pinned().Wasm.Name), 4096)
			return []string{"--bundle-dir", b}, nil
		}, "STATUS=failed: self-test: bundle: "},
		"damaged module, unwritable cache": {func(t *testing.T, dir string) ([]string, []string) {
			b := bundletest.Copy(t)
			cwasm, _ := filepath.Glob(filepath.Join(b, "*.cwasm"))
			for _, p := range cwasm {
				bundletest.Damage(t, p, 8192)
			}
			// Nothing can be created under /proc, not even by root.
			return []string{"--bundle-dir", b, "--cache-dir", "/proc/sandcell-test-cache"}, nil
		}, "no usable precompiled module"},
		"required layer missing": {func(t *testing.T, dir string) ([]string, []string) {
			return nil, []string{"SANDCELL_SANDBOX_DISABLE=landlock"}
		}, "required but not active: landlock"},
		"seccomp profile that fails to load": {func(t *testing.T, dir string) ([]string, []string) {
			p := filepath.Join(dir, "seccomp.json")
			os.WriteFile(p, []byte(`{"defaultAction": "SCMP_ACT_ALLOW"}`), 0o644)
			return nil, []string{"SANDCELL_SANDBOX_SECCOMP_PROFILE=" + p}
		}, "sandbox.seccomp_profile"},
		"world-writable socket directory": {func(t *testing.T, dir string) ([]string, []string) {
			open := filepath.Join(dir, "open")
			os.Mkdir(open, 0o777)
			os.Chmod(open, 0o777)
			return []string{"--socket", filepath.Join(open, "s.sock")}, nil
		}, "writable by others"},
		"unwritable audit database": {func(t *testing.T, dir string) ([]string, []string) {
			os.MkdirAll(filepath.Join(dir, "state", "audit.db"), 0o700)
			return nil, nil
		}, "audit log"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			n := listenNotify(t)
			args, env := c.setup(t, dir)
			args = append([]string{"serve", "--socket", filepath.Join(dir, "s.sock"), "--state-dir", filepath.Join(dir, "state")}, args...)
			cmd := cliCmd(t, args...)
			cmd.Env = append(append(cmd.Env, "NOTIFY_SOCKET="+n.path), env...)
			logs := &syncBuffer{}
			cmd.Stderr = logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(90 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("still running after 90 s:\n%s", logs.String())
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("exit: %v\n%s", err, logs.String())
			}
			msg := n.wait(t, c.status, 5*time.Second, logs.String)
			if !strings.Contains(msg, "STATUS=") {
				t.Fatalf("no STATUS=: %q", msg)
			}
			if strings.Contains(n.all(), "READY=1") {
				t.Fatalf("READY=1 sent:\n%s", n.all())
			}
		})
	}
}

// With health.exit_on_failure = false a failed self-test leaves the daemon up and
// unready: /readyz says why, runs are refused with 503.
func TestServeStaysUnready(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	cmd := cliCmd(t, "serve", "--socket", sock, "--state-dir", filepath.Join(dir, "state"))
	cmd.Env = append(cmd.Env, "SANDCELL_HEALTH_EXIT_ON_FAILURE=false", "SANDCELL_SANDBOX_DISABLE=landlock")
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	client := sandcellclient.HTTP(sock)
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(logs.String(), "staying up unready") {
		if time.Now().After(deadline) {
			t.Fatalf("no self-test failure:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := client.Get("http://sandcell/readyz?verbose")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !bytes.Contains(body, []byte("required but not active: landlock")) {
		t.Fatalf("readyz: %d %s", resp.StatusCode, body)
	}
	resp, err = client.Post("http://sandcell/v1/runs", "application/json", strings.NewReader(`{"code":"print(1)"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !bytes.Contains(body, []byte(`"not_ready"`)) {
		t.Fatalf("run: %d %s", resp.StatusCode, body)
	}
	if resp, err := client.Get("http://sandcell/livez"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("livez: %v %v", err, resp)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v", err)
	}
}

// Socket activation (sd_listen_fds(3)) with systemd-socket-activate: the daemon
// serves on the socket it was passed, started by the first connection.
func TestSocketActivation(t *testing.T) {
	tool, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Skip("systemd-socket-activate is not installed (Debian package systemd)")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	base := cliCmd(t)
	args := []string{"-l", sock, "--fdname=api"}
	for _, kv := range base.Env {
		if strings.HasPrefix(kv, "SANDCELL_") {
			args = append(args, "-E", kv)
		}
	}
	args = append(args, os.Args[0], "serve", "--state-dir", filepath.Join(dir, "state"))
	cmd := exec.Command(tool, args...)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 200 {
			t.Fatalf("no socket:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	client := sandcellclient.HTTP(sock)
	waitReady(t, client, logs.String)
	resp, err := client.Post("http://sandcell/v1/runs", "application/json", strings.NewReader(`{"code":"print(6*7)"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"stdout":"42\n"`)) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if !strings.Contains(logs.String(), "listening on the socket passed by systemd") {
		t.Fatalf("the daemon did not use the passed socket:\n%s", logs.String())
	}
}

// SIGHUP reloads the configuration: RELOADING=1, then READY=1; the kill switch
// applies at once, an in-flight run is not dropped, and a broken file leaves the
// configuration in force. sandcell healthcheck follows readiness.
func TestServeReload(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	conf := filepath.Join(dir, "sandcell.toml")
	write := func(s string) {
		if err := os.WriteFile(conf, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bundleDir := bundletest.Dir(t)
	base := "[bundle]\ndir = \"" + bundleDir + "\"\ncache_dir = \"" + bundleDir + "\"\n[access]\nrunners = [\"root\"]\nadmins = [\"" +
		strconv.Itoa(os.Getuid()) + "\"]\n"
	write(base)
	n := listenNotify(t)
	cmd := cliCmd(t, "serve", "--config", conf, "--socket", sock, "--state-dir", filepath.Join(dir, "state"))
	cmd.Env = append(cmd.Env, "NOTIFY_SOCKET="+n.path)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	n.wait(t, "READY=1", 60*time.Second, logs.String)
	if r := cli(t, "", "healthcheck", "--socket", sock); r.code != 0 {
		t.Fatalf("healthcheck when ready: %+v", r)
	}
	client := sandcellclient.HTTP(sock)
	post := func(body string) (int, string) {
		resp, err := client.Post("http://sandcell/v1/runs", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	// A run in flight across the reload.
	inflight := make(chan string, 1)
	go func() {
		_, b := post(`{"code":"import time; time.sleep(1.5); print('survived')"}`)
		inflight <- b
	}()
	time.Sleep(300 * time.Millisecond)
	write("disabled = true\n" + base)
	cmd.Process.Signal(syscall.SIGHUP)
	n.wait(t, "RELOADING=1", 5*time.Second, logs.String)
	n.wait(t, "READY=1", 5*time.Second, logs.String)
	if code, b := post(`{"code":"print(1)"}`); code != 503 || !strings.Contains(b, `"disabled"`) {
		t.Fatalf("after reload: %d %s", code, b)
	}
	if b := <-inflight; !strings.Contains(b, `"stdout":"survived\n"`) {
		t.Fatalf("in-flight run: %s", b)
	}
	// A broken file is refused; the configuration in force stays.
	write("disabled = maybe\n")
	cmd.Process.Signal(syscall.SIGHUP)
	if m := n.wait(t, "READY=1", 5*time.Second, logs.String); !strings.Contains(m, "reload refused") || !strings.Contains(m, "11 layers active") {
		t.Fatalf("after a refused reload: %q", m)
	}
	if code, _ := post(`{"code":"print(1)"}`); code != 503 || !strings.Contains(logs.String(), "reload refused") {
		t.Fatalf("after a bad reload: %d\n%s", code, logs.String())
	}
	write(base)
	cmd.Process.Signal(syscall.SIGHUP)
	n.wait(t, "READY=1", 5*time.Second, logs.String)
	if code, b := post(`{"code":"print(1)"}`); code != 200 {
		t.Fatalf("re-enabled: %d %s", code, b)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if r := cli(t, "", "healthcheck", "--socket", sock, "--timeout", "1s"); r.code != 1 {
		t.Fatalf("healthcheck with no daemon: %+v", r)
	}
}
