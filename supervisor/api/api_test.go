package api_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandcell/sandcell/bundle/bundletest"
	"github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/worker"
	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/config"
	sdaemon "github.com/sandcell/sandcell/supervisor/daemon"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == protocol.WorkerCommand {
		os.Exit(worker.Main())
	}
	// Every test's server, manager, clients and streams are gone when the tests
	// end: no goroutine may be left over.
	goleak.VerifyTestMain(m)
}

// daemon is a real daemon (package daemon, as `sandcell serve` builds it) in a
// temporary directory, with its parts at hand.
type daemon struct {
	d       *sdaemon.Daemon
	cfg     config.Config // what Load returns: change it, then reload
	server  *api.Server
	client  *http.Client
	socket  string
	store   *store.Store
	handler http.Handler
	// since is the audit seq of the daemon's own daemon.start: a test's records
	// come after it.
	since int64
	// workspaces is the workspace store's directory.
	workspaces string
	auditPath  string
	stop       func()     // begins the daemon's shutdown
	ran        chan error // Run's end
}

type setup struct {
	concurrency, queue int
	perCaller          int // runs of one caller, running plus queued; 0: no bound
	access             *api.Access
	quota              workspace.Quota // of every workspace; zero: 1 MiB and 100 names
	readTimeout        time.Duration
	approvalTTL        time.Duration
	writesHeld         *bool    // policy holds SQL writes for approval; nil: yes
	pool               int      // warm workers; 0: none
	runsHeld           bool     // policy holds runs for approval too
	elicitation        []string // approvals.elicitation: whose own confirmation counts
	perUID             int      // open connections of one uid; 0: 64, the whole bound
	dir                string   // the directory of the state and socket: a daemon's before this one; "": a new one
	sessions           func(*config.Sessions)
	tools              map[string]config.Tool // [tools]: what guests may call
}

// start opens and runs a real daemon with real workers on a Unix socket in a
// temporary directory, configured as s says, and waits until it is ready (its
// self-test passed). s.access, when set, replaces the configured access as a reload
// would (it holds tokens and ids no configuration file names).
func start(t *testing.T, s setup) *daemon {
	t.Helper()
	if s.concurrency == 0 {
		s.concurrency = 2
	}
	dir := s.dir
	if dir == "" {
		dir = t.TempDir()
	}
	bundleDir := bundletest.Dir(t)
	for _, v := range engine.Variants() {
		bundletest.VariantModule(t, v) // compiled into the bundle directory once
	}
	d := &daemon{socket: filepath.Join(dir, "s.sock"), workspaces: filepath.Join(dir, "state", "workspaces"),
		auditPath: filepath.Join(dir, "state", "audit.db")}
	cfg := config.Default()
	cfg.Bundle = config.Bundle{Dir: bundleDir, CacheDir: bundleDir}
	cfg.State.Dir = filepath.Join(dir, "state")
	cfg.Socket = config.Socket{Path: d.socket, Mode: "0660"}
	cfg.Runs.MaxConcurrent, cfg.Runs.QueueLength = s.concurrency, s.queue
	cfg.Runs.MaxPerCaller = s.perCaller
	if s.perCaller == 0 {
		cfg.Runs.MaxPerCaller = s.concurrency + s.queue // as many as there are places: no bound
	}
	cfg.Runs.ResultRetention.Duration = time.Minute
	cfg.Runs.ShutdownGrace.Duration = time.Second
	cfg.Runs.MaxConnections, cfg.Runs.MaxConnectionsPerUID = 64, 64
	if s.perUID != 0 {
		cfg.Runs.MaxConnectionsPerUID = s.perUID
	}
	if s.readTimeout != 0 {
		cfg.Runs.RequestTimeout.Duration = s.readTimeout
	}
	uid := strconv.Itoa(os.Getuid())
	cfg.Access = config.Access{Runners: []string{}, Approvers: []string{uid}, Admins: []string{uid}}
	if s.quota == (workspace.Quota{}) {
		s.quota = workspace.Quota{Bytes: 1 << 20, Files: 100}
	}
	cfg.Workspaces = config.Workspaces{MaxBytes: s.quota.Bytes, MaxFiles: s.quota.Files}
	if s.approvalTTL != 0 {
		cfg.Approvals.TTL.Duration = s.approvalTTL
	}
	cfg.Approvals.Window.Duration = time.Minute
	if s.writesHeld != nil && !*s.writesHeld {
		cfg.Approvals.Required = []string{}
	}
	if s.runsHeld {
		cfg.Approvals.Required = append(cfg.Approvals.Required, "run")
	}
	cfg.Approvals.Elicitation = s.elicitation
	cfg.Pool.Size = s.pool
	if s.sessions != nil {
		s.sessions(&cfg.Sessions)
	}
	cfg.Tools = s.tools
	d.cfg = cfg
	var err error
	d.d, err = sdaemon.Open(sdaemon.Options{Load: func() (config.Config, string, error) { return d.cfg, "", d.cfg.Validate() },
		Version: "test", Revision: "abc"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	d.stop = stop
	ran := make(chan error, 1)
	d.ran = ran
	go func() { ran <- d.d.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("the daemon's end: %v", err)
		}
	})
	select {
	case <-d.d.Ready():
	case err := <-ran:
		ran <- err
		t.Fatalf("the daemon did not become ready: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the daemon did not become ready in 2 minutes")
	}
	d.server, d.store = d.d.Server(), d.d.Store()
	d.handler = d.server.Handler()
	if s.access != nil {
		d.server.SetAccess(*s.access)
	}
	evs, err := d.store.Events(ctx, 0, "", 10000)
	for i := len(evs) - 1; i >= 0 && d.since == 0; i-- {
		if evs[i].Kind == store.DaemonStart {
			d.since = evs[i].Seq
		}
	}
	if err != nil || d.since == 0 || (s.dir == "" && len(evs) != 1) {
		t.Fatalf("the daemon's first records: %v %+v", err, evs)
	}
	d.client = client.HTTP(d.socket)
	return d
}

// reload changes the configuration and reloads it, as SIGHUP does.
func (d *daemon) reload(change func(*config.Config)) {
	change(&d.cfg)
	d.d.Reload()
}

func (d *daemon) do(t *testing.T, method, path, body string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://sandcell"+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := d.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func wantProblem(t *testing.T, resp *http.Response, body []byte, status int, code string) {
	t.Helper()
	var p wire.Problem
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal(body, &p) != nil || p.Code != code || p.Status != status {
		t.Fatalf("want %d %s, got %d %s: %s", status, code, resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

func TestRunOverSocket(t *testing.T) {
	d := start(t, setup{})
	resp, body := d.do(t, "POST", "/v1/runs", `{"code":"print(6*7)"}`)
	var v wire.View
	if err := json.Unmarshal(body, &v); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if v.State != wire.Done || v.Result == nil || string(v.Result.Stdout) != "42\n" || v.Result.Reason != protocol.Exited {
		t.Fatalf("%s", body)
	}
	if v.Result.Enforcement == nil || len(v.Result.Enforcement.Missing(protocol.Layers())) > 0 {
		t.Fatalf("contract: %s", body)
	}
	resp, body = d.do(t, "GET", "/v1/runs/"+v.ID, "")
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"stdout":"42\n"`)) {
		t.Fatalf("GET: %d %s", resp.StatusCode, body)
	}
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"import sys; print(sys.stdin.read(), sys.argv[1:])","stdin":"in","args":["a"],"limits":{"fuel":100000000000}}`)
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"stdout":"in ['a']\n"`)) || !bytes.Contains(body, []byte(`"fuel_consumed"`)) {
		t.Fatalf("stdin, args, fuel: %d %s", resp.StatusCode, body)
	}
	resp, body = d.do(t, "GET", "/metrics", "")
	for _, want := range []string{`sandcell_runs_total{reason="exited"} 2`, `sandcell_runs_total{reason="timeout"} 0`,
		`sandcell_run_duration_seconds_count 2`, `sandcell_build_info{revision="abc",version="test"} 1`,
		"sandcell_queue_depth 0", "sandcell_workers_busy 0"} {
		if resp.StatusCode != 200 || !bytes.Contains(body, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// The client package against the real daemon: a run waited for, a run started and
// cancelled, fetched again, and the daemon's refusals as *wire.Problem.
func TestClient(t *testing.T) {
	d := start(t, setup{})
	c := client.New(d.socket)
	ctx := t.Context()
	v, err := c.Run(ctx, wire.RunRequest{Code: "print(6*7)"})
	if err != nil || v.State != wire.Done || string(v.Result.Stdout) != "42\n" {
		t.Fatalf("run: %+v %v", v, err)
	}
	wait := false
	v, err = c.Run(ctx, wire.RunRequest{Code: "import time; time.sleep(60)", Wait: &wait})
	if err != nil || v.State == wire.Done {
		t.Fatalf("started: %+v %v", v, err)
	}
	got, err := c.Get(ctx, v.ID)
	if err != nil || got.ID != v.ID || got.State == wire.Done {
		t.Fatalf("get while running: %+v %v", got, err)
	}
	got, err = c.Cancel(ctx, v.ID)
	if err != nil || got.State != wire.Done || got.Result.Reason != protocol.Cancelled {
		t.Fatalf("cancel: %+v %v", got, err)
	}
	if again, err := c.Get(ctx, v.ID); err != nil || again.Result == nil || again.Result.Reason != protocol.Cancelled {
		t.Fatalf("get after cancel: %+v %v", again, err)
	}
	var p *wire.Problem
	if _, err := c.Get(ctx, "no-such-run"); !errors.As(err, &p) || p.Code != wire.CodeNotFound || p.Status != 404 {
		t.Fatalf("unknown run: %v", err)
	}
	if _, err := c.Run(ctx, wire.RunRequest{Code: "pass", Limits: wire.RunLimits{MemoryMiB: 1 << 20}}); !errors.As(err, &p) || p.Code != wire.CodeLimitExceeded {
		t.Fatalf("limit over policy: %v", err)
	}
}

func TestErrorsAreProblems(t *testing.T) {
	d := start(t, setup{})
	resp, body := d.do(t, "POST", "/v1/runs", `{"code":`)
	wantProblem(t, resp, body, 400, wire.CodeInvalidJSON)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"1","cod":"2"}`)
	wantProblem(t, resp, body, 400, wire.CodeUnknownField)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"1"} {"code":"2"}`)
	wantProblem(t, resp, body, 400, wire.CodeInvalidJSON)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"1","limits":{"timeout_ms":99999999}}`)
	wantProblem(t, resp, body, 400, wire.CodeLimitExceeded)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":""}`)
	wantProblem(t, resp, body, 400, wire.CodeBadRequest)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"1","env":{"SECRET":"x"}}`)
	wantProblem(t, resp, body, 400, wire.CodeBadRequest)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"`+strings.Repeat("x", 2<<20)+`"}`)
	wantProblem(t, resp, body, 413, wire.CodeBodyTooLarge)
	resp, body = d.do(t, "POST", "/v1/runs", `code=1`, "Content-Type", "application/x-www-form-urlencoded")
	wantProblem(t, resp, body, 415, wire.CodeUnsupportedMed)
	resp, body = d.do(t, "GET", "/v1/runs/nosuchrun", "")
	wantProblem(t, resp, body, 404, wire.CodeNotFound)
	resp, body = d.do(t, "GET", "/v2/elsewhere", "")
	wantProblem(t, resp, body, 404, wire.CodeNotFound)
	resp, body = d.do(t, "PUT", "/v1/runs", `{}`)
	wantProblem(t, resp, body, 405, wire.CodeMethod)
	// What encoding/json would quietly accept is refused.
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"print(1)","code":"print(2)"}`)
	wantProblem(t, resp, body, 400, wire.CodeInvalidJSON)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"print(1)","CODE":"print(3)"}`)
	wantProblem(t, resp, body, 400, wire.CodeUnknownField)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"print(1)","limits":{"timeout_ms":100,"timeout_ms":200}}`)
	wantProblem(t, resp, body, 400, wire.CodeInvalidJSON)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"print('\ud800')"}`)
	wantProblem(t, resp, body, 400, wire.CodeInvalidJSON)
	resp, body = d.do(t, "POST", "/v1/runs", "{\"code\":\"1\",\"args\":[\"\xff\"]}")
	wantProblem(t, resp, body, 400, wire.CodeInvalidJSON)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"1","stdin":"!!","stdin_encoding":"base64"}`)
	wantProblem(t, resp, body, 400, wire.CodeBadRequest)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"1","stdin":"x","stdin_encoding":"hex"}`)
	wantProblem(t, resp, body, 400, wire.CodeBadRequest)
	// Binary stdin travels as base64.
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"import sys; print(sys.stdin.buffer.read().hex())","stdin":"/wA=","stdin_encoding":"base64"}`)
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"stdout":"ff00\n"`)) {
		t.Fatalf("base64 stdin: %d %s", resp.StatusCode, body)
	}
	resp, body = d.do(t, "POST", "/v1/runs", "{\"code\":\"print('\xff')\"}")
	wantProblem(t, resp, body, 400, wire.CodeInvalidJSON)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"print(1)\u0000"}`)
	wantProblem(t, resp, body, 400, wire.CodeBadRequest)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"1","limits":{"memory_mib":17592186044672}}`)
	wantProblem(t, resp, body, 400, wire.CodeLimitExceeded)
	// A limit refused is named as the caller named it, in its units, once.
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"1","limits":{"memory_mib":100000,"max_output_bytes":1099511627776,"timeout_ms":-1}}`)
	wantProblem(t, resp, body, 400, wire.CodeLimitExceeded)
	for _, want := range []string{"limits.memory_mib 100000 exceeds the 4096 a wasm32 guest can address", "limits.timeout_ms is negative (-1)"} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("no %q in %s", want, body)
		}
	}
	if bytes.Count(body, []byte("limits.max_output_bytes 1099511627776 is above the maximum")) != 1 || bytes.Contains(body, []byte("memory_bytes")) || bytes.Contains(body, []byte("max_stdout")) {
		t.Errorf("limits not in the API's names: %s", body)
	}
	// Values that would overflow as bytes are refused, not wrapped into range.
	for _, m := range []string{"-17592186044416", "-17592186044160", "-9223372036854775808", "17592186044416"} {
		resp, body = d.do(t, "POST", "/v1/runs", `{"code":"1","limits":{"memory_mib":`+m+`}}`)
		wantProblem(t, resp, body, 400, wire.CodeLimitExceeded)
	}
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"1","limits":{"memory_mb":256}}`)
	wantProblem(t, resp, body, 400, wire.CodeUnknownField)
	// U+FFFD spelled out is a character like any other; media types ignore case.
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"print(ascii('\ufffd'))"}`, "Content-Type", "Application/JSON; charset=utf-8")
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`ufffd`)) {
		t.Fatalf("U+FFFD: %d %s", resp.StatusCode, body)
	}
	d.reload(func(c *config.Config) { c.Disabled = true })
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"1"}`)
	wantProblem(t, resp, body, 503, wire.CodeDisabled)
}

// A body larger than the limit is refused before it is read in full: the server
// answers while the client is still sending.
func TestOversizedBodyNotReadInFull(t *testing.T) {
	d := start(t, setup{})
	var sent atomic.Int64
	pr, pw := io.Pipe()
	go func() {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		pw.Write([]byte(`{"code":"`))
		for i := 0; i < 1024; i++ { // up to 64 MiB
			if _, err := pw.Write(chunk); err != nil {
				return
			}
			sent.Add(int64(len(chunk)))
		}
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", "http://sandcell/v1/runs", pr)
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	pr.CloseWithError(io.ErrClosedPipe)
	wantProblem(t, resp, body, 413, wire.CodeBodyTooLarge)
	if sent.Load() >= 64<<20 {
		t.Fatalf("the server read all %d bytes", sent.Load())
	}
}

func TestAsyncCancelAndQueue(t *testing.T) {
	d := start(t, setup{concurrency: 1, queue: 0})
	resp, body := d.do(t, "POST", "/v1/runs", `{"code":"while True: pass","wait":false}`)
	var v wire.View
	json.Unmarshal(body, &v)
	if resp.StatusCode != 202 || resp.Header.Get("Location") != "/v1/runs/"+v.ID || v.State == wire.Done {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	// The only worker is busy and there is no queue: 429 with Retry-After.
	time.Sleep(50 * time.Millisecond)
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"print(1)"}`)
	wantProblem(t, resp, body, 429, wire.CodeQueueFull)
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	began := time.Now()
	resp, body = d.do(t, "DELETE", "/v1/runs/"+v.ID, "")
	took := time.Since(began)
	json.Unmarshal(body, &v)
	if resp.StatusCode != 200 || v.State != wire.Done || v.Result.Reason != protocol.Cancelled {
		t.Fatalf("cancel: %d %s", resp.StatusCode, body)
	}
	t.Logf("cancel answered in %v", took)
	// Cancelling again changes nothing; the slot is free again.
	resp, body = d.do(t, "DELETE", "/v1/runs/"+v.ID, "")
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"reason":"cancelled"`)) {
		t.Fatalf("second cancel: %d %s", resp.StatusCode, body)
	}
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"print(1)"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("after cancel: %d %s", resp.StatusCode, body)
	}
}

// Callers are identified by SO_PEERCRED: without a role, 403; health endpoints stay
// open to anyone who can connect.
func TestPeerCredentials(t *testing.T) {
	nobody := api.Access{Runners: api.Principals{UIDs: map[int]bool{os.Getuid() + 12345: true}}}
	d := start(t, setup{access: &nobody})
	resp, body := d.do(t, "POST", "/v1/runs", `{"code":"print(1)"}`)
	wantProblem(t, resp, body, 403, wire.CodeForbidden)
	resp, body = d.do(t, "GET", "/v1/info", "")
	wantProblem(t, resp, body, 403, wire.CodeForbidden)
	for _, p := range []string{"/livez", "/healthz", "/readyz"} {
		if resp, body := d.do(t, "GET", p, ""); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", p, resp.StatusCode, body)
		}
	}
	byGroup := api.Access{Runners: api.Principals{GIDs: map[int]bool{os.Getgid(): true}}}
	d = start(t, setup{access: &byGroup})
	if resp, body := d.do(t, "GET", "/v1/info", ""); resp.StatusCode != 200 {
		t.Fatalf("runner by group: %d %s", resp.StatusCode, body)
	}
}

func TestSocketFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.sock")
	l, err := api.ListenUnix(path, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o660 || st.Mode()&os.ModeSocket == 0 {
		t.Fatalf("mode %v", st.Mode())
	}
	// A live socket is not stolen.
	if _, err := api.ListenUnix(path, 0o660, -1); err == nil || !strings.Contains(err.Error(), "another daemon") {
		t.Fatalf("second listener: %v", err)
	}
	// A stale one (its listener gone without removing it) is replaced.
	l.SetUnlinkOnClose(false)
	l.Close()
	l2, err := api.ListenUnix(path, 0o600, -1)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	l2.Close()
	// Not a socket: refused, left alone.
	os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644)
	if _, err := api.ListenUnix(filepath.Join(dir, "file"), 0o660, -1); err == nil {
		t.Fatal("listened over a regular file")
	}
}

// Every decision is in the audit log, the chain verifies, and when the log cannot be
// written no run starts.
func TestAudit(t *testing.T) {
	nobody := api.Access{Runners: api.Principals{UIDs: map[int]bool{os.Getuid(): true}}}
	d := start(t, setup{access: &nobody})
	d.do(t, "POST", "/v1/runs", `{"code":"print(1)"}`)
	d.do(t, "POST", "/v1/runs", `{"code":"1","limits":{"timeout_ms":99999999}}`)
	ctx := context.Background()
	n, err := d.store.Verify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := d.store.Events(ctx, d.since, "", 100)
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, string(e.Kind))
		if e.UID != os.Getuid() {
			t.Errorf("event %s has uid %d", e.Kind, e.UID)
		}
	}
	got := strings.Join(kinds, ",")
	// The finish may be recorded before or after the admission reaches the log.
	if n != 5 || !strings.Contains(got, "run.requested") || !strings.Contains(got, "run.admitted") ||
		!strings.Contains(got, "run.finished") || !strings.HasSuffix(got, "run.refused") {
		t.Fatalf("%d events: %s", n, got)
	}
	if !bytes.Contains(evs[0].Detail, []byte(`"code_sha256"`)) || bytes.Contains(evs[0].Detail, []byte("print(1)")) {
		t.Fatalf("requested: %s", evs[0].Detail)
	}

	// Only admins read the log.
	resp, body := d.do(t, "GET", "/v1/audit", "")
	wantProblem(t, resp, body, 403, wire.CodeForbidden)
	d.store.Close()
	resp, body = d.do(t, "POST", "/v1/runs", `{"code":"print(1)"}`)
	wantProblem(t, resp, body, 503, wire.CodeAuditDown)
}

// While the audit log cannot be written (another process holds its write lock), no
// run starts; when the lock goes, runs start again without a restart.
func TestAuditRecovers(t *testing.T) {
	d := start(t, setup{})
	other, err := sql.Open("sqlite", "file:"+d.auditPath)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	resp, body := d.do(t, "POST", "/v1/runs", `{"code":"print(1)"}`)
	wantProblem(t, resp, body, 503, wire.CodeAuditDown)
	// Known to be down, the log is not waited for again: the next refusals come at
	// once, not after SQLite's busy timeout (5 s) each (they had taken 10 to 15 s,
	// behind the daemon's own look at the log).
	for i := 0; i < 3; i++ {
		began := time.Now()
		resp, body = d.do(t, "POST", "/v1/runs", `{"code":"print(1)"}`)
		wantProblem(t, resp, body, 503, wire.CodeNotReady)
		if took := time.Since(began); took > 2500*time.Millisecond {
			t.Fatalf("a refusal while the log is down took %s", took)
		}
	}
	if _, err := conn.ExecContext(context.Background(), "COMMIT"); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	// Unready while the log cannot be written; ready again once it can, with no
	// request needed to find out (the daemon looks every 5 s).
	if resp, body := d.do(t, "GET", "/readyz", ""); resp.StatusCode != 503 || !bytes.Contains(body, []byte("audit")) {
		t.Fatalf("readyz with the log locked: %d %s", resp.StatusCode, body)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, body := d.do(t, "GET", "/readyz", "")
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz after the lock went: %d %s", resp.StatusCode, body)
		}
	}
	if resp, body := d.do(t, "POST", "/v1/runs", `{"code":"print(1)"}`); resp.StatusCode != 200 {
		t.Fatalf("after the lock: %d %s", resp.StatusCode, body)
	}
	if n, err := d.store.Verify(context.Background()); err != nil {
		t.Fatalf("chain of %d: %v", n, err)
	}
}

func TestDeniedCallerAudited(t *testing.T) {
	other := api.Access{Runners: api.Principals{UIDs: map[int]bool{os.Getuid() + 1: true}}}
	d := start(t, setup{access: &other})
	resp, body := d.do(t, "POST", "/v1/runs", `{"code":"print(1)"}`)
	wantProblem(t, resp, body, 403, wire.CodeForbidden)
	evs, _ := d.store.Events(context.Background(), d.since, "", 10)
	if len(evs) != 1 || evs[0].Kind != "access.denied" || evs[0].UID != os.Getuid() {
		t.Fatalf("%+v", evs)
	}
}

// A real caller with another uid (uid 65534, through setpriv and curl) is refused and
// the refusal audited, while the socket's own user is served.
func TestOtherUIDRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	for _, tool := range []string{"setpriv", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	dir, err := os.MkdirTemp("", "sandcell-api-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	d := start(t, setup{})
	// A second socket, world-connectable, in a directory uid 65534 can reach.
	sock := filepath.Join(dir, "s.sock")
	l, err := api.ListenUnix(sock, 0o666, -1)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: d.handler, ConnContext: api.ConnContext}
	go srv.Serve(l)
	defer srv.Close()
	out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		"curl", "-s", "--unix-socket", sock, "-H", "Content-Type: application/json",
		"-d", `{"code":"print(1)"}`, "http://sandcell/v1/runs").Output()
	if err != nil || !bytes.Contains(out, []byte(`"code":"forbidden"`)) || !bytes.Contains(out, []byte("uid 65534")) {
		t.Fatalf("uid 65534: %v %s", err, out)
	}
	evs, _ := d.store.Events(context.Background(), d.since, "", 10)
	if len(evs) != 1 || evs[0].Kind != "access.denied" || evs[0].UID != 65534 {
		t.Fatalf("%+v", evs)
	}
	// A runner by a supplementary group (read with SO_PEERGROUPS at accept).
	byGroup := api.Access{Runners: api.Principals{GIDs: map[int]bool{4242: true}}}
	d.server.SetAccess(byGroup)
	out, err = exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--groups=4242",
		"curl", "-s", "--unix-socket", sock, "http://sandcell/v1/info").Output()
	if err != nil || !bytes.Contains(out, []byte(`"version"`)) {
		t.Fatalf("uid 65534 in group 4242: %v %s", err, out)
	}
}

// The OpenAPI document and the server agree: the same routes, the same statuses.
func TestOpenAPI(t *testing.T) {
	d := start(t, setup{})
	resp, body := d.do(t, "GET", "/v1/openapi.json", "")
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &doc) != nil || doc.OpenAPI != "3.1.0" {
		t.Fatalf("%d %.200s", resp.StatusCode, body)
	}
	inDoc := map[string][]int{}
	for path, ops := range doc.Paths {
		// OpenAPI's {id} is echo's :id; {path}, the rest of the path, is echo's *.
		echoPath := strings.ReplaceAll(path, "{path}", "*")
		echoPath = regexp.MustCompile(`\{(\w+)\}`).ReplaceAllString(echoPath, ":$1")
		for method, raw := range ops {
			if method == "parameters" {
				continue
			}
			var op struct {
				Responses map[string]json.RawMessage `json:"responses"`
			}
			json.Unmarshal(raw, &op)
			var codes []int
			for code := range op.Responses {
				var n int
				fmt.Sscan(code, &n)
				codes = append(codes, n)
			}
			sort.Ints(codes)
			inDoc[strings.ToUpper(method)+" "+echoPath] = codes
		}
	}
	for route, want := range api.Statuses() {
		if got := inDoc[route]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: document says %v, server %v", route, got, want)
		}
	}
	for route := range inDoc {
		if _, ok := api.Statuses()[route]; !ok {
			t.Errorf("%s is in the document, not in the server", route)
		}
	}
	for _, route := range d.server.Routes() {
		if _, ok := api.Statuses()[route]; !ok {
			t.Errorf("the server has %s, the document does not", route)
		}
	}
	if len(d.server.Routes()) != len(api.Statuses()) {
		t.Errorf("server routes %v", d.server.Routes())
	}
	var codes struct {
		Components struct {
			Schemas struct {
				Problem struct {
					Properties struct {
						Code struct {
							Enum []string `json:"enum"`
						} `json:"code"`
					} `json:"properties"`
				}
			} `json:"schemas"`
		} `json:"components"`
	}
	json.Unmarshal(body, &codes)
	inDocCodes := codes.Components.Schemas.Problem.Properties.Code.Enum
	sort.Strings(inDocCodes)
	want := append([]string(nil), wire.Codes()...)
	sort.Strings(want)
	if fmt.Sprint(inDocCodes) != fmt.Sprint(want) {
		t.Errorf("problem codes: document %v, server %v", inDocCodes, want)
	}
}

// At most max connections are served at once. At the bound, a new connection takes
// the slot of the one idle the longest (closed for it); when every connection is in
// the middle of a request, it waits a second and is refused (slow clients cannot take
// descriptors without bound, and idle ones cannot keep others out).
func TestConnectionLimit(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	l, err := api.ListenUnix(sock, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	unblock := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			<-unblock
		}
		p, ok := api.PeerFrom(r.Context())
		if api.ProbeOnly(r.Context()) {
			fmt.Fprint(w, "probe slot")
			return
		}
		fmt.Fprintf(w, "%v %d", ok, p.UID)
	}), ConnContext: api.ConnContext, ConnState: api.ConnState}
	go srv.Serve(api.Listen(l, 2, 2))
	defer srv.Close()
	var busy []net.Conn
	for i := 0; i < 2; i++ {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("GET /block HTTP/1.1\r\nHost: x\r\n\r\n")) // a request being served
		busy = append(busy, c)
	}
	time.Sleep(100 * time.Millisecond)
	client := client.HTTP(sock)
	client.Timeout = 3 * time.Second
	// A third connection, while two requests are in progress, holds a probe slot
	// (and is not kept: this handler, unlike the API's, does not close it).
	once := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}, Timeout: 3 * time.Second}
	resp, err := once.Get("http://x/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "probe slot" {
		t.Fatalf("a third connection while two requests were in progress: %s", b)
	}
	// The two requests end; their connections stay open, idle.
	close(unblock)
	time.Sleep(100 * time.Millisecond)
	client.Timeout = 5 * time.Second
	get := func() {
		t.Helper()
		resp, err := client.Get("http://x/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != fmt.Sprintf("true %d", os.Getuid()) {
			t.Fatalf("peer: %s", b)
		}
	}
	get()
	// The bound is full of idle connections again (one of the first two and the
	// client's): a new one is served by closing the one idle the longest.
	other := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}, Timeout: 5 * time.Second}
	defer other.CloseIdleConnections()
	resp, err = other.Get("http://x/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	for _, c := range busy {
		c.Close()
	}
	client.CloseIdleConnections()
	get()
}

// One uid cannot hold every connection: past its own limit a connection is kept for
// the health endpoints (its probes still answered), past four of those it is
// answered 429 at once, while the global limit still has room for others.
func TestConnectionLimitPerUID(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := api.ListenUnix(sock, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, api.ProbeOnly(r.Context()))
	}), ConnContext: api.ConnContext}
	go srv.Serve(api.Listen(l, 16, 2))
	defer srv.Close()
	for i := 0; i < 2; i++ {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	time.Sleep(50 * time.Millisecond)
	// Four keep-alive clients, one connection each, all on probe slots.
	for i := 0; i < 4; i++ {
		cl := client.HTTP(sock)
		defer cl.CloseIdleConnections()
		resp, err := cl.Get("http://x/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "true" {
			t.Fatalf("connection %d past the uid's limit: probe only %s, want true", i+3, body)
		}
	}
	// The refusal is written as the connection is accepted, perhaps before a request
	// is sent (Go's client then calls it unsolicited): read it on a raw connection.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n") // (the daemon may have closed it already)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantProblem(t, resp, body, 429, wire.CodeConnLimit)
}

// A body that stops arriving is answered 408 request_timeout.
func TestSlowBody(t *testing.T) {
	d := start(t, setup{readTimeout: time.Second})
	c, err := net.Dial("unix", d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"code\":")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	wantProblem(t, resp, body, 408, wire.CodeTimeout)
}

func TestAuditEndpoint(t *testing.T) {
	d := start(t, setup{}) // the caller is an admin
	d.do(t, "POST", "/v1/runs", `{"code":"print(1)"}`)
	resp, body := d.do(t, "GET", fmt.Sprintf("/v1/audit?after=%d&limit=2", d.since), "")
	var page struct {
		Events []struct {
			Seq  int64  `json:"seq"`
			Kind string `json:"kind"`
		} `json:"events"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &page) != nil || len(page.Events) != 2 || page.Events[0].Kind != "run.requested" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = d.do(t, "GET", fmt.Sprintf("/v1/audit?after=%d", page.Events[1].Seq), "")
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte("run.finished")) && !bytes.Contains(body, []byte("run.admitted")) {
		t.Fatalf("next page: %d %s", resp.StatusCode, body)
	}
	resp, body = d.do(t, "GET", "/v1/audit?limit=5000", "")
	wantProblem(t, resp, body, 400, wire.CodeBadRequest)
}
