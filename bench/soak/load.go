package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandcell/sandcell/bench/harness"
)

// load is the soak's shared state: the daemon, what the callers did and saw, and the
// workers /proc showed.
type load struct {
	d   *harness.Daemon
	mcp *mcp.ClientSession
	// gate: each operation holds it for reading; a sample of the daemon takes it, so
	// that none is in flight.
	gate sync.RWMutex

	mu          sync.Mutex
	ops         map[string]*opStats
	runs        map[string]string // run id -> the reason its caller saw
	mcpRuns     int
	count       map[string]int // audited acts: "cancel", "sql", "approval", "session", "cell", "put", "get", "delete"
	fiveXX      int
	callersSeen map[int]bool
	inflight    int
	peak        int // the most in flight since the watcher's last look

	workerSamples, workerPeak int
	overBound                 []string
}

// opStats is one operation's tally.
type opStats struct {
	requests, planned int
	status            map[int]int
	ms                []float64
	errors            []string
}

func newLoad(d *harness.Daemon) *load {
	return &load{d: d, ops: map[string]*opStats{}, runs: map[string]string{}, count: map[string]int{}, callersSeen: map[int]bool{}}
}

// caller is one of the concurrent callers, with its own workspace and database.
type caller struct {
	l    *load
	n    int
	ws   string
	rows int // rows of its table soak.db:t, as its approved writes made them
	i    int // the next operation
	seq  int // a number for programs to print
}

// ops are the operations each caller goes round, in order.
var ops = []struct {
	name string
	do   func(c *caller, ctx context.Context) error
}{
	{"run", (*caller).run}, {"run: wall-clock limit", (*caller).timeout}, {"run: CPU limit", (*caller).cpu},
	{"run: memory limit", (*caller).memory}, {"run: output cap", (*caller).flood}, {"run: cancel", (*caller).cancel},
	{"run: event stream", (*caller).events}, {"files: upload, download", (*caller).files},
	{"sql: read", (*caller).sqlRead}, {"sql: approved write", (*caller).sqlWrite}, {"session: 6 cells", (*caller).session},
	{"mcp: run_python", (*caller).mcpRun}, {"run", (*caller).run}, {"sql: read", (*caller).sqlRead},
}

// newCaller makes caller n's workspace and its database (a table t of one column).
func (l *load) newCaller(n int) (*caller, error) {
	c := &caller{l: l, n: n, i: n} // callers start at different operations
	var ws struct{ ID string }
	if err := c.expect(context.Background(), "setup", http.MethodPost, "/v1/workspaces", nil, 201, &ws); err != nil {
		return nil, err
	}
	c.ws = ws.ID
	var v runView
	err := c.expect(context.Background(), "setup", http.MethodPost, "/v1/runs", map[string]any{"workspace": c.ws,
		"code": "import sqlite3\nc = sqlite3.connect('/ws/soak.db')\nc.execute('CREATE TABLE t (x INTEGER)')\nc.commit()"}, 200, &v)
	if err == nil {
		c.accepted(v.ID, v.Result.Reason)
	}
	if err == nil && (v.Result.Reason != "exited" || v.Result.ExitCode != 0) {
		err = fmt.Errorf("the database was not made: %+v", v.Result)
	}
	return c, err
}

func (c *caller) close() {
	c.expect(context.Background(), "setup", http.MethodDelete, "/v1/workspaces/"+c.ws, nil, 204, nil)
}

// loop goes round the operations until ctx ends; an operation under way finishes.
func (c *caller) loop(ctx context.Context) {
	c.l.mu.Lock()
	c.l.callersSeen[c.n] = true
	c.l.mu.Unlock()
	for ctx.Err() == nil {
		op := ops[c.i%len(ops)]
		c.i++
		c.l.gate.RLock()
		c.l.begin()
		t := time.Now()
		err := op.do(c, context.Background())
		ms := float64(time.Since(t).Microseconds()) / 1000
		c.l.end()
		c.l.gate.RUnlock()
		c.l.mu.Lock()
		s := c.l.stats(op.name)
		s.ms = append(s.ms, ms)
		if err == nil {
			s.planned++
		} else if len(s.errors) < 5 {
			s.errors = append(s.errors, err.Error())
		}
		c.l.mu.Unlock()
	}
}

func (l *load) begin() {
	l.mu.Lock()
	l.inflight++
	l.peak = max(l.peak, l.inflight)
	l.mu.Unlock()
}

func (l *load) end() {
	l.mu.Lock()
	l.inflight--
	l.mu.Unlock()
}

// stats returns op's tally (l.mu held).
func (l *load) stats(op string) *opStats {
	s := l.ops[op]
	if s == nil {
		s = &opStats{status: map[int]int{}}
		l.ops[op] = s
	}
	return s
}

// watchWorkers samples the daemon's workers every 50 ms until ctx ends. Each
// operation uses at most one worker (a run's, a statement's, a session's), so at most
// the pool and one for each operation in flight during the last second may be there;
// more means a worker outlived its run by more than a second.
func (l *load) watchWorkers(ctx context.Context) {
	const window = 20 // samples of 50 ms: a second
	var peaks []int
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for ctx.Err() == nil {
		<-t.C
		l.mu.Lock()
		peaks = append(peaks, l.peak)
		l.peak = l.inflight
		l.mu.Unlock()
		if len(peaks) > window {
			peaks = peaks[1:]
		}
		workers := harness.WorkerChildren(l.d.Pid())
		inflight := 0
		for _, p := range peaks {
			inflight = max(inflight, p)
		}
		bound := poolSize + inflight
		l.mu.Lock()
		l.workerSamples++
		l.workerPeak = max(l.workerPeak, len(workers))
		if len(workers) > bound {
			l.overBound = append(l.overBound, fmt.Sprintf("%s: %d workers, at most %d in flight in the second before (bound %d)",
				time.Now().Format("15:04:05.000"), len(workers), inflight, bound))
		}
		l.mu.Unlock()
	}
}

// expect sends a request as operation op and decodes a JSON answer of status want
// into out (when not nil). Any other status is an error; a 5xx is also counted.
func (c *caller) expect(ctx context.Context, op, method, path string, body any, want int, out any) error {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return err
		}
	}
	status, resp, err := harness.Do(ctx, c.l.d.HTTP, method, path, "application/json", b)
	c.tally(op, status, err)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if status != want {
		return fmt.Errorf("%s %s: %d, not %d: %s", method, path, status, want, bytes.TrimSpace(resp[:min(len(resp), 300)]))
	}
	if out != nil {
		if err := json.Unmarshal(resp, out); err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return nil
}

// runView is what the soak reads of a run.
type runView struct {
	ID     string
	State  string
	Result struct {
		Reason          string
		ExitCode        int `json:"exit_code"`
		Stdout          string
		StdoutTruncated bool    `json:"stdout_truncated"`
		ElapsedMS       float64 `json:"elapsed_ms"`
	}
}

// runAs runs code with limits, waits for its end, and checks it ended for reason.
func (c *caller) runAs(ctx context.Context, op, code string, limits map[string]any, reason string) (runView, error) {
	var v runView
	if err := c.expect(ctx, op, http.MethodPost, "/v1/runs", map[string]any{"code": code, "limits": limits}, 200, &v); err != nil {
		return v, err
	}
	c.accepted(v.ID, v.Result.Reason)
	if v.Result.Reason != reason {
		return v, fmt.Errorf("run %s ended %s, not %s", v.ID, v.Result.Reason, reason)
	}
	return v, nil
}

func (c *caller) accepted(id, reason string) {
	c.l.mu.Lock()
	c.l.runs[id] = reason
	c.l.mu.Unlock()
}

func (c *caller) audited(what string, n int) {
	c.l.mu.Lock()
	c.l.count[what] += n
	c.l.mu.Unlock()
}

func (c *caller) run(ctx context.Context) error {
	c.seq++
	v, err := c.runAs(ctx, "run", fmt.Sprintf("print(%d * 3)", c.seq), nil, "exited")
	if err == nil && v.Result.Stdout != fmt.Sprintf("%d\n", c.seq*3) {
		err = fmt.Errorf("run %s printed %q", v.ID, v.Result.Stdout)
	}
	return err
}

func (c *caller) timeout(ctx context.Context) error {
	_, err := c.runAs(ctx, "run: wall-clock limit", "import time\ntime.sleep(10)", map[string]any{"timeout_ms": 300}, "timeout")
	return err
}

func (c *caller) cpu(ctx context.Context) error {
	_, err := c.runAs(ctx, "run: CPU limit", "while True: pass", map[string]any{"cpu_ms": 200, "timeout_ms": 5000}, "cpu_limit")
	return err
}

func (c *caller) memory(ctx context.Context) error {
	_, err := c.runAs(ctx, "run: memory limit", "b = bytearray(200 << 20)", map[string]any{"memory_mib": 64}, "memory_limit")
	return err
}

func (c *caller) flood(ctx context.Context) error {
	v, err := c.runAs(ctx, "run: output cap", "import sys\nsys.stdout.write('x' * (8 << 20))", map[string]any{"max_output_bytes": 65536}, "output_limit")
	if err == nil && (len(v.Result.Stdout) != 65536 || !v.Result.StdoutTruncated) {
		err = fmt.Errorf("run %s: %d bytes of stdout, truncated %v", v.ID, len(v.Result.Stdout), v.Result.StdoutTruncated)
	}
	return err
}

func (c *caller) cancel(ctx context.Context) error {
	const op = "run: cancel"
	var v runView
	if err := c.expect(ctx, op, http.MethodPost, "/v1/runs", map[string]any{"code": "while True: pass", "wait": false}, 202, &v); err != nil {
		return err
	}
	id := v.ID
	time.Sleep(100 * time.Millisecond)
	if err := c.expect(ctx, op, http.MethodDelete, "/v1/runs/"+id, nil, 200, &v); err != nil {
		c.accepted(id, "?")
		return err
	}
	c.audited("cancel", 1)
	for deadline := time.Now().Add(10 * time.Second); v.State != "done"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.accepted(id, "?")
			return fmt.Errorf("run %s not done 10 s after its cancel", id)
		}
		if err := c.expect(ctx, op, http.MethodGet, "/v1/runs/"+id, nil, 200, &v); err != nil {
			c.accepted(id, "?")
			return err
		}
	}
	c.accepted(id, v.Result.Reason)
	if v.Result.Reason != "cancelled" {
		return fmt.Errorf("run %s ended %s, not cancelled", id, v.Result.Reason)
	}
	return nil
}

// events starts a run that prints five lines and reads its event stream to the end.
func (c *caller) events(ctx context.Context) error {
	const op = "run: event stream"
	var v runView
	code := "import time\nfor i in range(5):\n    print(i, flush=True)\n    time.sleep(0.02)"
	if err := c.expect(ctx, op, http.MethodPost, "/v1/runs", map[string]any{"code": code, "wait": false}, 202, &v); err != nil {
		return err
	}
	id := v.ID
	reason, text, err := c.stream(ctx, id)
	c.accepted(id, reason)
	if err != nil {
		return fmt.Errorf("run %s: %w", id, err)
	}
	if reason != "exited" || text != "0\n1\n2\n3\n4\n" {
		return fmt.Errorf("run %s: the stream said %q, then %s", id, text, reason)
	}
	return nil
}

// stream reads GET /v1/runs/{id}/events: the stdout text, then the result's reason.
func (c *caller) stream(ctx context.Context, id string) (reason, text string, err error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://sandcell/v1/runs/"+id+"/events", nil)
	resp, err := c.l.d.HTTP.Do(req)
	status := 0
	if err == nil {
		status = resp.StatusCode
	}
	c.tally("run: event stream", status, err)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return "", "", fmt.Errorf("events: %s", resp.Status)
	}
	var out strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 4<<20)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && event == "stdout":
			var d struct{ Data string }
			if err := json.Unmarshal([]byte(line[6:]), &d); err != nil {
				return "", "", err
			}
			out.WriteString(d.Data)
		case strings.HasPrefix(line, "data: ") && event == "result":
			var v runView
			if err := json.Unmarshal([]byte(line[6:]), &v); err != nil {
				return "", "", err
			}
			return v.Result.Reason, out.String(), nil
		}
	}
	return "", out.String(), fmt.Errorf("the stream ended without a result: %v", sc.Err())
}

// files uploads 256 KiB, downloads it and compares; every third time it removes it.
func (c *caller) files(ctx context.Context) error {
	const op = "files: upload, download"
	data := make([]byte, 256<<10)
	rand.Read(data)
	c.seq++
	path := fmt.Sprintf("/v1/workspaces/%s/files/up/%d.bin", c.ws, c.seq%4)
	st, _, err := harness.Do(ctx, c.l.d.HTTP, http.MethodPut, path, "application/octet-stream", data)
	c.tally(op, st, err)
	if err != nil || st != 201 && st != 204 && st != 200 {
		return fmt.Errorf("PUT %s: %d %v", path, st, err)
	}
	c.audited("put", 1)
	st, got, err := harness.Get(ctx, c.l.d.HTTP, path)
	c.tally(op, st, err)
	if err != nil || st != 200 {
		return fmt.Errorf("GET %s: %d %v", path, st, err)
	}
	c.audited("get", 1)
	if !bytes.Equal(got, data) {
		return fmt.Errorf("GET %s: %d bytes, not the %d written", path, len(got), len(data))
	}
	if c.seq%3 == 0 {
		st, _, err := harness.Do(ctx, c.l.d.HTTP, http.MethodDelete, path, "", nil)
		c.tally(op, st, err)
		if err != nil || st != 204 {
			return fmt.Errorf("DELETE %s: %d %v", path, st, err)
		}
		c.audited("delete", 1)
	}
	return nil
}

// tally counts one request of op and its answer's status (none when err is set); a 5xx
// is also counted apart.
func (c *caller) tally(op string, status int, err error) {
	c.l.mu.Lock()
	s := c.l.stats(op)
	s.requests++
	if err == nil {
		s.status[status]++
		if status >= 500 {
			c.l.fiveXX++
		}
	}
	c.l.mu.Unlock()
}

func (c *caller) sqlRead(ctx context.Context) error {
	var out struct {
		Status string
		Rows   [][]any
	}
	err := c.expect(ctx, "sql: read", http.MethodPost, "/v1/sql", map[string]any{"workspace": c.ws, "db": "soak.db",
		"sql": "SELECT count(*) FROM t"}, 200, &out)
	if err != nil {
		return err
	}
	c.audited("sql", 1)
	if len(out.Rows) != 1 || len(out.Rows[0]) != 1 || out.Rows[0][0] != float64(c.rows) {
		return fmt.Errorf("SELECT count(*): %v, not %d", out.Rows, c.rows)
	}
	return nil
}

// sqlWrite inserts a row: held for approval (403), confirmed by the caller, run with
// the approval.
func (c *caller) sqlWrite(ctx context.Context) error {
	const op = "sql: approved write"
	req := map[string]any{"workspace": c.ws, "db": "soak.db", "sql": "INSERT INTO t VALUES (?)", "params": []int{c.seq}}
	var held struct {
		Code       string
		ApprovalID string `json:"approval_id"`
	}
	if err := c.expect(ctx, op, http.MethodPost, "/v1/sql", req, 403, &held); err != nil {
		return err
	}
	if held.Code != "approval_required" {
		return fmt.Errorf("the write: %s, not approval_required", held.Code)
	}
	c.audited("approval", 1)
	if err := c.expect(ctx, op, http.MethodPost, "/v1/approvals/"+held.ApprovalID+"/confirm", map[string]string{"decision": "approve"}, 200, nil); err != nil {
		return err
	}
	req["approval"] = held.ApprovalID
	var out struct{ Changes int }
	if err := c.expect(ctx, op, http.MethodPost, "/v1/sql", req, 200, &out); err != nil {
		return err
	}
	c.audited("sql", 1)
	if out.Changes != 1 {
		return fmt.Errorf("the approved write changed %d rows", out.Changes)
	}
	c.rows++
	return nil
}

// session opens a session on the caller's workspace and runs six cells: state kept
// from one to the next, a cell stopped by its time limit rolled back, then closes it.
func (c *caller) session(ctx context.Context) error {
	const op = "session: 6 cells"
	var s struct{ ID string }
	if err := c.expect(ctx, op, http.MethodPost, "/v1/sessions", map[string]any{"workspace": c.ws}, 201, &s); err != nil {
		return err
	}
	c.audited("session", 1)
	defer func() {
		if c.expect(ctx, op, http.MethodDelete, "/v1/sessions/"+s.ID, nil, 204, nil) != nil {
			c.audited("session", -1) // no session.closed expected then: the check will say so
		}
	}()
	cells := []struct {
		code, state, value string
		limits             map[string]any
	}{
		{"n = 0", "preserved", "", nil},
		{"n += 1", "preserved", "", nil},
		{"n += 1\nn", "preserved", "2", nil},
		{"n = 100\nwhile True: pass", "rolled_back", "", map[string]any{"timeout_ms": 300}},
		{"n += 1\nn", "preserved", "3", nil},
		{"import os\nlen(os.listdir('/ws')) > 0", "preserved", "True", nil},
	}
	for _, cell := range cells {
		var a struct {
			State, Value string
		}
		err := c.expect(ctx, op, http.MethodPost, "/v1/sessions/"+s.ID+"/cells", map[string]any{"code": cell.code, "limits": cell.limits}, 200, &a)
		if err != nil {
			return err
		}
		c.audited("cell", 1)
		if a.State != cell.state || a.Value != cell.value {
			return fmt.Errorf("cell %q: %s %q, not %s %q", cell.code, a.State, a.Value, cell.state, cell.value)
		}
	}
	return nil
}

func (c *caller) mcpRun(ctx context.Context) error {
	c.seq++
	res, err := c.l.mcp.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": fmt.Sprintf("print(%d + 1)", c.seq)}})
	c.l.mu.Lock()
	c.l.stats("mcp: run_python").requests++
	if err == nil && !res.IsError {
		c.l.mcpRuns++
	}
	c.l.mu.Unlock()
	if err != nil {
		return err
	}
	if res.IsError || len(res.Content) == 0 {
		return fmt.Errorf("run_python: %+v", res.Content)
	}
	if text := res.Content[0].(*mcp.TextContent).Text; !strings.Contains(text, fmt.Sprintf("\n%d\n", c.seq+1)) {
		return fmt.Errorf("run_python printed %q", text)
	}
	return nil
}
