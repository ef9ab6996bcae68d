package api_test

import (
	"encoding/json"
	"testing"

	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// fork forks session id and returns the new session's id.
func (d *daemon) fork(t *testing.T, id string) string {
	t.Helper()
	resp, b := d.do(t, "POST", "/v1/sessions/"+id+"/fork", "")
	var v wire.SessionView
	if resp.StatusCode != 201 || json.Unmarshal(b, &v) != nil || v.ID == "" {
		t.Fatalf("fork %s: %d %s", id, resp.StatusCode, b)
	}
	return v.ID
}

// value runs code as a cell of session id and returns its value.
func (d *daemon) value(t *testing.T, id, code string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"code": code})
	status, a, b := d.cell(t, id, string(body))
	if status != 200 || a.Result.ExitCode != 0 {
		t.Fatalf("cell %q in %s: %d %s", code, id, status, b)
	}
	return a.Value
}

// A fork shares no randomness with its source: random's generator (and with it
// uuid1's clock sequence), tempfile's names and SQLite's generator (random(),
// randomblob(), seeded from WASI's random source as every run's) are seeded afresh
// in the fork, at
// its first cell, even when that cell comes after a restart or after a first cell
// that was rolled back; the source, paused and resumed, goes on with its own
// sequence.
func TestForkDrawsItsOwnRandomness(t *testing.T) {
	dir := t.TempDir()
	more := func(c *config.Sessions) { c.MaxPerCaller = 4 }
	d := start(t, setup{dir: dir, sessions: more})
	src := d.openSession(t, `{}`)
	d.value(t, src, "import random, sqlite3, tempfile\nstate = random.getstate()\nnames = tempfile._get_candidate_names()\n"+
		"db = sqlite3.connect(':memory:')\nnext(names), db.execute('select random()').fetchone()")
	f1, f2 := d.fork(t, src), d.fork(t, src)
	// Each in turn, in the same order in both: one not reseeded draws alike. (A fork
	// holds no open file of its source's, a database among them: a connection of
	// its own draws from SQLite's one generator.)
	for _, draw := range []string{"random.getrandbits(64)", "next(tempfile._get_candidate_names())",
		"sqlite3.connect(':memory:').execute('select random()').fetchone()[0]",
		"sqlite3.connect(':memory:').execute('select hex(randomblob(8))').fetchone()[0]"} {
		if a, b := d.value(t, src, draw), d.value(t, f1, draw); a == b {
			t.Fatalf("the fork drew what its source drew: %s gave %s in both", draw, a)
		}
	}
	if v := d.value(t, f1, "random.getstate() == state"); v != "False" {
		t.Fatalf("the fork's generator is its source's: %s", v)
	}
	d.value(t, src, "state = random.getstate()")
	// Two forks, and two runs, drawing within a second draw apart: SQLite had seeded
	// itself from the time and the pid, the same in every guest (no /dev/urandom).
	sql := "sqlite3.connect(':memory:').execute('select random(), hex(randomblob(8))').fetchone()"
	f4 := d.fork(t, src)
	if a, b := d.value(t, f1, sql), d.value(t, f4, sql); a == b {
		t.Fatalf("two forks drew the same from SQLite: %s", a)
	}
	if resp, b := d.do(t, "DELETE", "/v1/sessions/"+f4, ""); resp.StatusCode != 204 {
		t.Fatalf("close: %d %s", resp.StatusCode, b)
	}
	body, _ := json.Marshal(map[string]string{"code": "import sqlite3\nprint(" + sql + ")"})
	if a, b := d.run(t, string(body)).Result.Stdout, d.run(t, string(body)).Result.Stdout; string(a) == string(b) {
		t.Fatalf("two runs drew the same from SQLite: %s", a)
	}

	// f2 has run no cell: paused with the source's state at the stop, it still
	// reseeds after the restart; the source, resumed, does not.
	d.stop()
	err := <-d.ran
	d.ran <- err
	d = start(t, setup{dir: dir, sessions: more})
	if v := d.value(t, f2, "random.getstate() == state"); v != "False" {
		t.Fatalf("a fork resumed before its first cell drew its source's numbers: %s", v)
	}
	if v := d.value(t, src, "random.getstate() == state"); v != "True" {
		t.Fatalf("the resumed source did not go on with its own sequence: %s", v)
	}

	// A fork's first cell rolled back: the next still reseeds.
	f3 := d.fork(t, src)
	status, a, b := d.cell(t, f3, `{"code": "while True: pass", "limits": {"timeout_ms": 300}}`)
	if status != 200 || a.State != wire.SessionRolledBack {
		t.Fatalf("the rolled back cell: %d %s", status, b)
	}
	if v := d.value(t, f3, "random.getstate() == state"); v != "False" {
		t.Fatalf("a fork whose first cell was rolled back drew its source's numbers: %s", v)
	}
}
