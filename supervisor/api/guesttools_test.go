package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/tools"
)

// referenceServer is the command of one of the reference MCP servers from npm
// (test/mcp-client/package-lock.json pins them: make mcp-client installs them).
func referenceServer(t *testing.T, name string) []string {
	t.Helper()
	bin, err := filepath.Abs("../../test/mcp-client/node_modules/.bin/mcp-server-" + name)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		t.Fatalf("the reference MCP server %s is not installed (make mcp-client, as make test does): %v", name, err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is required (make mcp-client installs it): %v", err)
	}
	return []string{bin}
}

// toolsDaemon is a daemon whose Unix caller may run code and approve (and an
// approver's token, at tcp, decides its requests), with tools declared.
func toolsDaemon(t *testing.T, tools map[string]config.Tool) (*daemon, func(id string, body string) (int, map[string]any)) {
	uid := os.Getuid()
	a := api.Access{Admins: api.Principals{UIDs: map[int]bool{uid: true}},
		Approvers: api.Principals{UIDs: map[int]bool{uid: true}}, Tokens: api.Tokens{approverToken}}
	d := start(t, setup{access: &a, tools: tools})
	tcp := d.listenTCP(t)
	decide := func(id, body string) (int, map[string]any) {
		req, _ := http.NewRequest("POST", tcp+"/v1/approvals/"+id, strings.NewReader(body))
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
	return d, decide
}

// pendingToolCall waits for the one pending approval of a guest's tool call and
// returns it.
func (d *daemon) pendingToolCall(t *testing.T) map[string]any {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		_, body := d.do(t, "GET", "/v1/approvals?state=pending", "")
		var l struct {
			Approvals []map[string]any `json:"approvals"`
		}
		json.Unmarshal(body, &l)
		for _, ap := range l.Approvals {
			if ap["action"] == "tool.call" {
				return ap
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("no tool call waited for approval within 60 s")
	return nil
}

// toolRecords are the tool.called records since the daemon started.
func (d *daemon) toolRecords(t *testing.T) []map[string]any {
	t.Helper()
	evs, err := d.store.Events(t.Context(), d.since, "", 10000)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, e := range evs {
		if e.Kind == store.ToolCalled {
			var m map[string]any
			json.Unmarshal(e.Detail, &m)
			out = append(out, m)
		}
	}
	return out
}

// Code mode with the reference memory server (which writes) started by the
// daemon: GET /v1/tools lists its tools, each write marked; a guest's loop of 50
// writes waits once for a person, who approves it with a grant of 50, and runs to
// its end; a read needs nobody; a second run's write is declined and raises
// ApprovalDeclined; a tool not offered raises ToolDenied; every call has exactly
// one tool.called record, with its decision.
func TestGuestToolsMemoryServer(t *testing.T) {
	mem := filepath.Join(t.TempDir(), "memory.jsonl")
	d, decide := toolsDaemon(t, map[string]config.Tool{
		"memory": {Command: referenceServer(t, "memory"), Env: map[string]string{"MEMORY_FILE_PATH": mem}},
	})
	_, body := d.do(t, "GET", "/v1/tools", "")
	var listing struct {
		GuestTools []struct {
			Name  string `json:"name"`
			Error string `json:"error"`
			Tools []struct {
				Name   string `json:"name"`
				Writes bool   `json:"writes"`
			} `json:"tools"`
		} `json:"guest_tools"`
	}
	if err := json.Unmarshal(body, &listing); err != nil || len(listing.GuestTools) != 1 || listing.GuestTools[0].Error != "" {
		t.Fatalf("GET /v1/tools: %v %s", err, body)
	}
	writes := map[string]bool{}
	for _, tl := range listing.GuestTools[0].Tools {
		writes[tl.Name] = tl.Writes
	}
	if w, ok := writes["memory.create_entities"]; !ok || !w || writes["memory.read_graph"] {
		t.Fatalf("the memory server's tools as listed: %v", writes)
	}
	// The agent tools that run code say what the code may call.
	if !strings.Contains(string(body), "- memory.create_entities [writes]: ") || !strings.Contains(string(body), "- memory.read_graph: ") {
		t.Fatalf("run_python's description does not list the guest tools: %s", body)
	}

	program := `
from sandcell.tools import memory, ToolDenied
for i in range(50):
    memory.create_entities(entities=[{"name": "e%d" % i, "entityType": "test", "observations": ["n%d" % i]}])
graph = memory.read_graph()
print(len(graph["entities"]))
try:
    memory.nope()
except AttributeError:
    print("no such function")
from sandcell import tools
try:
    tools.memory.delete_all = None
    import json
    from _sandcell import tool_call
except ImportError:
    pass
`
	b, _ := json.Marshal(map[string]any{"code": program, "wait": false})
	resp, raw := d.do(t, "POST", "/v1/runs", string(b))
	if resp.StatusCode != 202 {
		t.Fatalf("start: %d %s", resp.StatusCode, raw)
	}
	var run struct {
		ID string `json:"id"`
	}
	json.Unmarshal(raw, &run)
	ap := d.pendingToolCall(t)
	subject, _ := json.Marshal(ap["subject"])
	if !strings.Contains(string(subject), `"tool":"memory.create_entities"`) || !strings.Contains(string(subject), "for i in range(50)") ||
		!strings.Contains(string(subject), `"run":"`+run.ID+`"`) {
		t.Fatalf("what the approver sees: %s", subject)
	}
	if code, m := decide(ap["id"].(string), `{"decision":"approve","grant":50}`); code != 200 || m["grant"] != float64(50) {
		t.Fatalf("approve with a grant: %d %v", code, m)
	}
	raw = d.waitRun(t, run.ID)
	var view struct {
		State  string `json:"state"`
		Result struct {
			Reason string `json:"reason"`
			Stdout string `json:"stdout"`
			Stderr string `json:"stderr"`
		} `json:"result"`
	}
	json.Unmarshal(raw, &view)
	if view.Result.Reason != "exited" || view.Result.Stdout != "50\nno such function\n" {
		t.Fatalf("the run: %s", raw)
	}
	recs := d.toolRecords(t)
	count := map[string]int{}
	for _, r := range recs {
		count[fmt.Sprint(r["tool"], " ", r["decision"])]++
		if r["arguments_sha256"] == nil || r["result_sha256"] == nil {
			t.Errorf("a record without its digests: %v", r)
		}
	}
	want := map[string]int{"memory.create_entities approved": 1, "memory.create_entities granted": 49, "memory.read_graph allowed": 1}
	if fmt.Sprint(count) != fmt.Sprint(want) {
		t.Fatalf("tool.called records: %v, want %v", count, want)
	}
	_, metrics := d.do(t, "GET", "/metrics", "")
	for _, line := range []string{`sandcell_tool_calls_total{decision="approved"} 1`, `sandcell_tool_calls_total{decision="granted"} 49`,
		`sandcell_tool_calls_total{decision="allowed"} 1`} {
		if !strings.Contains(string(metrics), line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}

	// Declined: the guest hears ApprovalDeclined; the tool is not called.
	b, _ = json.Marshal(map[string]any{"code": `
from sandcell.tools import memory, ApprovalDeclined
try:
    memory.delete_entities(entityNames=["e1"])
except ApprovalDeclined as e:
    print("declined:", e)
print(len(memory.read_graph()["entities"]))
`, "wait": false})
	_, raw = d.do(t, "POST", "/v1/runs", string(b))
	json.Unmarshal(raw, &run)
	ap = d.pendingToolCall(t)
	if code, m := decide(ap["id"].(string), `{"decision":"deny"}`); code != 200 || m["state"] != "denied" {
		t.Fatalf("deny: %d %v", code, m)
	}
	raw = d.waitRun(t, run.ID)
	json.Unmarshal(raw, &view)
	if !strings.HasPrefix(view.Result.Stdout, "declined: the call was not approved") || !strings.HasSuffix(view.Result.Stdout, "\n50\n") {
		t.Fatalf("the declined run: %s", raw)
	}
	recs = d.toolRecords(t)
	if last := recs[len(recs)-2]; last["tool"] != "memory.delete_entities" || last["decision"] != "declined" || last["result_sha256"] != nil {
		t.Fatalf("the declined call's record: %v", last)
	}

	// A session's cells call tools as runs do; their records name the session.
	sid := d.openSession(t, `{}`)
	if code, ans, raw := d.cell(t, sid, `{"code":"from sandcell.tools import memory\nn = len(memory.read_graph()['entities'])\nn"}`); code != 200 || ans.Value != "50" {
		t.Fatalf("a cell: %d %s", code, raw)
	}
	recs = d.toolRecords(t)
	if last := recs[len(recs)-1]; last["session"] != sid || last["tool"] != "memory.read_graph" || last["decision"] != "allowed" {
		t.Fatalf("the cell's call's record: %v", last)
	}
	// A cell's loop of writes, approved once.
	type answer struct {
		code int
		raw  []byte
	}
	done := make(chan answer, 1)
	go func() {
		code, _, raw := d.cell(t, sid, `{"code":"for i in range(10):\n    memory.add_observations(observations=[{'entityName': 'e1', 'contents': ['c%d' % i]}])\nlen(memory.open_nodes(names=['e1'])['entities'][0]['observations'])"}`)
		done <- answer{code, raw}
	}()
	ap = d.pendingToolCall(t)
	if code, m := decide(ap["id"].(string), `{"decision":"approve","grant":10}`); code != 200 {
		t.Fatalf("approve the cell's loop: %d %v", code, m)
	}
	if got := <-done; got.code != 200 || !strings.Contains(string(got.raw), `"value":"11"`) {
		t.Fatalf("the cell's loop: %d %s", got.code, got.raw)
	}
}

// waitRun polls run id until it is done and returns its view.
func (d *daemon) waitRun(t *testing.T, id string) []byte {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		_, raw := d.do(t, "GET", "/v1/runs/"+id, "")
		var v struct {
			State string `json:"state"`
		}
		json.Unmarshal(raw, &v)
		if v.State == "done" {
			return raw
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("run %s did not end within 2 minutes", id)
	return nil
}

// A server that hangs, crashes, answers garbage, answers past the bound or reports
// an error: each call fails with a clear ToolError, within the source's timeout,
// and the next call works (the broker connects again); the run and the daemon go
// on. A source's limits end the run's calls past them with ToolLimit; a source
// whose roles the caller lacks is not listed, and a call forged to it is denied
// (ToolDenied), audited.
func TestGuestToolsFaultyServers(t *testing.T) {
	script, _ := filepath.Abs("testdata/faulty_mcp.py")
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is required: %v", err)
	}
	uid := os.Getuid()
	a := api.Access{Runners: api.Principals{UIDs: map[int]bool{uid: true}}}
	d := start(t, setup{access: &a, tools: map[string]config.Tool{
		"faulty":  {Command: []string{py, script}, Timeout: config.Duration{Duration: 2 * time.Second}},
		"limited": {Command: []string{py, script}, Allow: []string{"ok"}, Calls: 3, ArgumentBytes: 100},
		"admins":  {Command: []string{py, script}, Roles: []string{"admin"}},
	}})
	program := `
import json
from sandcell.tools import faulty, limited, ToolError, ToolLimit
import sandcell.tools as tools
def attempt(f, *a, **kw):
    try:
        return f(*a, **kw)
    except ToolError as e:
        return "%s: %s" % (type(e).__name__, e)
print(attempt(faulty.ok, a=1))
for n in ["hang", "crash", "garbage", "huge", "error"]:
    print(n, "|", attempt(getattr(faulty, n)))
    print(attempt(faulty.ok, after=n))
print(attempt(limited.ok, x="y" * 200))
print([attempt(limited.ok, i=i) for i in range(4)])
print(sorted(s["name"].split(".")[0] for s in tools.list()))
from _sandcell import tool_call
print(json.loads(tool_call(json.dumps({"tool": "admins.ok", "arguments": {}}).encode()))["error"]["class"])
`
	b, _ := json.Marshal(map[string]any{"code": program, "limits": map[string]any{"timeout_ms": 60000}})
	resp, raw := d.do(t, "POST", "/v1/runs", string(b))
	var view struct {
		Result struct {
			Reason string `json:"reason"`
			Stdout string `json:"stdout"`
			Stderr string `json:"stderr"`
		} `json:"result"`
	}
	json.Unmarshal(raw, &view)
	if resp.StatusCode != 200 || view.Result.Reason != "exited" {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	lines := strings.Split(strings.TrimSpace(view.Result.Stdout), "\n")
	want := []string{
		`{'a': 1}`,
		`hang | ToolError: faulty.hang: no answer within 2s`, `{'after': 'hang'}`,
		`crash | ToolError: faulty.crash:`, `{'after': 'crash'}`,
		`garbage | ToolError: faulty.garbage:`, `{'after': 'garbage'}`,
		`huge | ToolError: faulty.huge:`, `{'after': 'huge'}`,
		`error | ToolError: faulty.error: it failed`, `{'after': 'error'}`,
		`ToolLimit: the arguments are 208 bytes, more than limited allows (100)`,
		`[{'i': 0}, {'i': 1}, {'i': 2}, 'ToolLimit: this run has made the 3 calls limited allows']`,
		`['faulty', 'faulty', 'faulty', 'faulty', 'faulty', 'faulty', 'faulty', 'limited']`,
		`ToolDenied`,
	}
	if len(lines) != len(want) {
		t.Fatalf("output:\n%s\n%s", view.Result.Stdout, view.Result.Stderr)
	}
	for i := range want {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("line %d: %q, want %q...", i, lines[i], want[i])
		}
	}
	recs := d.toolRecords(t)
	last := recs[len(recs)-1]
	if last["tool"] != "admins.ok" || last["decision"] != "denied" {
		t.Fatalf("the forged call's record: %v", last)
	}
	// Every call the guest made has its record: 11 to faulty, 1 + 4 to limited, 1 forged.
	if len(recs) != 17 {
		t.Fatalf("%d tool.called records, want 17", len(recs))
	}
}

// The reference "everything" server as a declared tool over stdio and, started
// apart, over streamable HTTP with a bearer token from a file: its read-only tools
// (annotated so) are called at once; a program shows them with help(); results
// come back as Python values.
func TestGuestToolsEverythingServer(t *testing.T) {
	bin := referenceServer(t, "everything")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	srv := exec.Command(bin[0], "streamableHttp")
	srv.Env = append(os.Environ(), "PORT="+port)
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err == nil {
			c.Close()
			break
		}
		if i == 200 {
			t.Fatalf("the HTTP server did not listen: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("secret\n"), 0o600)
	d, _ := toolsDaemon(t, map[string]config.Tool{
		"every":  {Command: bin, Allow: []string{"echo", "get-sum"}},
		"remote": {URL: "http://127.0.0.1:" + port + "/mcp", TokenFile: token, Allow: []string{"echo", "get-sum"}},
	})
	b, _ := json.Marshal(map[string]any{"code": `
from sandcell.tools import every, remote
import sandcell.tools as tools
tools.help()
print(every.get_sum(2, 3), remote.get_sum(a=4, b=5))
print(every.echo("hi"), remote.echo(message="there"))
`})
	resp, raw := d.do(t, "POST", "/v1/runs", string(b))
	var view struct {
		Result struct {
			Stdout string `json:"stdout"`
			Stderr string `json:"stderr"`
		} `json:"result"`
	}
	json.Unmarshal(raw, &view)
	out := view.Result.Stdout
	if resp.StatusCode != 200 || !strings.Contains(out, "every.get_sum  ") || !strings.Contains(out, "remote.echo  ") ||
		!strings.Contains(out, "\nThe sum of 2 and 3 is 5. The sum of 4 and 5 is 9.\nEcho: hi Echo: there\n") {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	for _, r := range d.toolRecords(t) {
		if r["decision"] != "allowed" {
			t.Errorf("a read-only tool's call: %v", r)
		}
	}
}

// examples/code-mode.py, as docs/agents.md shows it: its loop of writes approved
// once with a grant, its clean-up declined, its join printed.
func TestCodeModeExample(t *testing.T) {
	code, err := os.ReadFile("../../examples/code-mode.py")
	if err != nil {
		t.Fatal(err)
	}
	d, decide := toolsDaemon(t, map[string]config.Tool{"memory": {Command: referenceServer(t, "memory"),
		Env: map[string]string{"MEMORY_FILE_PATH": filepath.Join(t.TempDir(), "memory.jsonl")}}})
	b, _ := json.Marshal(map[string]any{"code": string(code), "wait": false})
	_, raw := d.do(t, "POST", "/v1/runs", string(b))
	var run struct {
		ID string `json:"id"`
	}
	json.Unmarshal(raw, &run)
	ap := d.pendingToolCall(t)
	if code, m := decide(ap["id"].(string), `{"decision":"approve","grant":3}`); code != 200 {
		t.Fatalf("approve: %d %v", code, m)
	}
	ap = d.pendingToolCall(t) // the clean-up
	if !strings.Contains(fmt.Sprint(ap["subject"]), "memory.delete_entities") {
		t.Fatalf("the second approval: %v", ap)
	}
	decide(ap["id"].(string), `{"decision":"deny"}`)
	var view struct {
		Result struct {
			Stdout string `json:"stdout"`
		} `json:"result"`
	}
	json.Unmarshal(d.waitRun(t, run.ID), &view)
	want := "1001 acme 120.50 | ordered 150.75 in all\n1002 globex 75.00 | ordered 75.00 in all\n" +
		"1003 acme 30.25 | ordered 150.75 in all\n1004 initech 410.00 | ordered 410.00 in all\ncleanup not done: ApprovalDeclined\n"
	if view.Result.Stdout != want {
		t.Fatalf("got %q, want %q", view.Result.Stdout, want)
	}
}

// A SQLite database outside every workspace as a declared tool: reads run at once,
// a write waits for a person and then lands, a read-only one's write is refused
// (ToolDenied), and a statement the SQL tool never runs (ATTACH) is refused.
func TestGuestToolsDatabase(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is required: %v", err)
	}
	dbDir := t.TempDir()
	db := filepath.Join(dbDir, "crm.db")
	if out, err := exec.Command(py, "-c", `import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("CREATE TABLE customers (name TEXT, tier TEXT)")
c.executemany("INSERT INTO customers VALUES (?, ?)", [("acme", "gold"), ("globex", "silver")])
c.commit()`, db).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	d, decide := toolsDaemon(t, map[string]config.Tool{
		"crm": {Path: db, Writable: true},
		"ro":  {Path: db},
	})
	b, _ := json.Marshal(map[string]any{"wait": false, "code": `
from sandcell.tools import crm, ro, ToolDenied
r = crm.query("SELECT name, tier FROM customers ORDER BY name")
print(r["columns"], r["rows"])
for f, sql in ((ro.query, "INSERT INTO customers VALUES ('x', 'y')"), (crm.query, "ATTACH '/etc/passwd' AS p")):
    try:
        f(sql)
    except ToolDenied as e:
        print("denied:", e)
print(crm.query("INSERT INTO customers VALUES (?, ?)", params=["initech", "gold"])["changes"])
print(ro.query("SELECT count(*) FROM customers WHERE tier = :t", params={"t": "gold"})["rows"])
`})
	_, raw := d.do(t, "POST", "/v1/runs", string(b))
	var run struct {
		ID string `json:"id"`
	}
	json.Unmarshal(raw, &run)
	ap := d.pendingToolCall(t)
	if !strings.Contains(fmt.Sprint(ap["subject"]), "INSERT INTO customers VALUES (?, ?)") {
		t.Fatalf("what the approver sees: %v", ap["subject"])
	}
	decide(ap["id"].(string), `{"decision":"approve"}`)
	var view struct {
		Result struct {
			Stdout string `json:"stdout"`
			Stderr string `json:"stderr"`
		} `json:"result"`
	}
	json.Unmarshal(d.waitRun(t, run.ID), &view)
	want := "['name', 'tier'] [['acme', 'gold'], ['globex', 'silver']]\n" +
		"denied: ro is read-only, and this statement writes\n"
	if !strings.HasPrefix(view.Result.Stdout, want) || !strings.Contains(view.Result.Stdout, "denied: the statement is refused") ||
		!strings.HasSuffix(view.Result.Stdout, "\n1\n[[2]]\n") {
		t.Fatalf("%s\n%s", view.Result.Stdout, view.Result.Stderr)
	}
}

// Code mode over MCP: run_python's program loops over a tool that writes; the
// person at the client (which can be asked: the Go SDK's client, answering MCP's
// input requests) is shown the tool, its arguments and the program once, and
// approves the loop's 50 calls in one answer; the run ends with them made.
func TestMCPCodeModeConfirmedAtTheClient(t *testing.T) {
	d := start(t, setup{elicitation: []string{"socket"}, tools: map[string]config.Tool{"memory": {
		Command: referenceServer(t, "memory"), Env: map[string]string{"MEMORY_FILE_PATH": filepath.Join(t.TempDir(), "m.jsonl")}}}})
	d.do(t, "GET", "/v1/tools", "") // (connects the server: the tools' descriptions list it)
	var shown []string
	cs := connectWith(t, d, &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		shown = append(shown, req.Params.Message)
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"calls": 50}}, nil
	}})
	res, text := callTool(t, cs, tools.RunPython, map[string]any{"code": `
from sandcell.tools import memory
for i in range(50):
    memory.create_entities(entities=[{"name": "e%d" % i, "entityType": "t", "observations": []}])
print(len(memory.read_graph()["entities"]))
`})
	if res.IsError || !strings.Contains(text, "\n50\n") || len(shown) != 1 ||
		!strings.Contains(shown[0], "calls memory.create_entities, a tool that writes") || !strings.Contains(shown[0], "for i in range(50):") {
		t.Fatalf("%q, shown %q", text, shown)
	}
	count := map[string]int{}
	for _, r := range d.toolRecords(t) {
		count[fmt.Sprint(r["decision"])]++
	}
	if count["approved"] != 1 || count["granted"] != 49 || count["allowed"] != 1 {
		t.Fatalf("tool.called decisions: %v", count)
	}
}

// A session's state paused to disk and resumed, or forked, holds what its cells got
// from their calls, and no call is made again: the records count the calls made. A
// reload's [tools] are what the next runs may call.
func TestGuestToolsNeverReplayedAndReloaded(t *testing.T) {
	script, _ := filepath.Abs("testdata/faulty_mcp.py")
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is required: %v", err)
	}
	uid := os.Getuid()
	a := api.Access{Admins: api.Principals{UIDs: map[int]bool{uid: true}}}
	d := start(t, setup{access: &a, tools: map[string]config.Tool{"faulty": {Command: []string{py, script}}},
		sessions: func(s *config.Sessions) { s.PauseAfter.Duration = 300 * time.Millisecond }})
	calls := func() int { return len(d.toolRecords(t)) }
	sid := d.openSession(t, `{}`)
	if code, _, raw := d.cell(t, sid, `{"code":"from sandcell.tools import faulty\nx = faulty.ok(n=1)"}`); code != 200 || calls() != 1 {
		t.Fatalf("the first cell: %d %s, %d calls", code, raw, calls())
	}
	// Paused to disk once idle, then resumed by the next cell.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, b := d.do(t, "GET", "/v1/sessions/"+sid, "")
		if strings.Contains(string(b), `"state":"paused"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session was not paused: %s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, ans, raw := d.cell(t, sid, `{"code":"x"}`); code != 200 || ans.Value != "{'n': 1}" || calls() != 1 {
		t.Fatalf("resumed: %d %s, %d calls", code, raw, calls())
	}
	resp, b := d.do(t, "POST", "/v1/sessions/"+sid+"/fork", "")
	var fork struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(b, &fork); resp.StatusCode != 201 {
		t.Fatalf("fork: %d %s", resp.StatusCode, b)
	}
	if code, ans, raw := d.cell(t, fork.ID, `{"code":"x, faulty.ok(n=2)"}`); code != 200 || ans.Value != "({'n': 1}, {'n': 2})" || calls() != 2 {
		t.Fatalf("the fork: %d %s, %d calls", code, raw, calls())
	}
	if last := d.toolRecords(t)[1]; last["session"] != fork.ID {
		t.Fatalf("the fork's call's record: %v", last)
	}

	d.reload(func(c *config.Config) {
		c.Tools = map[string]config.Tool{"second": {Command: []string{py, script}, Allow: []string{"ok"}}}
	})
	b, _ = json.Marshal(map[string]any{"code": "import sandcell.tools as t\nprint([s['name'] for s in t.list()], t.second.ok(k=3))"})
	_, raw := d.do(t, "POST", "/v1/runs", string(b))
	var view struct {
		Result struct {
			Stdout string `json:"stdout"`
		} `json:"result"`
	}
	json.Unmarshal(raw, &view)
	if view.Result.Stdout != "['second.ok'] {'k': 3}\n" {
		t.Fatalf("after the reload: %s", raw)
	}
}

// What a hostile review found: a server whose listing pages without end is refused,
// not held; one run's end does not end another's call on the same server; a run's
// refused calls are bounded, and so are their records; a redirect does not carry
// the token; a session cell's call does not find another cell's approval waiting.
func TestGuestToolsUnderAttack(t *testing.T) {
	script, _ := filepath.Abs("testdata/faulty_mcp.py")
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is required: %v", err)
	}
	d, _ := toolsDaemon(t, map[string]config.Tool{
		"faulty": {Command: []string{py, script}, Calls: 5},
		"pages":  {Command: []string{py, script}, Env: map[string]string{"FAULTY_PAGES": "1"}},
	})
	run := func(code string, timeoutMS int, wait bool) (string, []byte) {
		b, _ := json.Marshal(map[string]any{"code": code, "wait": wait, "limits": map[string]any{"timeout_ms": timeoutMS}})
		_, raw := d.do(t, "POST", "/v1/runs", string(b))
		var v struct {
			ID string `json:"id"`
		}
		json.Unmarshal(raw, &v)
		return v.ID, raw
	}
	_, body := d.do(t, "GET", "/v1/tools", "")
	if !strings.Contains(string(body), `"name":"pages","roles":["runner"],"tools":[],"error":"it lists more than 512 tools"`) {
		t.Fatalf("a listing without end: %s", body)
	}
	victim, _ := run("from sandcell.tools import faulty\nprint(faulty.sleepy(s=2))", 20000, false)
	time.Sleep(500 * time.Millisecond)
	run("from sandcell.tools import faulty\nfaulty.sleepy(s=1)", 1000, true)
	var view struct {
		Result struct {
			Stdout string `json:"stdout"`
			Stderr string `json:"stderr"`
		} `json:"result"`
	}
	json.Unmarshal(d.waitRun(t, victim), &view)
	if view.Result.Stdout != "{'s': 2}\n" {
		t.Fatalf("another run's end ended this one's call: %q %s", view.Result.Stdout, view.Result.Stderr)
	}
	before := len(d.toolRecords(t))
	_, raw := run(`
import json
from _sandcell import tool_call
n = 0
for i in range(5000):
    a = json.loads(tool_call(json.dumps({"tool": "faulty." + "X" * 5000, "arguments": {}}).encode()))
    n += a["error"]["class"] == "ToolLimit"
print(n)
`, 60000, true)
	json.Unmarshal(raw, &view)
	// The bound: twice the sources' calls (5 and the default 1000) and 64; one
	// record past it.
	if got := len(d.toolRecords(t)) - before; view.Result.Stdout != "2926\n" || got != 2*(5+1000)+64+1 {
		t.Fatalf("5000 refused calls: %d records, %s", got, raw)
	}
	for _, r := range d.toolRecords(t)[before:] {
		if b, _ := json.Marshal(r); len(b) > 2000 {
			t.Fatalf("a record holds the guest's whole name: %d bytes", len(b))
		}
	}
}

// A streamable HTTP source that redirects elsewhere: the redirect is not followed,
// and the token goes nowhere but the configured URL.
func TestGuestToolsTokenStaysWithItsServer(t *testing.T) {
	var leaked atomic.Int32
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			leaked.Add(1)
		}
		w.WriteHeader(404)
	}))
	defer elsewhere.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+"/steal", http.StatusTemporaryRedirect)
	}))
	defer redirect.Close()
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("s3cret"), 0o600)
	d, _ := toolsDaemon(t, map[string]config.Tool{"remote": {URL: redirect.URL + "/mcp", TokenFile: token}})
	_, body := d.do(t, "GET", "/v1/tools", "")
	if !strings.Contains(string(body), `"name":"remote"`) || !strings.Contains(string(body), `"error":"connect:`) || leaked.Load() != 0 {
		t.Fatalf("%d requests elsewhere carried the token: %s", leaked.Load(), body)
	}
}
