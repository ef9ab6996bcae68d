package api_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// pauseView is the part of a session's view that says why it is not paused,
// decoded apart from wire.SessionView so that this file builds against a daemon
// without it (and fails there by its figures).
type pauseView struct {
	State           string `json:"state"`
	CheckpointBytes int64  `json:"checkpoint_bytes"`
	PauseFailed     *struct {
		Reason    string     `json:"reason"`
		Error     string     `json:"error"`
		At        time.Time  `json:"at"`
		Failures  int        `json:"failures"`
		NeedBytes int64      `json:"need_bytes"`
		NextTryAt *time.Time `json:"next_try_at"`
	} `json:"pause_failed"`
}

func (d *daemon) pauseView(t *testing.T, id string) pauseView {
	t.Helper()
	resp, b := d.do(t, "GET", "/v1/sessions/"+id, "")
	var v pauseView
	if resp.StatusCode != 200 || json.Unmarshal(b, &v) != nil {
		t.Fatalf("session %s: %d %s", id, resp.StatusCode, b)
	}
	return v
}

// writtenBytes is what this process (the daemon) has caused to be written to
// storage so far (/proc/self/io write_bytes: files removed before their writeback
// included).
func writtenBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no /proc/self/io: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Skip("no write_bytes in /proc/self/io")
	return 0
}

// waitFor polls cond every 100 ms until it holds or within passes; it says whether
// it held.
func waitFor(within time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// cellWhenFree runs body as a cell of session id, again while the session is busy
// (pause_after is short here: a pause may be under way), and returns the answer.
func (d *daemon) cellWhenFree(t *testing.T, id, body string) wire.CellAnswer {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		status, a, b := d.cell(t, id, body)
		if status == 200 {
			return a
		}
		if status != 409 || time.Now().After(deadline) {
			t.Fatalf("cell %s: %d %s", body, status, b)
		}
	}
}

// A session whose checkpoint is past its caller's sessions.max_paused_bytes_per_caller
// is tried once, not at every tick of the reaper (each try wrote a checkpoint up to
// the bound and threw it away: hundreds of MiB a minute, silently): idle, it
// writes nothing more; its view says why it stays live and /metrics counts the
// failure. It is tried again once it has run another cell (its state changed), or
// when its caller's paused sessions leave it the room it needed.
func TestSessionPauseOverTheBoundIsNotRetried(t *testing.T) {
	const bound = 16 << 20
	d := start(t, setup{sessions: func(c *config.Sessions) {
		c.PauseAfter.Duration = 300 * time.Millisecond // the reaper ticks every 30 ms
		c.MaxPausedBytesPerCaller = bound
	}})
	big := d.openSession(t, `{}`)
	d.cellWhenFree(t, big, `{"code": "import os\nb = os.urandom(24 << 20)"}`)
	// Its first pause, which fails: done when the view says so (a daemon that does
	// not say so has tried, and tries on, meanwhile).
	waitFor(15*time.Second, func() bool { return d.pauseView(t, big).PauseFailed != nil })
	const idle = 5 * time.Second
	before := writtenBytes(t)
	time.Sleep(idle)
	written := writtenBytes(t) - before
	t.Logf("written while idle for %s past a failed pause: %d bytes", idle, written)
	if written >= bound {
		t.Errorf("%d bytes written in %s while the session was idle: its pause was tried again, with nothing changed", written, idle)
	}
	v := d.pauseView(t, big)
	if f := v.PauseFailed; v.State != "ready" || f == nil || f.Reason != "bound" || f.Failures != 1 || f.NeedBytes <= bound ||
		f.NextTryAt != nil || !strings.Contains(f.Error, "max_paused_bytes_per_caller") {
		t.Fatalf("the view of a session over its caller's bound: %+v %+v", v, f)
	}
	if n := d.metric(t, `sandcell_session_pause_failures_total{reason="bound"}`); n != 1 {
		t.Fatalf("failed pauses counted: %g, want 1", n)
	}

	// Another cell: its state changed, it is tried once more when idle again.
	if a := d.cellWhenFree(t, big, `{"code": "len(b)"}`); a.Value != strconv.Itoa(24<<20) {
		t.Fatalf("cell: %+v", a)
	}
	if !waitFor(15*time.Second, func() bool {
		return d.metric(t, `sandcell_session_pause_failures_total{reason="bound"}`) == 2
	}) {
		t.Fatalf("not tried again after a cell: %+v", d.pauseView(t, big))
	}
	time.Sleep(time.Second)
	if n := d.metric(t, `sandcell_session_pause_failures_total{reason="bound"}`); n != 2 {
		t.Fatalf("failed pauses counted after a cell: %g, want 2", n)
	}
	if resp, _ := d.do(t, "DELETE", "/v1/sessions/"+big, ""); resp.StatusCode != 204 {
		t.Fatalf("close: %d", resp.StatusCode)
	}

	// Room made by the caller's other paused session: tried again, and paused.
	first := d.openSession(t, `{}`)
	d.cellWhenFree(t, first, `{"code": "x = 1"}`)
	var size int64
	if !waitFor(15*time.Second, func() bool { v := d.pauseView(t, first); size = v.CheckpointBytes; return v.State == "paused" }) {
		t.Fatalf("a session within the bound is not paused: %+v", d.pauseView(t, first))
	}
	t.Logf("a bare session's checkpoint: %d bytes", size)
	if size > bound || 2*size <= bound {
		t.Fatalf("a checkpoint of %d bytes: two must not fit within %d, one must", size, bound)
	}
	second := d.openSession(t, `{}`)
	d.cellWhenFree(t, second, `{"code": "y = 2"}`)
	if !waitFor(15*time.Second, func() bool { f := d.pauseView(t, second).PauseFailed; return f != nil && f.Reason == "bound" }) {
		t.Fatalf("a second session past the bound beside the first: %+v", d.pauseView(t, second))
	}
	n := d.metric(t, `sandcell_session_pause_failures_total{reason="bound"}`)
	time.Sleep(time.Second)
	if m := d.metric(t, `sandcell_session_pause_failures_total{reason="bound"}`); m != n {
		t.Fatalf("failed pauses counted: %g, then %g a second later, nothing changed", n, m)
	}
	if resp, _ := d.do(t, "DELETE", "/v1/sessions/"+first, ""); resp.StatusCode != 204 {
		t.Fatalf("close: %d", resp.StatusCode)
	}
	if !waitFor(15*time.Second, func() bool { return d.pauseView(t, second).State == "paused" }) {
		t.Fatalf("room was made, the session is not paused: %+v", d.pauseView(t, second))
	}
	if v := d.pauseView(t, second); v.PauseFailed != nil {
		t.Fatalf("a paused session still says its pause failed: %+v", v.PauseFailed)
	}
	if a := d.cellWhenFree(t, second, `{"code": "y"}`); a.Value != "2" || a.State != wire.SessionRestored {
		t.Fatalf("cell after the pause: %+v", a)
	}
}

// A checkpoint that cannot be written (the state file system full or failing; here
// its temporary file's name is taken by a directory) is tried again after a
// minute, then two, doubling up to an hour, not at every tick: the view says when.
func TestSessionPauseWriteFailureBacksOff(t *testing.T) {
	d := start(t, setup{sessions: func(c *config.Sessions) { c.PauseAfter.Duration = 300 * time.Millisecond }})
	id := d.openSession(t, `{}`)
	// Its temporary file is there while a pause is under way: wait for its end.
	tmp := filepath.Join(d.cfg.State.Dir, "sessions", id, "checkpoint.tmp")
	if !waitFor(15*time.Second, func() bool { return os.Mkdir(tmp, 0o700) == nil }) {
		t.Fatalf("cannot make %s", tmp)
	}
	var state string
	waitFor(15*time.Second, func() bool { state = d.pauseView(t, id).State; return state != "busy" })
	if state == "paused" {
		d.cellWhenFree(t, id, `{"code": "1"}`) // live again
	}
	if !waitFor(15*time.Second, func() bool { return d.pauseView(t, id).PauseFailed != nil }) {
		t.Fatalf("no failed pause: %+v", d.pauseView(t, id))
	}
	time.Sleep(3 * time.Second)
	v := d.pauseView(t, id)
	if f := v.PauseFailed; v.State != "ready" || f == nil || f.Reason != "write" || f.Failures != 1 || f.NextTryAt == nil ||
		f.NextTryAt.Sub(f.At) != time.Minute {
		t.Fatalf("the view of a session whose checkpoint cannot be written: %+v %+v", v, f)
	}
	if n := d.metric(t, `sandcell_session_pause_failures_total{reason="write"}`); n != 1 {
		t.Fatalf("failed pauses counted: %g, want 1", n)
	}
	// It still runs cells, and its state is whole.
	if a := d.cellWhenFree(t, id, `{"code": "z = 3\nz"}`); a.Value != "3" || a.State != wire.SessionPreserved {
		t.Fatalf("cell: %+v", a)
	}
}
