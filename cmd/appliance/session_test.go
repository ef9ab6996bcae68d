package main

import (
	"strings"
	"testing"
)

// `sandcell session`: open, cells that keep their state, list, a cell past its time
// rolled back, one that cannot be interrupted that says the state is lost (and every
// cell after it refused), close.
func TestCLISession(t *testing.T) {
	d := startMCPDaemon(t)
	r := cli(t, "", "session", "--socket", d.sock, "open")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || len(id) != 26 {
		t.Fatalf("open: %+v", r)
	}
	if r = cli(t, "", "session", "--socket", d.sock, "run", id, "-c", "x = 6"); r.code != 0 || r.stdout != "" {
		t.Fatalf("first cell: %+v", r)
	}
	if r = cli(t, "", "session", "--socket", d.sock, "run", id, "-c", "x * 7"); r.code != 0 || r.stdout != "42\n" {
		t.Fatalf("second cell: %+v", r)
	}
	if r = cli(t, "in", "session", "--socket", d.sock, "run", id, "--stdin", "-", "-c", "import sys; sys.exit(len(sys.stdin.read()))"); r.code != 2 {
		t.Fatalf("a cell's exit status and stdin: %+v", r)
	}
	if r = cli(t, "", "session", "--socket", d.sock, "list"); r.code != 0 || !strings.Contains(r.stdout, id+"  ready  3") {
		t.Fatalf("list: %+v", r)
	}
	r = cli(t, "", "session", "--socket", d.sock, "run", id, "--timeout", "300ms", "-c", "x = 0\nwhile True: pass")
	if r.code != exitTimeout || !strings.Contains(r.stderr, "rolled back") {
		t.Fatalf("a cell past its time: %+v", r)
	}
	if r = cli(t, "", "session", "--socket", d.sock, "run", id, "-c", "x"); r.code != 0 || r.stdout != "6\n" {
		t.Fatalf("after the rolled-back cell: %+v", r)
	}
	// A fork: the same state, diverging.
	r = cli(t, "", "session", "--socket", d.sock, "fork", id)
	fork := strings.TrimSpace(r.stdout)
	if r.code != 0 || len(fork) != 26 || fork == id {
		t.Fatalf("fork: %+v", r)
	}
	if r = cli(t, "", "session", "--socket", d.sock, "run", fork, "-c", "x = 9\nx"); r.code != 0 || r.stdout != "9\n" || !strings.Contains(r.stderr, "restored") {
		t.Fatalf("the fork's first cell: %+v", r)
	}
	if r = cli(t, "", "session", "--socket", d.sock, "run", id, "-c", "x"); r.code != 0 || r.stdout != "6\n" {
		t.Fatalf("the session after its fork: %+v", r)
	}
	if r = cli(t, "", "session", "--socket", d.sock, "close", fork); r.code != 0 {
		t.Fatalf("close the fork: %+v", r)
	}
	r = cli(t, "", "session", "--socket", d.sock, "run", id, "--timeout", "300ms", "-c", "import time\ntime.sleep(30)")
	if r.code != exitTimeout || !strings.Contains(r.stderr, "the session's state is lost") {
		t.Fatalf("a cell asleep past its time: %+v", r)
	}
	if r = cli(t, "", "session", "--socket", d.sock, "run", id, "-c", "x"); r.code != exitRejected || !strings.Contains(r.stderr, "session_lost") && !strings.Contains(r.stderr, "lost") {
		t.Fatalf("a cell after the state was lost: %+v", r)
	}
	if r = cli(t, "", "session", "--socket", d.sock, "close", id); r.code != 0 {
		t.Fatalf("close: %+v", r)
	}
	if r = cli(t, "", "session", "--socket", d.sock, "close", id); r.code != exitRejected {
		t.Fatalf("close again: %+v", r)
	}
}
