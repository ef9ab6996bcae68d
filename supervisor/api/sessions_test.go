package api_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// openSession opens a session with body and returns its id.
func (d *daemon) openSession(t *testing.T, body string) string {
	t.Helper()
	resp, b := d.do(t, "POST", "/v1/sessions", body)
	var v struct {
		ID          string               `json:"id"`
		State       string               `json:"state"`
		Enforcement protocol.Enforcement `json:"enforcement"`
	}
	// "busy": a test's pause_after of a fraction of a second can pass on a loaded
	// machine between the session's opening and its answer, and its pause begin.
	if resp.StatusCode != 201 || json.Unmarshal(b, &v) != nil || v.ID == "" || v.State != "ready" && v.State != "busy" ||
		len(v.Enforcement.ActiveLayers()) == 0 {
		t.Fatalf("open session: %d %s", resp.StatusCode, b)
	}
	return v.ID
}

// cell runs body as a cell of session id and decodes the answer.
func (d *daemon) cell(t *testing.T, id, body string) (int, wire.CellAnswer, []byte) {
	t.Helper()
	resp, b := d.do(t, "POST", "/v1/sessions/"+id+"/cells", body)
	var a wire.CellAnswer
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("cell answer: %v %s", err, b)
		}
	}
	return resp.StatusCode, a, b
}

// A session over the API keeps state across cells and says so in every answer; a
// cell past its time is rolled back; one that cannot be interrupted says the state
// is lost, and so does every request after it;
// a cell while another runs is 409; another caller's session does not exist for
// it; closing ends it; each event has its audit record.
func TestSessionAPI(t *testing.T) {
	d := start(t, setup{access: &api.Access{Admins: api.Principals{UIDs: map[int]bool{os.Getuid(): true}},
		Tokens: api.Tokens{aliceToken}}})
	tcp := d.listenTCP(t)
	id := d.openSession(t, `{}`)
	code, a, b := d.cell(t, id, `{"code": "x = 41"}`)
	if code != 200 || a.State != "preserved" || a.Result.Reason != protocol.Exited || a.Session.Cells != 1 {
		t.Fatalf("first cell: %d %s", code, b)
	}
	code, a, b = d.cell(t, id, `{"code": "x + 1"}`)
	if code != 200 || a.State != "preserved" || a.Value != "42" || len(a.Result.Stdout) != 0 || a.Result.Enforcement == nil {
		t.Fatalf("second cell: %d %s", code, b)
	}
	// Another caller: the session does not exist for it.
	for _, m := range []struct{ method, path, body string }{
		{"GET", "/v1/sessions/" + id, ""}, {"DELETE", "/v1/sessions/" + id, ""},
		{"POST", "/v1/sessions/" + id + "/cells", `{"code": "print(x)"}`},
		{"POST", "/v1/sessions/" + id + "/fork", ""},
	} {
		if status, body := tcpDo(t, tcp, aliceSecret, m.method, m.path, m.body); status != 404 || body["code"] != wire.CodeNotFound {
			t.Fatalf("another caller's %s: %d %v", m.method, status, body)
		}
	}
	if status, body := tcpDo(t, tcp, aliceSecret, "GET", "/v1/sessions", ""); status != 200 || len(body["sessions"].([]any)) != 0 {
		t.Fatalf("another caller's list: %d %v", status, body)
	}
	// One cell at a time.
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.cell(t, id, `{"code": "import time\ntime.sleep(1.5)\ny = 2"}`)
	}()
	time.Sleep(500 * time.Millisecond)
	resp, body := d.do(t, "POST", "/v1/sessions/"+id+"/cells", `{"code": "print(x)"}`)
	wantProblem(t, resp, body, 409, wire.CodeSessionBusy)
	<-done
	if code, a, b = d.cell(t, id, `{"code": "x, y"}`); code != 200 || a.Value != "(41, 2)" {
		t.Fatalf("after the busy cell: %d %s", code, b)
	}
	// Past its time: rolled back, the state as it was before it.
	code, a, b = d.cell(t, id, `{"code": "x = 0\nwhile True: pass", "limits": {"timeout_ms": 500}}`)
	if code != 200 || a.State != "rolled_back" || a.Result.Reason != protocol.Timeout || a.Session.State != "ready" {
		t.Fatalf("a cell past its time: %d %s", code, b)
	}
	if code, a, b = d.cell(t, id, `{"code": "x"}`); code != 200 || a.Value != "41" {
		t.Fatalf("after the rolled-back cell: %d %s", code, b)
	}
	// Asleep past its time, it cannot be interrupted: lost, and said so from then on.
	code, a, b = d.cell(t, id, `{"code": "import time\ntime.sleep(30)", "limits": {"timeout_ms": 300}}`)
	if code != 200 || a.State != "lost" || a.Result.Reason != protocol.Timeout || a.Session.State != "lost" {
		t.Fatalf("a cell asleep past its time: %d %s", code, b)
	}
	resp, body = d.do(t, "POST", "/v1/sessions/"+id+"/cells", `{"code": "print(x)"}`)
	wantProblem(t, resp, body, 410, wire.CodeSessionLost)
	resp, body = d.do(t, "GET", "/v1/sessions/"+id, "")
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"state":"lost"`) {
		t.Fatalf("a lost session: %d %s", resp.StatusCode, body)
	}
	if resp, _ := d.do(t, "DELETE", "/v1/sessions/"+id, ""); resp.StatusCode != 204 {
		t.Fatalf("close: %d", resp.StatusCode)
	}
	resp, body = d.do(t, "GET", "/v1/sessions/"+id, "")
	wantProblem(t, resp, body, 404, wire.CodeNotFound)

	evs, _ := d.store.Events(t.Context(), d.since, "", 1000)
	count := map[store.Kind]int{}
	for _, e := range evs {
		count[e.Kind]++
	}
	if count[store.SessionOpened] != 1 || count[store.SessionCell] != 7 || count[store.SessionCellFinished] != 7 ||
		count[store.SessionClosed] != 1 || count[store.SessionRefused] < 2 {
		t.Fatalf("audit records: %v", count)
	}
}

// Sessions are bounded per caller; bad input gets the API's usual problems; a
// named workspace's session sees its files and keeps it from being deleted.
func TestSessionLimitsAndWorkspace(t *testing.T) {
	d := start(t, setup{})
	ws := d.newWorkspace(t)
	if resp, _ := d.do(t, "PUT", "/v1/workspaces/"+ws+"/files/in.txt", "data"); resp.StatusCode != 201 {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	id := d.openSession(t, `{"workspace": "`+ws+`", "limits": {"memory_mib": 128}}`)
	code, a, b := d.cell(t, id, `{"code": "open('in.txt').read()"}`)
	if code != 200 || a.Value != "'data'" {
		t.Fatalf("a named workspace's file: %d %s", code, b)
	}
	resp, body := d.do(t, "DELETE", "/v1/workspaces/"+ws, "")
	wantProblem(t, resp, body, 409, wire.CodeWorkspaceBusy)
	// Past the quota: the cell is rolled back, and the next is refused until files go.
	code, a, b = d.cell(t, id, `{"code": "import itertools\nfor i in itertools.count():\n  open('f%d' % i, 'wb').write(b'x' * (200 << 10))"}`)
	if code != 200 || a.State != "rolled_back" || a.Result.Reason != protocol.QuotaExceeded {
		t.Fatalf("a cell past the quota: %d %s", code, b)
	}
	resp, body = d.do(t, "POST", "/v1/sessions/"+id+"/cells", `{"code": "1"}`)
	wantProblem(t, resp, body, 507, wire.CodeQuota)
	d.openSession(t, `{}`)
	resp, body = d.do(t, "POST", "/v1/sessions", `{}`)
	wantProblem(t, resp, body, 429, wire.CodeSessionLimit)
	for _, c := range []struct {
		path, body string
		status     int
		code       string
	}{
		{"/v1/sessions", `{"limits": {"memory_mib": 100000}}`, 400, wire.CodeLimitExceeded},
		{"/v1/sessions", `{"workspace": "nope"}`, 404, wire.CodeNotFound},
		{"/v1/sessions", `{"bogus": 1}`, 400, wire.CodeUnknownField},
		{"/v1/sessions/" + id + "/cells", `{"code": ""}`, 400, wire.CodeBadRequest},
		{"/v1/sessions/" + id + "/cells", `{"code": "1", "limits": {"memory_mib": 10}}`, 400, wire.CodeLimitExceeded},
		{"/v1/sessions/" + id + "/cells", `{"code": "1", "limits": {"timeout_ms": 99999999}}`, 400, wire.CodeLimitExceeded},
		{"/v1/sessions/nosuch/cells", `{"code": "1"}`, 404, wire.CodeNotFound},
	} {
		resp, body := d.do(t, "POST", c.path, c.body)
		wantProblem(t, resp, body, c.status, c.code)
	}
	if resp, _ := d.do(t, "DELETE", "/v1/sessions/"+id, ""); resp.StatusCode != 204 {
		t.Fatalf("close: %d", resp.StatusCode)
	}
	if resp, _ := d.do(t, "DELETE", "/v1/workspaces/"+ws, ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("the workspace after its session: %d", resp.StatusCode)
	}
}

// A daemon that stops ends its sessions at once, a running cell's included (one
// asleep for 20 s had held the stop for all of it), and that cell's answer, if it
// gets one, says the state is lost.
func TestSessionEndsWithTheDaemon(t *testing.T) {
	d := start(t, setup{})
	id := d.openSession(t, `{}`)
	answered := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://sandcell/v1/sessions/"+id+"/cells",
			strings.NewReader(`{"code": "import time\ntime.sleep(20)", "limits": {"timeout_ms": 30000}}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := d.client.Do(req)
		if err != nil {
			answered <- "no answer: " + err.Error()
			return
		}
		defer resp.Body.Close()
		var a wire.CellAnswer
		json.NewDecoder(resp.Body).Decode(&a)
		answered <- string(a.State)
	}()
	time.Sleep(500 * time.Millisecond)
	began := time.Now()
	d.stop()
	err := <-d.ran
	d.ran <- err // for the cleanup
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("the daemon took %s to stop with a cell running", took)
	}
	select {
	case got := <-answered:
		if got == string(wire.SessionPreserved) || got == string(wire.SessionRolledBack) {
			t.Fatalf("a cell ended by the daemon's stop answered %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cell's request did not end with the daemon")
	}
}

// A session outlives its daemon: the stop pauses it to disk, the next daemon takes
// it back, and its next cell finds its state (restored, files it held open
// closed). A fork diverges from its session in memory and in files. Idle sessions,
// and those past the memory budget, are paused and resume on their next cell. A
// checkpoint of another interpreter is not resumed: the session says it is lost.
func TestSessionSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	restart := func(d *daemon, sessions func(*config.Sessions)) *daemon {
		d.stop()
		err := <-d.ran
		d.ran <- err // for the cleanup
		if err != nil {
			t.Fatalf("the daemon's stop: %v", err)
		}
		return start(t, setup{dir: dir, sessions: sessions})
	}
	want := func(d *daemon, id, code, state, value string) wire.CellAnswer {
		t.Helper()
		status, a, b := d.cell(t, id, code)
		if status != 200 || string(a.State) != state || a.Value != value {
			t.Fatalf("cell %q: %d %s", code, status, b)
		}
		return a
	}

	d := start(t, setup{dir: dir})
	id := d.openSession(t, `{}`)
	want(d, id, `{"code": "x = 41\nopen('/ws/f.txt', 'w').write('a')\nfh = open('/ws/f.txt')"}`, "preserved", "")

	d = restart(d, func(c *config.Sessions) { c.MemoryBudget = 1 })
	if v := d.sessionView(t, id); v.State != "paused" || v.CheckpointBytes < 1<<20 {
		t.Fatalf("after the restart: %+v", v)
	}
	a := want(d, id, `{"code": "x + 1"}`, "restored", "42")
	if a.Session.RestoredAt == nil || len(a.Result.Enforcement.ActiveLayers()) == 0 {
		t.Fatalf("the restored session's answer: %+v", a.Session)
	}
	if _, a, b := d.cell(t, id, `{"code": "fh.read()"}`); a.State != "preserved" || !strings.Contains(string(a.Result.Stderr), "closed file") {
		t.Fatalf("a file held open across the restart: %s", b)
	}
	want(d, id, `{"code": "open('/ws/f.txt').read()"}`, "preserved", "'a'")

	// A fork: the same state, its own memory and its own copy of the files.
	resp, b := d.do(t, "POST", "/v1/sessions/"+id+"/fork", "")
	var fork wire.SessionView
	if resp.StatusCode != 201 || json.Unmarshal(b, &fork) != nil || fork.ForkedFrom != id || fork.ID == id {
		t.Fatalf("fork: %d %s", resp.StatusCode, b)
	}
	want(d, fork.ID, `{"code": "x = 100\nopen('/ws/f.txt', 'w').write('fork')\nx"}`, "restored", "100")
	// The budget (1 byte) pauses the least recently used idle session: the fork's
	// cell paused id.
	if v := d.sessionView(t, id); v.State != "paused" {
		t.Fatalf("past the memory budget, the idle session is %s", v.State)
	}
	want(d, id, `{"code": "x, open('/ws/f.txt').read()"}`, "restored", "(41, 'a')")
	want(d, fork.ID, `{"code": "x, open('/ws/f.txt').read()"}`, "restored", "(100, 'fork')")

	// Idle: paused after pause_after, resumed by the next cell.
	d = restart(d, func(c *config.Sessions) { c.PauseAfter.Duration = time.Second })
	want(d, id, `{"code": "y = x * 2"}`, "restored", "")
	deadline := time.Now().Add(10 * time.Second)
	for d.sessionView(t, id).State != "paused" {
		if time.Now().After(deadline) {
			t.Fatalf("an idle session was not paused: %+v", d.sessionView(t, id))
		}
		time.Sleep(200 * time.Millisecond)
	}
	want(d, id, `{"code": "y"}`, "restored", "82")

	// Another interpreter: the fork's checkpoint is said to be lost, not resumed.
	d.stop()
	err := <-d.ran
	d.ran <- err
	rec := filepath.Join(dir, "state", "sessions", fork.ID, "session.json")
	b, _ = os.ReadFile(rec)
	os.WriteFile(rec, []byte(strings.Replace(string(b), `"interpreter":"`, `"interpreter":"other-`, 1)), 0o600)
	d = start(t, setup{dir: dir})
	if v := d.sessionView(t, fork.ID); v.State != "lost" || !strings.Contains(v.Lost, "another interpreter") {
		t.Fatalf("a checkpoint of another interpreter: %+v", v)
	}
	resp, b = d.do(t, "POST", "/v1/sessions/"+fork.ID+"/cells", `{"code": "x"}`)
	wantProblem(t, resp, b, 410, wire.CodeSessionLost)
	want(d, id, `{"code": "x, y"}`, "restored", "(41, 82)")

	// A daemon killed while a session was live leaves its record as it was while
	// it lived, and no checkpoint: the session comes back lost, and says why. One
	// that cannot be paused within its caller's disk bound is lost at the stop.
	live, _ := os.ReadFile(filepath.Join(dir, "state", "sessions", id, "session.json"))
	if resp, _ := d.do(t, "DELETE", "/v1/sessions/"+fork.ID, ""); resp.StatusCode != 204 {
		t.Fatalf("closing a lost session: %d", resp.StatusCode)
	}
	other := d.openSession(t, `{}`)
	want(d, other, `{"code": "z = 1"}`, "preserved", "")
	d = restart(d, func(c *config.Sessions) { c.MaxPausedBytesPerCaller = 1 << 20 })
	want(d, other, `{"code": "z"}`, "restored", "1") // live under the bound
	d.stop()
	err = <-d.ran
	d.ran <- err
	os.WriteFile(filepath.Join(dir, "state", "sessions", id, "session.json"), live, 0o600)
	os.Remove(filepath.Join(dir, "state", "sessions", id, "checkpoint"))
	d = start(t, setup{dir: dir})
	if v := d.sessionView(t, id); v.State != "lost" || !strings.Contains(v.Lost, "killed") {
		t.Fatalf("a session live when its daemon was killed: %+v", v)
	}
	if v := d.sessionView(t, other); v.State != "lost" || !strings.Contains(v.Lost, "could not pause") {
		t.Fatalf("a session past its caller's disk bound at the stop: %+v", v)
	}

	evs, _ := d.store.Events(t.Context(), 0, "", 10000)
	count := map[store.Kind]int{}
	for _, e := range evs {
		count[e.Kind]++
	}
	if count[store.SessionPaused] < 4 || count[store.SessionResumed] < 4 || count[store.SessionLost] != 3 {
		t.Fatalf("audit records: %v", count)
	}
}

// A cell asked for with Accept: text/event-stream answers with its output as it
// comes (the first line well before the cell ends), then the answer with the value;
// a refusal before the cell runs is a problem document as any.
func TestSessionCellEvents(t *testing.T) {
	d := start(t, setup{})
	id := d.openSession(t, `{}`)
	req, _ := http.NewRequest("POST", "http://sandcell/v1/sessions/"+id+"/cells",
		strings.NewReader(`{"code": "import time\nprint('a', flush=True)\ntime.sleep(0.5)\nprint('b')\n6 * 7"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	began := time.Now()
	resp, err := d.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("a streamed cell: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var got []string
	var first, last time.Duration
	var a wire.CellAnswer
	readEvents(t, resp, func(ev sseEvent) bool {
		if first == 0 {
			first = time.Since(began)
		}
		switch ev.event {
		case "stdout", "stderr":
			var o struct{ Data string }
			json.Unmarshal([]byte(ev.data), &o)
			got = append(got, ev.event+":"+o.Data)
		case "answer":
			last = time.Since(began)
			if err := json.Unmarshal([]byte(ev.data), &a); err != nil {
				t.Fatalf("the answer event: %v %s", err, ev.data)
			}
		default:
			got = append(got, ev.event)
		}
		return true
	})
	// How the output is cut into events depends on how the worker's reads fall (the
	// guest may write "a" and its line end apart): what counts is the text, in order,
	// the first part of it well before the answer.
	var streamed strings.Builder
	for _, g := range got {
		data, ok := strings.CutPrefix(g, "stdout:")
		if !ok {
			t.Fatalf("events %q: not all stdout", got)
		}
		streamed.WriteString(data)
	}
	if streamed.String() != "a\nb\n" || !strings.HasPrefix(got[0], "stdout:a") || a.State != wire.SessionPreserved ||
		a.Value != "42" || string(a.Result.Stdout) != "a\nb\n" {
		t.Fatalf("events %q, answer %+v", got, a)
	}
	if last-first < 300*time.Millisecond {
		t.Fatalf("the first output came %s before the answer: not as it was produced", last-first)
	}
	// A refusal before the cell runs: a problem, not a stream.
	req, _ = http.NewRequest("POST", "http://sandcell/v1/sessions/nope/cells", strings.NewReader(`{"code": "1"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err = d.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantProblem(t, resp, b, 404, wire.CodeNotFound)
}

// The daemon's stop keeps what is safe: a cell sent to a paused session while it
// stops is refused (503) or runs, and either way the session comes back with its
// state; pauses at once stay within the caller's disk bound (the others are lost,
// and say why).
func TestSessionStopKeepsPaused(t *testing.T) {
	dir := t.TempDir()
	sessions := func(c *config.Sessions) { c.MemoryBudget = 1; c.MaxPerCaller = 4; c.MaxPausedBytesPerCaller = 30 << 20 }
	d := start(t, setup{dir: dir, sessions: sessions})
	small := d.openSession(t, `{}`)
	if status, _, b := d.cell(t, small, `{"code": "x = 41"}`); status != 200 {
		t.Fatalf("small: %d %s", status, b)
	}
	big := d.openSession(t, `{"limits": {"memory_mib": 512}}`)
	if status, a, b := d.cell(t, big, `{"code": "b = bytearray(b'\\x01') * (200 << 20)", "limits": {"timeout_ms": 60000}}`); status != 200 || a.Result.Reason != protocol.Exited {
		t.Fatalf("big: %d %s", status, b)
	}
	if v := d.sessionView(t, small); v.State != "paused" {
		t.Fatalf("small past the budget: %+v", v)
	}
	d.stop() // big's pause (200 MB) takes a while: small's cells come meanwhile
	for i := 0; i < 100; i++ {
		req, _ := http.NewRequest("POST", "http://sandcell/v1/sessions/"+small+"/cells", strings.NewReader(`{"code": "x + 1"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := d.client.Do(req)
		if err != nil {
			break // the daemon has stopped listening
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 && resp.StatusCode != 200 {
			t.Fatalf("a cell while the daemon stops: %d %s", resp.StatusCode, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	err := <-d.ran
	d.ran <- err
	d = start(t, setup{dir: dir})
	if v := d.sessionView(t, small); v.State != "paused" {
		t.Fatalf("small after the stop: %+v", v)
	}
	if status, a, b := d.cell(t, small, `{"code": "x + 1"}`); status != 200 || a.Value != "42" || a.State != wire.SessionRestored {
		t.Fatalf("small after the restart: %d %s", status, b)
	}
	// big was past the caller's 30 MiB: lost at the stop, and it says why.
	if v := d.sessionView(t, big); v.State != "lost" || !strings.Contains(v.Lost, "could not pause") {
		t.Fatalf("big after the stop: %+v", v)
	}
}

// sessionView is GET /v1/sessions/{id}.
func (d *daemon) sessionView(t *testing.T, id string) wire.SessionView {
	t.Helper()
	resp, b := d.do(t, "GET", "/v1/sessions/"+id, "")
	var v wire.SessionView
	if resp.StatusCode != 200 || json.Unmarshal(b, &v) != nil {
		t.Fatalf("session %s: %d %s", id, resp.StatusCode, b)
	}
	return v
}

// Pauses at once (the daemon's stop pauses every session) stay within the caller's
// disk bound; the sessions past it are lost at the stop, and say so.
func TestSessionPausesWithinTheBound(t *testing.T) {
	dir := t.TempDir()
	d := start(t, setup{dir: dir, sessions: func(c *config.Sessions) { c.MaxPerCaller = 3; c.MaxPausedBytesPerCaller = 50 << 20 }})
	var ids []string
	for i := 0; i < 3; i++ {
		id := d.openSession(t, `{}`)
		if status, _, b := d.cell(t, id, `{"code": "import os\nb = os.urandom(10 << 20)"}`); status != 200 {
			t.Fatalf("cell: %d %s", status, b)
		}
		ids = append(ids, id)
	}
	d.stop()
	err := <-d.ran
	d.ran <- err
	d = start(t, setup{dir: dir})
	var paused int64
	n := 0
	for _, id := range ids {
		switch v := d.sessionView(t, id); v.State {
		case "paused":
			paused += v.CheckpointBytes
			n++
		case "lost":
			if !strings.Contains(v.Lost, "could not pause") {
				t.Errorf("%s: %s", id, v.Lost)
			}
		default:
			t.Errorf("%s after the stop: %+v", id, v)
		}
	}
	// Each checkpoint is about 22 MB: two fit within 50 MiB, the third does not.
	if n != 2 || paused > 50<<20 {
		t.Fatalf("%d sessions, %d bytes, paused against a bound of %d", n, paused, 50<<20)
	}
}

// At the stop, cells waiting for a place hear it (503), the running cell ends with
// its worker (lost, said), and the sessions behind it are paused with their state,
// soon.
func TestSessionStopWithCellsQueued(t *testing.T) {
	dir := t.TempDir()
	d := start(t, setup{dir: dir, concurrency: 1, sessions: func(c *config.Sessions) { c.MaxPerCaller = 8 }})
	long := d.openSession(t, `{}`)
	var queued []string
	for i := 0; i < 4; i++ {
		id := d.openSession(t, `{}`)
		if status, _, b := d.cell(t, id, `{"code": "x = 41"}`); status != 200 {
			t.Fatalf("cell: %d %s", status, b)
		}
		queued = append(queued, id)
	}
	go func() {
		req, _ := http.NewRequest("POST", "http://sandcell/v1/sessions/"+long+"/cells",
			strings.NewReader(`{"code": "import time\ntime.sleep(15)", "limits": {"timeout_ms": 20000}}`))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := d.client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	time.Sleep(500 * time.Millisecond)
	for _, id := range queued {
		go func() {
			req, _ := http.NewRequest("POST", "http://sandcell/v1/sessions/"+id+"/cells", strings.NewReader(`{"code": "x + 1"}`))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := d.client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	began := time.Now()
	d.stop()
	err := <-d.ran
	d.ran <- err
	if took := time.Since(began); took > 8*time.Second {
		t.Errorf("the stop took %s", took)
	}
	d = start(t, setup{dir: dir})
	for _, id := range queued {
		if status, a, b := d.cell(t, id, `{"code": "x + 1"}`); status != 200 || a.Value != "42" {
			t.Fatalf("a session whose cell waited at the stop: %d %s", status, b)
		}
	}
	if v := d.sessionView(t, long); v.State != "lost" || !strings.Contains(v.Lost, "stopped while a cell ran") {
		t.Fatalf("the session whose cell ran at the stop: %+v", v)
	}
}

// A client that stops reading its cell's event stream loses the stream, not the
// session: the cell ends within its limit and the session takes the next cell.
func TestSessionCellEventsUnread(t *testing.T) {
	d := start(t, setup{})
	id := d.openSession(t, `{}`)
	conn, err := net.Dial("unix", d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"code": "import sys\nfor i in range(200000):\n    sys.stdout.write('x' * 99 + '\\n')\n", "limits": {"timeout_ms": 2000}}`
	fmt.Fprintf(conn, "POST /v1/sessions/%s/cells HTTP/1.1\r\nHost: sandcell\r\nAccept: text/event-stream\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", id, len(body), body)
	deadline := time.Now().Add(15 * time.Second)
	for d.sessionView(t, id).State == "busy" || d.sessionView(t, id).Cells == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the session of an unread stream: %+v", d.sessionView(t, id))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if status, a, b := d.cell(t, id, `{"code": "6 * 7"}`); status != 200 || a.Value != "42" {
		t.Fatalf("the next cell: %d %s", status, b)
	}
}

// A fork copies regular files and directories only: a symbolic link the guest made
// (wherever it leads) refuses the fork, 409, and nothing of it is made; a workspace
// past its quota is 507.
func TestSessionForkRefuses(t *testing.T) {
	d := start(t, setup{})
	id := d.openSession(t, `{}`)
	if status, a, b := d.cell(t, id, `{"code": "import os\nos.mkdir('/ws/d')\nopen('/ws/d/f', 'w').write('x')\nos.symlink('../' * 20 + 'etc/passwd', '/ws/d/l')"}`); status != 200 || a.Result.ExitCode != 0 {
		t.Fatalf("the guest's link: %d %s", status, b)
	}
	resp, b := d.do(t, "POST", "/v1/sessions/"+id+"/fork", "")
	wantProblem(t, resp, b, 409, wire.CodeUnsafeFile)
	if status, _, b := d.cell(t, id, `{"code": "import os\nos.remove('/ws/d/l')\nopen('/ws/big', 'wb').write(b'x' * (3 << 20))"}`); status != 200 {
		t.Fatalf("past the quota: %d %s", status, b)
	}
	resp, b = d.do(t, "POST", "/v1/sessions/"+id+"/fork", "")
	wantProblem(t, resp, b, 507, wire.CodeQuota)
	if status, _, b := d.cell(t, id, `{"code": "import os\nos.remove('/ws/big')"}`); status != 507 {
		t.Fatalf("a cell past the quota: %d %s", status, b)
	}
}
