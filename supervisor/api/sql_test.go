package api_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// sqlDaemon is a daemon whose Unix caller is a runner, an approver (and admin), with
// one workspace holding t.db; approverSecret is the bearer token of another
// approver, who may decide the Unix caller's requests over TCP at tcpURL.
func sqlDaemon(t *testing.T, s setup) (*daemon, string, string) {
	if s.access == nil {
		uid := os.Getuid()
		a := api.Access{Admins: api.Principals{UIDs: map[int]bool{uid: true}},
			Approvers: api.Principals{UIDs: map[int]bool{uid: true}}, Tokens: api.Tokens{approverToken}}
		s.access = &a
	}
	d := start(t, s)
	id := d.newWorkspace(t)
	dbPath := filepath.Join(d.workspaces, id, "files", "t.db")
	os.WriteFile(dbPath, nil, 0o644)
	return d, id, dbPath
}

func (d *daemon) sql(t *testing.T, body map[string]any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, raw := d.do(t, "POST", "/v1/sql", string(b))
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	return resp.StatusCode, m
}

func fileSum(t *testing.T, p string) [32]byte {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// A read runs; a write waits for approval, runs once when approved, and its
// approval cannot be replayed; a denied or expired one never runs.
func TestSQLApprovals(t *testing.T) {
	d, ws, dbPath := sqlDaemon(t, setup{})
	write := func(sql string) map[string]any {
		code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": sql})
		if code != 403 || m["code"] != wire.CodeApprovalRequired || m["approval_id"] == "" {
			t.Fatalf("%s: %d %v", sql, code, m)
		}
		return m
	}
	// Nobody decides their own request.
	self := write("CREATE TABLE selfie (x)")
	if resp, body := d.do(t, "POST", "/v1/approvals/"+self["approval_id"].(string), `{"decision":"approve"}`); resp.StatusCode != 403 {
		t.Fatalf("self-approval: %d %s", resp.StatusCode, body)
	}
	tcp := d.listenTCP(t)
	approve := func(id, decision string) (int, map[string]any) {
		req, _ := http.NewRequest("POST", tcp+"/v1/approvals/"+id, strings.NewReader(`{"decision":"`+decision+`"}`))
		req.Header.Set("Authorization", "Bearer "+approverSecret)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	// Create the table: held, approved, redeemed.
	m := write("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
	id := m["approval_id"].(string)
	before := fileSum(t, dbPath)
	resp, raw := d.do(t, "GET", "/v1/approvals?state=pending", "")
	if resp.StatusCode != 200 || !bytes.Contains(raw, []byte(id)) || !bytes.Contains(raw, []byte("CREATE TABLE t")) {
		t.Fatalf("pending: %d %s", resp.StatusCode, raw)
	}
	if code, m := approve(id, "approve"); code != 200 || m["state"] != "approved" {
		t.Fatalf("approve: %d %v", code, m)
	}
	if fileSum(t, dbPath) != before {
		t.Fatal("approving ran the statement")
	}
	req := map[string]any{"workspace": ws, "db": "t.db", "sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)", "approval": id}
	if code, m := d.sql(t, req); code != 200 || m["status"] != "ok" {
		t.Fatalf("redeem: %d %v", code, m)
	}
	if code, m := d.sql(t, req); code != 409 || m["code"] != wire.CodeApprovalInvalid {
		t.Fatalf("replay: %d %v", code, m)
	}
	// Another statement cannot use an approval given for a different one.
	m = write("INSERT INTO t (name) VALUES ('a'), ('b')")
	id = m["approval_id"].(string)
	approve(id, "approve")
	if code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "DELETE FROM t", "approval": id}); code != 409 {
		t.Fatalf("mismatch: %d %v", code, m)
	}
	if code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "INSERT INTO t (name) VALUES ('a'), ('b')", "approval": id}); code != 200 || m["changes"] != float64(2) {
		t.Fatalf("insert: %d %v", code, m)
	}
	// Reads run at once.
	code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "SELECT id, name FROM t ORDER BY id"})
	if code != 200 || m["classification"].(map[string]any)["kind"] != "read" || len(m["rows"].([]any)) != 2 {
		t.Fatalf("read: %d %v", code, m)
	}
	// Denied: never runs.
	before = fileSum(t, dbPath)
	m = write("DELETE FROM t")
	id = m["approval_id"].(string)
	if code, m := approve(id, "deny"); code != 200 || m["state"] != "denied" {
		t.Fatalf("deny: %d %v", code, m)
	}
	if code, _ := approve(id, "approve"); code != 409 {
		t.Fatalf("approve after deny: %d", code)
	}
	if code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "DELETE FROM t", "approval": id}); code != 409 {
		t.Fatalf("redeem denied: %d %v", code, m)
	}
	// Refused outright, whatever approval.
	code, m = d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "ATTACH 'x.db' AS x"})
	if code != 403 || m["code"] != wire.CodeStatementRefused {
		t.Fatalf("attach: %d %v", code, m)
	}
	if fileSum(t, dbPath) != before {
		t.Fatal("a refused or denied statement changed the file")
	}
	// Errors.
	code, m = d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "SELEC 1"})
	if code != 400 || m["code"] != wire.CodeSQLError || m["sql_code"] != "sql_syntax_error" {
		t.Fatalf("syntax: %d %v", code, m)
	}
	code, m = d.sql(t, map[string]any{"workspace": ws, "db": "missing.db", "sql": "SELECT 1"})
	if code != 404 {
		t.Fatalf("missing db: %d %v", code, m)
	}
	code, m = d.sql(t, map[string]any{"workspace": ws, "db": "file:t.db?mode=rwc", "sql": "SELECT 1"})
	if code != 400 {
		t.Fatalf("uri: %d %v", code, m)
	}
	// Every step is audited.
	evs, _ := d.store.Events(t.Context(), d.since, "", 1000)
	kinds := map[string]int{}
	for _, e := range evs {
		kinds[string(e.Kind)]++
	}
	// Each accepted statement has one final record: finished, failed, refused (the
	// statement refused outright, and three approvals that did not hold) or held
	// for approval.
	if kinds["approval.requested"] != 4 || kinds["approval.decided"] != 5 || kinds["approval.redeemed"] != 5 ||
		kinds["sql.finished"] != 3 || kinds["sql.refused"] != 4 ||
		kinds["sql.requested"] != kinds["sql.finished"]+kinds["sql.failed"]+kinds["sql.refused"]+kinds["approval.requested"] {
		t.Fatalf("audit: %v", kinds)
	}
}

func TestSQLApprovalExpires(t *testing.T) {
	d, ws, _ := sqlDaemon(t, setup{approvalTTL: 300 * time.Millisecond})
	code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "CREATE TABLE t (x)"})
	if code != 403 {
		t.Fatalf("%d %v", code, m)
	}
	time.Sleep(400 * time.Millisecond)
	req, _ := http.NewRequest("POST", d.listenTCP(t)+"/v1/approvals/"+m["approval_id"].(string), strings.NewReader(`{"decision":"approve"}`))
	req.Header.Set("Authorization", "Bearer "+approverSecret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 409 || !strings.Contains(string(raw), "expired") {
		t.Fatalf("approve expired: %d %s", resp.StatusCode, raw)
	}
}

// With no approver configured, and no caller's own confirmation counted
// (approvals.elicitation empty, the default), writes are refused outright.
func TestSQLNoApprover(t *testing.T) {
	uid := os.Getuid()
	runnerOnly := api.Access{Runners: api.Principals{UIDs: map[int]bool{uid: true}}}
	d, ws, dbPath := sqlDaemon(t, setup{access: &runnerOnly})
	before := fileSum(t, dbPath)
	code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "CREATE TABLE t (x)"})
	if code != 403 || m["code"] != wire.CodeApprovalUnavailable {
		t.Fatalf("%d %v", code, m)
	}
	if code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "SELECT 1 + 1"}); code != 200 {
		t.Fatalf("read: %d %v", code, m)
	}
	resp, body := d.do(t, "GET", "/v1/approvals", "")
	wantProblem(t, resp, body, 403, wire.CodeForbidden)
	if fileSum(t, dbPath) != before {
		t.Fatal("the file changed")
	}
}

// The second approver: a bearer token over TCP (another caller than the Unix one).
var approverSecret, approverToken = api.NewToken("reviewer", []api.Role{api.RoleApprover})

// listenTCP serves the daemon on a loopback TCP port as well and returns its URL.
func (d *daemon) listenTCP(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go d.server.Serve(l)
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	return "http://" + l.Addr().String()
}

// An approval is void once the database file changes: the approver approved the
// statement on the bytes the requester's request named.
func TestSQLApprovalVoidWhenFileChanges(t *testing.T) {
	d, ws, dbPath := sqlDaemon(t, setup{})
	code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "CREATE TABLE t (x)"})
	if code != 403 {
		t.Fatalf("%d %v", code, m)
	}
	id := m["approval_id"].(string)
	if status := approveOverTCP(t, d.listenTCP(t), id); status != 200 {
		t.Fatalf("approve: %d", status)
	}
	os.WriteFile(dbPath, []byte("SQLite format 3\x00 but changed"), 0o644)
	code, m = d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "CREATE TABLE t (x)", "approval": id})
	if code != 409 || m["code"] != wire.CodeApprovalInvalid {
		t.Fatalf("redeem after the file changed: %d %v", code, m)
	}
}

// The approved write runs on the bytes the approver saw: a guest run that changes the
// database (as a valid database) between approval and redemption voids it, and
// nothing of the write runs; the approval request named the file's SHA-256, hashed in
// the worker.
func TestSQLApprovalBindsTheBytes(t *testing.T) {
	d, ws, dbPath := sqlDaemon(t, setup{})
	tcp := d.listenTCP(t)
	approve := func(id string) {
		t.Helper()
		if status := approveOverTCP(t, tcp, id); status != 200 {
			t.Fatalf("approve: %d", status)
		}
	}
	guest := func(code string) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"workspace": ws, "code": code})
		if v := d.run(t, string(b)); v.Result.ExitCode != 0 {
			t.Fatalf("guest: %s", v.Result.Stderr)
		}
	}
	guest("import sqlite3\nc = sqlite3.connect('t.db')\nc.execute('CREATE TABLE t (x)')\nc.execute('INSERT INTO t VALUES (1)')\nc.commit()")
	stmt := map[string]any{"workspace": ws, "db": "t.db", "sql": "DELETE FROM t"}
	code, m := d.sql(t, stmt)
	if code != 403 || m["code"] != wire.CodeApprovalRequired {
		t.Fatalf("delete: %d %v", code, m)
	}
	id := m["approval_id"].(string)
	_, raw := d.do(t, "GET", "/v1/approvals/"+id, "")
	sum := fileSum(t, dbPath)
	if !bytes.Contains(raw, []byte(fmt.Sprintf(`"db_sha256":"%x"`, sum))) {
		t.Fatalf("the approval does not name the file's SHA-256 %x: %s", sum, raw)
	}
	approve(id)
	guest("import sqlite3\nc = sqlite3.connect('t.db')\nc.execute('INSERT INTO t VALUES (2)')\nc.commit()")
	stmt["approval"] = id
	if code, m := d.sql(t, stmt); code != 409 || m["code"] != wire.CodeApprovalInvalid || !strings.Contains(fmt.Sprint(m["detail"]), "changed") {
		t.Fatalf("redeem after a guest changed the file: %d %v", code, m)
	}
	delete(stmt, "approval")
	if code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "SELECT count(*) FROM t"}); code != 200 || fmt.Sprint(m["rows"]) != "[[2]]" {
		t.Fatalf("the write ran: %d %v", code, m)
	}
}

// An approved write holds its workspace alone: it waits for no run (it is refused,
// and the approval stays usable, while one is in the workspace), and while it runs,
// no run or upload can swap the file it checked.
func TestSQLApprovedWriteHoldsTheWorkspaceAlone(t *testing.T) {
	// The write makes a database of about 4 MB: the quota must hold it.
	d, ws, _ := sqlDaemon(t, setup{quota: workspace.Quota{Bytes: 64 << 20, Files: 100}})
	tcp := d.listenTCP(t)
	approve := func(id string) { approveOverTCP(t, tcp, id) }
	if v := d.run(t, `{"workspace":"`+ws+`","code":"import sqlite3\nc = sqlite3.connect('t.db')\nc.execute('CREATE TABLE t (x)')\nc.commit()"}`); v.Result.ExitCode != 0 {
		t.Fatalf("guest: %s", v.Result.Stderr)
	}
	stmt := map[string]any{"workspace": ws, "db": "t.db",
		"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 400000) INSERT INTO t SELECT x FROM c"}
	_, m := d.sql(t, stmt)
	id, _ := m["approval_id"].(string)
	if id == "" {
		t.Fatalf("no approval: %v", m)
	}
	approve(id)
	stmt["approval"] = id
	resp, body := d.do(t, "POST", "/v1/runs", `{"workspace":"`+ws+`","code":"import time; time.sleep(2)","wait":false}`)
	if resp.StatusCode != 202 {
		t.Fatalf("run: %d %s", resp.StatusCode, body)
	}
	if code, m := d.sql(t, stmt); code != 409 || m["code"] != wire.CodeWorkspaceBusy {
		t.Fatalf("redeem during a run: %d %v", code, m)
	}
	done := make(chan map[string]any, 1)
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, m := d.sql(t, stmt)
		if code == 200 {
			t.Fatalf("the write ran at once: %v", m)
		}
		if code != 409 || m["code"] != wire.CodeWorkspaceBusy {
			t.Fatalf("redeem: %d %v", code, m)
		}
		// Redeem once the run has ended, and meanwhile try to upload.
		_, raw := d.do(t, "GET", "/v1/workspaces/"+ws, "")
		if !strings.Contains(string(raw), `"over_quota"`) || time.Now().After(deadline) {
			t.Fatalf("workspace: %s", raw)
		}
		time.Sleep(100 * time.Millisecond)
		if resp, _ := d.do(t, "POST", "/v1/runs", `{"workspace":"`+ws+`","code":"pass"}`); resp.StatusCode == 200 {
			break // the sleeping run has ended: the workspace is free
		}
	}
	go func() {
		for {
			code, m := d.sql(t, stmt)
			if code != 409 || m["code"] != wire.CodeWorkspaceBusy {
				done <- m
				return
			}
			time.Sleep(5 * time.Millisecond) // an upload held it for a moment
		}
	}()
	sawBusy := false
	for len(done) == 0 {
		if resp, _ := d.do(t, "PUT", "/v1/workspaces/"+ws+"/files/other.txt", "x"); resp.StatusCode == 409 {
			sawBusy = true
		}
		time.Sleep(10 * time.Millisecond)
	}
	m = <-done
	if m["status"] != "ok" {
		t.Fatalf("the approved write: %v", m)
	}
	if !sawBusy {
		t.Fatal("an upload was not refused while the approved write ran")
	}
}

// approveOverTCP approves approval id as the approver token, over the daemon's TCP
// listener at base, and returns the status.
func approveOverTCP(t *testing.T, base, id string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/approvals/"+id, strings.NewReader(`{"decision":"approve"}`))
	req.Header.Set("Authorization", "Bearer "+approverSecret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A worker stopped while it held the database (here a run past its time limit in the
// middle of a transaction) leaves SQLite's lock directory and a hot journal behind.
// The next statement, with nothing else in the workspace, removes the lock, plays
// the journal back and answers from the last committed state; while another run uses
// the workspace, the lock may be live and the answer is 409 sql_busy.
func TestSQLStoppedWriterRecovered(t *testing.T) {
	d, ws, dbPath := sqlDaemon(t, setup{})
	if v := d.run(t, `{"workspace":"`+ws+`","code":"import sqlite3\nc = sqlite3.connect('t.db')\nc.execute('CREATE TABLE t (x)')\nc.executemany('INSERT INTO t VALUES (?)', [(1,), (2,), (3,)])\nc.commit()"}`); v.Result.ExitCode != 0 {
		t.Fatalf("guest: %s", v.Result.Stderr)
	}
	// A transaction that spills changed pages into the file, then hangs.
	v := d.run(t, `{"workspace":"`+ws+`","limits":{"timeout_ms":3000},"code":"import sqlite3, time\nc = sqlite3.connect('t.db')\nc.execute('PRAGMA cache_size = 2')\nc.execute('BEGIN')\nc.execute('DELETE FROM t')\nc.executemany('INSERT INTO t VALUES (?)', ((i, ) for i in range(20000)))\nprint('spilled', flush=True)\ntime.sleep(60)"}`)
	if v.Result.Reason != "timeout" || !strings.Contains(string(v.Result.Stdout), "spilled") {
		t.Fatalf("the hanging writer: %+v", v.Result)
	}
	if _, err := os.Stat(dbPath + ".lock"); err != nil {
		t.Fatalf("no lock left behind: %v", err)
	}
	if _, err := os.Stat(dbPath + "-journal"); err != nil {
		t.Fatalf("no journal left behind: %v", err)
	}
	read := map[string]any{"workspace": ws, "db": "t.db", "sql": "SELECT count(*), sum(x) FROM t"}
	// Another run in the workspace: the lock could be its own.
	resp, body := d.do(t, "POST", "/v1/runs", `{"workspace":"`+ws+`","code":"import time; time.sleep(5)","wait":false}`)
	if resp.StatusCode != 202 {
		t.Fatalf("run: %d %s", resp.StatusCode, body)
	}
	if code, m := d.sql(t, read); code != 409 || m["sql_code"] != "sql_busy" {
		t.Fatalf("read while another run uses the workspace: %d %v", code, m)
	}
	var code int
	var m map[string]any
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if code, m = d.sql(t, read); code != 409 {
			break
		}
	}
	if code != 200 || fmt.Sprint(m["rows"]) != "[[3 6]]" {
		t.Fatalf("read after the run: %d %v", code, m)
	}
	for _, p := range []string{dbPath + ".lock", dbPath + "-journal"} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there: %v", p, err)
		}
	}
	all, _ := d.store.Events(t.Context(), d.since, "", 1000)
	var evs []store.Event
	for _, e := range all {
		if e.Kind == "sql.recovered" {
			evs = append(evs, e)
		}
	}
	if len(evs) != 1 || !strings.Contains(string(evs[0].Detail), `"lock_removed":true`) ||
		!strings.Contains(string(evs[0].Detail), `"journal_rolled_back":true`) {
		t.Fatalf("sql.recovered records: %+v", evs)
	}
	// The guest's next transaction works too.
	if v := d.run(t, `{"workspace":"`+ws+`","code":"import sqlite3\nc = sqlite3.connect('t.db')\nc.execute('INSERT INTO t VALUES (4)')\nc.commit()\nprint(c.execute('SELECT count(*) FROM t').fetchone()[0])"}`); strings.TrimSpace(string(v.Result.Stdout)) != "4" {
		t.Fatalf("guest after recovery: %s %s", v.Result.Stdout, v.Result.Stderr)
	}
}

// A statement's worker is not a run: it has sql.* records from request to end, the
// last naming the layers it ran under, and no run.* record; it is not counted in
// sandcell_runs_total.
func TestSQLIsNotARun(t *testing.T) {
	d, ws, _ := sqlDaemon(t, setup{})
	if code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "SELECT 1"}); code != 200 {
		t.Fatalf("read: %d %v", code, m)
	}
	evs, _ := d.store.Events(t.Context(), d.since, "", 1000)
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, string(e.Kind))
		if e.Kind == store.SQLFinished && !strings.Contains(string(e.Detail), `"layers":["rlimits"`) {
			t.Errorf("sql.finished without its layers: %s", e.Detail)
		}
	}
	if strings.Join(kinds, " ") != "workspace.created sql.requested sql.finished" {
		t.Fatalf("records: %v", kinds)
	}
	_, body := d.do(t, "GET", "/metrics", "")
	if !bytes.Contains(body, []byte(`sandcell_runs_total{reason="exited"} 0`)) {
		t.Fatalf("a statement counted as a run: %s", body)
	}
}

// Where policy does not hold SQL writes for approval, a write runs at once, as it is
// classified, and a read still only reads.
func TestSQLWritesNotHeld(t *testing.T) {
	no := false
	d, ws, dbPath := sqlDaemon(t, setup{writesHeld: &no})
	code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "CREATE TABLE t (x)"})
	if cl, _ := m["classification"].(map[string]any); code != 200 || m["status"] != "ok" || cl["kind"] != "write" {
		t.Fatalf("write: %d %v", code, m)
	}
	code, m = d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "PRAGMA user_version = 5"})
	if cl, _ := m["classification"].(map[string]any); code != 200 || fmt.Sprint(cl["pragmas"]) != "[PRAGMA user_version = 5]" {
		t.Fatalf("pragma: %d %v", code, m)
	}
	before := fileSum(t, dbPath)
	if code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "SELECT count(*) FROM t"}); code != 200 || fmt.Sprint(m["rows"]) != "[[0]]" {
		t.Fatalf("read: %d %v", code, m)
	}
	if fileSum(t, dbPath) != before {
		t.Fatal("a read changed the file")
	}
}

// Another caller's approval is no approval to this one: 404, and nothing of its
// statement shown.
func TestSQLApprovalOfAnotherCaller(t *testing.T) {
	d, ws, _ := sqlDaemon(t, setup{access: &api.Access{Admins: api.Principals{UIDs: map[int]bool{os.Getuid(): true}},
		Approvers: api.Principals{UIDs: map[int]bool{os.Getuid(): true}}, Tokens: api.Tokens{approverToken, aliceToken}}})
	stmt := `{"workspace":"` + ws + `","db":"t.db","sql":"CREATE TABLE secret_name (x)"`
	code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "sql": "CREATE TABLE secret_name (x)"})
	id, _ := m["approval_id"].(string)
	if code != 403 || id == "" {
		t.Fatalf("write: %d %v", code, m)
	}
	// Alice presents it with a workspace of her own, where her request is checked.
	base := d.listenTCP(t)
	_, w := tcpDo(t, base, aliceSecret, "POST", "/v1/workspaces", "")
	mine, _ := w["id"].(string)
	tcpDo(t, base, aliceSecret, "PUT", "/v1/workspaces/"+mine+"/files/t.db", "")
	status, m := tcpDo(t, base, aliceSecret, "POST", "/v1/sql", strings.Replace(stmt, ws, mine, 1)+`,"approval":"`+id+`"}`)
	if status != 404 || strings.Contains(fmt.Sprint(m), "secret_name") || m["code"] != wire.CodeNotFound {
		t.Fatalf("another caller's approval: %d %v", status, m)
	}
}
