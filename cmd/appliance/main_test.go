package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/worker"
	"github.com/sandcell/sandcell/supervisor/store"
)

// TestMain makes the test binary behave as the sandcell binary: the worker when
// re-executed as one, the CLI when SANDCELL_CLI_TEST is set.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == protocol.WorkerCommand {
		os.Exit(worker.Main())
	}
	if len(os.Args) > 1 && os.Args[1] == bundle.PrecompileCommand {
		os.Exit(precompileMain(os.Args[2:]))
	}
	if os.Getenv("SANDCELL_CLI_TEST") == "1" {
		if p := os.Getenv("SANDCELL_TEST_LEAN_WORKER"); p != "" {
			// As a binary built with the leanworker tag, with the daemon's umask:
			// see TestLeanWorker.
			syscall.Umask(0o077)
			var err error
			if leanWorker, err = os.ReadFile(p); err != nil {
				panic(err)
			}
		}
		os.Exit(execute(os.Args[1:]))
	}
	os.Exit(m.Run())
}

type cliResult struct {
	stdout, stderr string
	code           int
}

// cli runs `sandcell ARGS...` as a separate process with stdin and returns its output.
func cli(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	cmd := cliCmd(t, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return cliResult{out.String(), errb.String(), cmd.ProcessState.ExitCode()}
}

func cliCmd(t *testing.T, args ...string) *exec.Cmd {
	bundletest.Module(t, false) // fail early, with the fix, if the bundle is missing
	cmd := exec.Command(os.Args[0], args...)
	// A daemon's first hash secret costs about 30 s of CPU in the background:
	// TestHashSecretRotation turns it on.
	cmd.Env = append(os.Environ(), "SANDCELL_CLI_TEST=1", "SANDCELL_BUNDLE_DIR="+bundletest.Dir(t),
		"SANDCELL_CACHE_DIR="+t.TempDir(), "SANDCELL_BUNDLE_HASH_SECRET_ROTATION=0")
	return cmd
}

func TestCLIRun(t *testing.T) {
	r := cli(t, "", "run", "-c", "print(6*7)")
	if r.stdout != "42\n" || r.code != 0 {
		t.Fatalf("%+v", r)
	}
	r = cli(t, "", "run", "-c", "import sys; print('to stderr', file=sys.stderr); raise SystemExit(3)")
	if r.code != 3 || r.stderr != "to stderr\n" {
		t.Fatalf("%+v", r)
	}
	r = cli(t, "piped input", "run", "--stdin", "-", "-c", "import sys; print(sys.stdin.read(), sys.argv[1:])", "--", "x", "-y")
	if r.stdout != "piped input ['x', '-y']\n" || r.code != 0 {
		t.Fatalf("%+v", r)
	}
}

func TestCLIFileAndWorkspace(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "job.py")
	// A UTF-8 byte order mark is allowed at the start of a source file.
	os.WriteFile(script, []byte("\ufeffimport sys\nopen('result.txt', 'w').write(sys.argv[1])\nprint(sys.argv[0], __file__)\n"), 0o644)
	ws := t.TempDir()
	r := cli(t, "", "run", "--workspace", ws, script, "payload")
	if r.code != 0 || r.stdout != "job.py job.py\n" {
		t.Fatalf("%+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "result.txt")); string(b) != "payload" {
		t.Fatalf("workspace file %q", b)
	}
}

// Without --workspace, a private temporary workspace is made and removed.
func TestCLITemporaryWorkspaceIsRemoved(t *testing.T) {
	tmp := t.TempDir()
	cmd := cliCmd(t, "run", "-c", "open('f', 'w').write('x'); import os; print(os.listdir('.'))")
	cmd.Env = append(cmd.Env, "TMPDIR="+tmp)
	out, err := cmd.Output()
	if err != nil || string(out) != "['f']\n" {
		t.Fatalf("%q %v", out, err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

func TestCLIExitCodes(t *testing.T) {
	cases := []struct {
		args []string
		code int
		note string
	}{
		{[]string{"run", "--timeout", "1s", "-c", "while True: pass"}, exitTimeout, "timeout"},
		{[]string{"run", "--cpu", "200ms", "-c", "while True: pass"}, exitCPULimit, "cpu_limit"},
		{[]string{"run", "--fuel", "1000", "-c", "print(1)"}, exitCPULimit, "fuel exhausted"},
		{[]string{"run", "--max-output", "10", "-c", "print('x' * 100)"}, exitOutputLimit, "output_limit"},
		{[]string{"run", "--memory", "32", "-c", "bytearray(2**30)"}, exitMemoryLimit, "memory_limit: out of memory at the 32 MiB limit"},
		// Caught, it is the program's own business.
		{[]string{"run", "--memory", "32", "-c", "try:\n    bytearray(2**30)\nexcept MemoryError:\n    print('caught')"}, 0, ""},
		{[]string{"run", "--timeout", "1h", "-c", "1"}, exitRejected, "above the maximum"},
		{[]string{"run", "--timeout", "500us", "-c", "1"}, exitRejected, "at least 1ms"},
		{[]string{"run", "--timeout", "0", "-c", "1"}, exitRejected, "at least 1ms"},
		{[]string{"run", "--cpu", "500us", "-c", "1"}, exitRejected, "at least 1ms"},
		{[]string{"run", "--memory", "8", "-c", "1"}, exitRejected, "between 32 and 4096"},
		{[]string{"run", "--memory", "17592186044417", "-c", "1"}, exitRejected, "between 32 and 4096"},
		{[]string{"run", "--max-output", "0", "-c", "1"}, exitRejected, "at least 1 byte"},
		{[]string{"run", "-c", "import sys; sys.exit(-1)"}, 255, ""},
		// os._exit leaves through WASI's proc_exit, which cannot carry 126-255.
		{[]string{"run", "-c", "import os; os._exit(200)"}, exitTrap, "exit status"},
		{[]string{"run", "--workspace", "/", "-c", "1"}, exitRejected, "overlaps"},
		{[]string{"nonsense"}, exitUsage, "sandcell: unknown command"},
		{[]string{"run"}, exitUsage, "give -c CODE or FILE.py"},
		{[]string{"run", "--no-such-flag"}, exitUsage, "unknown flag"},
		{[]string{"run", "--bundle-dir", "/nonexistent", "-c", "1"}, exitUsage, "make bundle"},
	}
	for _, c := range cases {
		r := cli(t, "", c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.note) {
			t.Errorf("%q: exit %d stderr %q, want %d and %q", c.args, r.code, r.stderr, c.code, c.note)
		}
	}
}

func TestCLIEmptyProgram(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.py")
	os.WriteFile(empty, nil, 0o644)
	for _, args := range [][]string{{"run", "-c", ""}, {"run", empty}} {
		if r := cli(t, "", args...); r.code != 0 || r.stdout != "" || r.stderr != "" {
			t.Errorf("%q: %+v", args, r)
		}
	}
}

func TestCLIJSON(t *testing.T) {
	r := cli(t, "", "run", "--json", "-c", "import sys; sys.stdout.buffer.write(b'\\xff'); raise SystemExit(2)")
	var res protocol.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if r.code != 2 || res.ExitCode != 2 || res.Reason != protocol.Exited || string(res.Stdout) != "\xff" {
		t.Fatalf("%+v %+v", r, res)
	}
}

// SIGINT, SIGTERM or SIGHUP to the CLI cancels the run: the worker is killed, the
// temporary workspace removed, and the CLI exits 130.
func TestCLICancel(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		tmp := t.TempDir()
		cmd := cliCmd(t, "run", "-c", "import time; time.sleep(60)")
		cmd.Env = append(cmd.Env, "TMPDIR="+tmp)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		cmd.Process.Signal(sig)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("CLI did not stop on %v", sig)
		}
		if code := cmd.ProcessState.ExitCode(); code != exitCancelled {
			t.Fatalf("%v: exit %d stderr %s", sig, code, errb.String())
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Fatalf("%v: left behind %v", sig, left)
		}
	}
}

// Deep recursion in C code ends as RecursionError, as natively, with the default
// stack; under a small RLIMIT_STACK the worker shrinks the wasm stack to fit, so it
// ends as a clean trap, never as a SIGSEGV of the worker (CASES: "Two stacks").
func TestCLIDeepRecursionAndSmallStack(t *testing.T) {
	code := "class A:\n    def __repr__(self): return repr(self)\nrepr(A())"
	if r := cli(t, "", "run", "-c", code); r.code != 1 || !strings.Contains(r.stderr, "RecursionError") {
		t.Fatalf("default stack: %+v", r)
	}
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Fatalf("prlimit (util-linux) is needed: %v", err)
	}
	bundletest.Module(t, false)
	cmd := exec.Command("prlimit", "--stack=1048576", os.Args[0], "run", "--json", "-c", code)
	cmd.Env = append(os.Environ(), "SANDCELL_CLI_TEST=1", "SANDCELL_BUNDLE_DIR="+bundletest.Dir(t), "SANDCELL_CACHE_DIR="+t.TempDir())
	out, _ := cmd.Output()
	var res protocol.Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if res.Reason != protocol.Trap || !strings.Contains(strings.Join(res.Diagnostics, " "), "wasm stack exhausted") {
		t.Fatalf("1 MiB stack: %+v", res)
	}
}

// TestCLIEnforcementContract: --json carries the contract with every layer active,
// --require refuses unknown layers, and a bad seccomp profile is refused before any
// code runs.
func TestCLIEnforcementContract(t *testing.T) {
	r := cli(t, "", "run", "--json", "-c", "print(1)")
	var res protocol.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 {
		t.Fatalf("%v: %+v", err, r)
	}
	if res.Enforcement == nil {
		t.Fatalf("no enforcement in %s", r.stdout)
	}
	if miss := res.Enforcement.Missing(protocol.Layers()); len(miss) > 0 {
		t.Fatalf("layers not active: %v %v", miss, res.Enforcement.Errors)
	}
	r = cli(t, "", "run", "--require", "seccomp,selinux", "-c", "print(1)")
	if r.code != exitRejected || !strings.Contains(r.stderr, "selinux") || r.stdout != "" {
		t.Fatalf("unknown layer: %+v", r)
	}
	r = cli(t, "", "run", "--require", "none", "-c", "print(1)")
	if r.code != 0 || r.stdout != "1\n" {
		t.Fatalf("--require none: %+v", r)
	}
	bad := filepath.Join(t.TempDir(), "profile.json")
	os.WriteFile(bad, []byte(`{"defaultAction":"SCMP_ACT_ALLOW"}`), 0o644)
	r = cli(t, "", "run", "--seccomp-profile", bad, "-c", "print(1)")
	if r.code != exitRejected || !strings.Contains(r.stderr, "SCMP_ACT_ALLOW") {
		t.Fatalf("allow-all profile: %+v", r)
	}
	// An operator's profile that leaves out a call the worker needs (getrandom, for
	// the interpreter's hash seed): the run fails cleanly, it does not hang.
	narrow := filepath.Join(t.TempDir(), "narrow.json")
	os.WriteFile(narrow, []byte(`{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","write","exit_group","futex"],"action":"SCMP_ACT_ALLOW"}]}`), 0o644)
	r = cli(t, "", "run", "--timeout", "20s", "--json", "--seccomp-profile", narrow, "-c", "print(1)")
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("%v: %+v", err, r)
	}
	if res.Reason == protocol.Exited && string(res.Stdout) == "1\n" || res.Reason == protocol.Timeout {
		t.Fatalf("a profile without the calls the worker needs: %+v", res)
	}
}

func TestCLIConfig(t *testing.T) {
	r := cli(t, "", "config", "default")
	if r.code != 0 || !strings.Contains(r.stdout, "[sandbox]") || !strings.Contains(r.stdout, "# The kill switch") {
		t.Fatalf("%+v", r)
	}
	good := filepath.Join(t.TempDir(), "good.toml")
	os.WriteFile(good, []byte(r.stdout), 0o644)
	if r := cli(t, "", "config", "validate", good); r.code != 0 || !strings.Contains(r.stdout, "ok") {
		t.Fatalf("validate the default: %+v", r)
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(bad, []byte("[socket]\nmode = \"0777\"\n[runs]\nqueue_length = -1\n"), 0o644)
	r = cli(t, "", "config", "validate", bad)
	if r.code != 1 || !strings.Contains(r.stderr, "socket.mode") || !strings.Contains(r.stderr, "runs.queue_length") {
		t.Fatalf("validate a bad file: %+v", r)
	}
	cmd := cliCmd(t, "config", "dump", "--config", good)
	cmd.Env = append(cmd.Env, "SANDCELL_RUNS_QUEUE_LENGTH=7")
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), "queue_length = 7") {
		t.Fatalf("dump: %v\n%s", err, out)
	}
}

// waitReady waits up to 30 s for the daemon behind client to answer /readyz with 200.
func waitReady(t *testing.T, client *http.Client, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get("http://sandcell/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after 30 s: %v\n%s", err, logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestServe is the daemon end to end: `sandcell serve --socket --state-dir`, readiness
// after the canary, a run over the socket, then SIGTERM and exit 0.
func TestServe(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "s.sock")
	cmd := cliCmd(t, "serve", "--socket", sock, "--state-dir", filepath.Join(dir, "state"))
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
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
	resp, err = client.Get("http://sandcell/v1/info")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(body, []byte(`"seccomp":{"active":true`)) {
		t.Fatalf("info without the contract: %s", body)
	}
	// The CLI through the daemon: same output, same exit statuses.
	if r := cli(t, "in", "run", "--socket", sock, "--stdin", "-", "-c", "import sys; print(6*7, sys.stdin.read()); sys.exit(3)"); r.code != 3 || r.stdout != "42 in\n" {
		t.Fatalf("run --socket: %+v", r)
	}
	if r := cli(t, "", "run", "--socket", sock, "--timeout", "300ms", "-c", "while True: pass"); r.code != exitTimeout {
		t.Fatalf("run --socket timeout: %+v", r)
	}
	if r := cli(t, "", "run", "--socket", sock, "--workspace", dir, "-c", "1"); r.code != exitRejected {
		t.Fatalf("run --socket --workspace: %+v", r)
	}
	// A second daemon on the same state directory is refused (the lock file).
	if r := cli(t, "", "serve", "--socket", filepath.Join(dir, "run2", "s.sock"), "--state-dir", filepath.Join(dir, "state")); r.code == 0 ||
		!strings.Contains(r.stderr, "in use by another sandcell serve") {
		t.Fatalf("a second daemon on the state directory: %+v", r)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, logs.String())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
	// start, 3 x (requested, admitted, finished), stop (the canary is not a request).
	r := cli(t, "", "audit", "verify", "--state-dir", filepath.Join(dir, "state"))
	if r.code != 0 || !strings.Contains(r.stdout, "11 records, chain intact") {
		t.Fatalf("audit verify: %+v", r)
	}
}

// workersOfThisBinary lists the pids of running workers started from this test binary.
func workersOfThisBinary(t *testing.T) []int {
	self, _ := os.Executable()
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if exe == self && bytes.Contains(cmdline, []byte("\x00"+protocol.WorkerCommand+"\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestServeKilled: after SIGKILL of the daemon, none of its workers survives.
func TestServeKilled(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	cmd := cliCmd(t, "serve", "--socket", sock, "--state-dir", filepath.Join(dir, "state"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	client := sandcellclient.HTTP(sock)
	waitReady(t, client, func() string { return "" })
	for i := 0; i < 2; i++ {
		resp, err := client.Post("http://sandcell/v1/runs", "application/json", strings.NewReader(`{"code":"while True: pass","wait":false}`))
		if err != nil || resp.StatusCode != 202 {
			t.Fatalf("%v %v", err, resp)
		}
		resp.Body.Close()
	}
	for i := 0; len(workersOfThisBinary(t)) < 2; i++ {
		if i > 200 {
			t.Fatal("workers did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	for i := 0; ; i++ {
		left := workersOfThisBinary(t)
		if len(left) == 0 {
			break
		}
		if i > 100 {
			t.Fatalf("workers %v survived SIGKILL of the daemon", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Restarted over the stale socket, the daemon marks the two runs aborted.
	cmd = cliCmd(t, "serve", "--socket", sock, "--state-dir", filepath.Join(dir, "state"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, client, func() string { return "after restart" })
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	db, err := store.Open(filepath.Join(dir, "state", "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	evs, _ := db.Events(context.Background(), 0, "", 100)
	aborted := 0
	for _, e := range evs {
		if e.Kind == "run.aborted" {
			aborted++
		}
	}
	if n, err := db.Verify(context.Background()); aborted != 2 || err != nil {
		t.Fatalf("%d aborted, chain of %d: %v", aborted, n, err)
	}
}

// TestServeKilledDuringBurst: SIGKILL of the daemon in the middle of a burst of 200
// runs. After a restart, every run whose result reached a client has its result in
// the audit log, the runs in flight are marked aborted, and the chain verifies.
func TestServeKilledDuringBurst(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	serve := func() *exec.Cmd {
		cmd := cliCmd(t, "serve", "--socket", sock, "--state-dir", filepath.Join(dir, "state"))
		cmd.Env = append(cmd.Env, "SANDCELL_RUNS_QUEUE_LENGTH=200")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	cmd := serve()
	defer cmd.Process.Kill()
	client := sandcellclient.HTTP(sock)
	waitReady(t, client, func() string { return "" })

	var mu sync.Mutex
	var received []string // runs whose result a client got
	next := make(chan int, 200)
	for i := 0; i < 200; i++ {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for c := 0; c < 8; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				resp, err := client.Post("http://sandcell/v1/runs", "application/json",
					strings.NewReader(fmt.Sprintf(`{"code":"print(%d)"}`, i)))
				if err != nil {
					return // the daemon is gone
				}
				var v struct {
					ID     string
					Result struct{ Stdout string }
				}
				err = json.NewDecoder(resp.Body).Decode(&v)
				resp.Body.Close()
				if err == nil && resp.StatusCode == 200 && v.Result.Stdout == fmt.Sprintf("%d\n", i) {
					mu.Lock()
					received = append(received, v.ID)
					if len(received) == 60 {
						cmd.Process.Kill()
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	cmd.Wait()
	if len(received) < 60 {
		t.Fatalf("only %d results before the kill", len(received))
	}
	cmd = serve()
	waitReady(t, client, func() string { return "after restart" })
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()

	db, err := store.Open(filepath.Join(dir, "state", "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if n, err := db.Verify(context.Background()); err != nil {
		t.Fatalf("chain of %d: %v", n, err)
	}
	finished := map[string]bool{}
	admitted, aborted := 0, 0
	for after := int64(0); ; {
		evs, err := db.Events(context.Background(), after, "", 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			break
		}
		for _, e := range evs {
			switch e.Kind {
			case "run.finished":
				finished[e.RunID] = true
			case "run.admitted":
				admitted++
			case "run.aborted":
				aborted++
			}
		}
		after = evs[len(evs)-1].Seq
	}
	for _, id := range received {
		if !finished[id] {
			t.Errorf("run %s reached a client but has no result record", id)
		}
	}
	if admitted != len(finished)+aborted {
		t.Errorf("%d admitted, %d finished, %d aborted", admitted, len(finished), aborted)
	}
	t.Logf("%d results received before SIGKILL; %d admitted, %d finished, %d aborted", len(received), admitted, len(finished), aborted)
}

// sandcell sql: reads run, writes need --allow-write, refused statements exit 126.
func TestCLISQL(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "t.db"), nil, 0o644)
	if r := cli(t, "", "sql", "--workspace", dir, "t.db", "CREATE TABLE t (x INTEGER)"); r.code != exitRejected || !strings.Contains(r.stderr, "--allow-write") {
		t.Fatalf("write without --allow-write: %+v", r)
	}
	if r := cli(t, "", "sql", "--workspace", dir, "--allow-write", "t.db", "CREATE TABLE t (x INTEGER)"); r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	cli(t, "", "sql", "--workspace", dir, "--allow-write", "--params", "[7]", "t.db", "INSERT INTO t VALUES (?)")
	if r := cli(t, "", "sql", "--workspace", dir, "--format", "table", "t.db", "SELECT x FROM t"); r.code != 0 || r.stdout != "x\n7\n" {
		t.Fatalf("select: %+v", r)
	}
	if r := cli(t, "", "sql", "--workspace", dir, "--allow-write", "t.db", "VACUUM INTO 'copy.db'"); r.code != exitRejected {
		t.Fatalf("vacuum into: %+v", r)
	}
	if r := cli(t, "", "sql", "--workspace", dir, "t.db", "SELEC"); r.code != 1 || !strings.Contains(r.stderr, "sql_syntax_error") {
		t.Fatalf("syntax: %+v", r)
	}
	// The binary's own directory is never a workspace, for statements as for runs.
	exeDir := filepath.Dir(os.Args[0])
	db := filepath.Join(exeDir, "t.db")
	if err := os.WriteFile(db, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(db)
	if r := cli(t, "", "sql", "--workspace", exeDir, "t.db", "SELECT 1"); r.code == 0 || !strings.Contains(r.stderr, "overlaps") {
		t.Fatalf("the binary's directory as the workspace: %+v", r)
	}
}

// A binary that carries the lean worker (cmd/sandcell-worker, built here from source
// as `make build` builds it) runs every worker from it, through a sealed memfd, and
// says so; the runs are those of `sandcell __worker`, layers and all.
func TestLeanWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/sandcell-worker")
	}
	bin := filepath.Join(t.TempDir(), "sandcell-worker")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/sandcell/sandcell/cmd/sandcell-worker")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	lean := func(args ...string) cliResult {
		cmd := cliCmd(t, args...)
		cmd.Env = append(cmd.Env, "SANDCELL_TEST_LEAN_WORKER="+bin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			if _, ok := err.(*exec.ExitError); !ok {
				t.Fatal(err)
			}
		}
		return cliResult{out.String(), errb.String(), cmd.ProcessState.ExitCode()}
	}
	if r := lean("version"); !strings.Contains(r.stdout, "worker: the lean worker this binary carries") {
		t.Fatalf("%+v", r)
	}
	r := lean("run", "--json", "-c", "import os; print(6*7, sorted(os.listdir('/')))")
	var res struct {
		ExitCode    int    `json:"exit_code"`
		Stdout      string `json:"stdout"`
		Enforcement struct {
			Seccomp struct {
				Active bool `json:"active"`
			} `json:"seccomp"`
			Landlock struct {
				Active bool `json:"active"`
			} `json:"landlock"`
		} `json:"enforcement"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 || res.ExitCode != 0 ||
		res.Stdout != "42 ['tmp', 'ws']\n" || !res.Enforcement.Seccomp.Active || !res.Enforcement.Landlock.Active {
		t.Fatalf("%v: %+v", err, r)
	}
}
