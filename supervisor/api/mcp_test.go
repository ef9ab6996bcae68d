package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/mcpserver"
	"github.com/sandcell/sandcell/supervisor/tools"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// connectMCP opens an MCP session on the daemon's /mcp over its Unix socket with the
// official Go SDK's client; changed, when not nil, hears each tools/list_changed.
func connectMCP(t *testing.T, d *daemon, changed chan<- struct{}) *mcp.ClientSession {
	t.Helper()
	opts := &mcp.ClientOptions{}
	if changed != nil {
		opts.ToolListChangedHandler = func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case changed <- struct{}{}:
			default:
			}
		}
	}
	return connectWith(t, d, opts)
}

func connectWith(t *testing.T, d *daemon, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "sandcell-test", Version: "1"}, opts)
	cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: "http://sandcell/mcp",
		HTTPClient: client.HTTP(d.socket)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func callTool(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, string) {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	return res, text.String()
}

// The tools over MCP's streamable HTTP at /mcp, as the Go SDK's client sees them:
// the same list as GET /v1/tools, a run printing 42 in the session's workspace, a
// file written and read back, a SQL read and a write held for approval, an argument
// past its bound refused before anything runs.
func TestMCPOverHTTP(t *testing.T) {
	d := start(t, setup{})
	cs := connectMCP(t, d, nil)
	if init := cs.InitializeResult(); init.ServerInfo.Name != "sandcell" || init.Capabilities.Tools == nil {
		t.Fatalf("initialize: %+v", init)
	}
	listed, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, body := d.do(t, "GET", "/v1/tools", "")
	var listing struct {
		Available       bool                         `json:"available"`
		Tools           []map[string]json.RawMessage `json:"tools"`
		FunctionCalling map[string][]map[string]any  `json:"function_calling"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &listing) != nil || !listing.Available {
		t.Fatalf("/v1/tools: %d %s", resp.StatusCode, body)
	}
	if len(listed.Tools) != len(listing.Tools) || len(listing.FunctionCalling["openai"]) != len(listing.Tools) ||
		len(listing.FunctionCalling["anthropic"]) != len(listing.Tools) {
		t.Fatalf("%d tools over MCP, %d at /v1/tools: %s", len(listed.Tools), len(listing.Tools), body)
	}
	for i, tool := range listed.Tools {
		schema, _ := json.Marshal(tool.InputSchema)
		var name, desc string
		json.Unmarshal(listing.Tools[i]["name"], &name)
		json.Unmarshal(listing.Tools[i]["description"], &desc)
		var got, want any
		json.Unmarshal(schema, &got)
		json.Unmarshal(listing.Tools[i]["inputSchema"], &want)
		if tool.Name != name || tool.Description != desc || !reflect.DeepEqual(got, want) {
			t.Errorf("tool %d: MCP %s %s\n/v1/tools %s %s", i, tool.Name, schema, name, listing.Tools[i]["inputSchema"])
		}
	}

	res, text := callTool(t, cs, tools.RunPython, map[string]any{"code": "import os; print(6*7, os.getcwd())"})
	var run mcpserver.RunResult
	b, _ := json.Marshal(res.StructuredContent)
	if res.IsError || !strings.HasPrefix(text, "exit 0 (exited) in ") || !strings.Contains(text, "42 /ws") ||
		json.Unmarshal(b, &run) != nil || run.Workspace == "" || string(run.Run.Result.Stdout) != "42 /ws\n" {
		t.Fatalf("run_python: %v %q %s", res.IsError, text, b)
	}
	// run_cell: this MCP session's interpreter keeps its state, in the same workspace.
	if res, text := callTool(t, cs, tools.RunCell, map[string]any{"code": "import os\nx = 6"}); res.IsError ||
		!strings.Contains(text, "a fresh interpreter") || !strings.Contains(text, "state: preserved") {
		t.Fatalf("run_cell: %q", text)
	}
	res, text = callTool(t, cs, tools.RunCell, map[string]any{"code": "x * 7, os.getcwd()"})
	var cell mcpserver.CellResult
	b, _ = json.Marshal(res.StructuredContent)
	if res.IsError || strings.Contains(text, "fresh") || !strings.Contains(text, "(42, '/ws')") ||
		json.Unmarshal(b, &cell) != nil || cell.Workspace != run.Workspace || cell.Cell.State != "preserved" || cell.Fresh {
		t.Fatalf("run_cell's second cell: %q %s", text, b)
	}
	if res, text := callTool(t, cs, tools.RunCell, map[string]any{"code": "x", "restart": true}); !res.IsError ||
		!strings.Contains(text, "a fresh interpreter") || !strings.Contains(text, "NameError") {
		t.Fatalf("run_cell after a restart: %q", text)
	}
	// The session's workspace keeps what a call wrote.
	callTool(t, cs, tools.WriteFile, map[string]any{"path": "data/a.csv", "content": "x,y\n1,2\n"})
	res, text = callTool(t, cs, tools.RunPython, map[string]any{"code": "print(open('data/a.csv').read().split()[1])"})
	if res.IsError || !strings.Contains(text, "1,2") {
		t.Fatalf("the file written before: %q", text)
	}
	callTool(t, cs, tools.WriteFile, map[string]any{"path": "job.py", "content": "import sys; print('args', sys.argv[1:])"})
	if res, text = callTool(t, cs, tools.RunPython, map[string]any{"path": "job.py", "args": []string{"a"}}); res.IsError || !strings.Contains(text, "args ['a']") {
		t.Fatalf("a workspace .py file: %q", text)
	}
	if res, text = callTool(t, cs, tools.ReadFile, map[string]any{"path": "data/a.csv"}); res.IsError || text != "x,y\n1,2\n" {
		t.Fatalf("read_file: %q", text)
	}
	if res, text = callTool(t, cs, tools.ListFiles, map[string]any{}); res.IsError || !strings.Contains(text, "data/a.csv") {
		t.Fatalf("list_files: %q", text)
	}
	// Output past what the text shows is clipped there, and kept whole on request.
	res, text = callTool(t, cs, tools.RunPython, map[string]any{"code": "print('x' * 40000 + 'END')", "save_output": "logs/big"})
	if res.IsError || !strings.Contains(text, "bytes cut ...]") || !strings.Contains(text, "logs/big.stdout") {
		t.Fatalf("save_output: %.300q", text)
	}
	if res, text = callTool(t, cs, tools.ReadFile, map[string]any{"path": "logs/big.stdout"}); res.IsError || len(text) != 40004 || !strings.HasSuffix(text, "END\n") {
		t.Fatalf("the saved output: %d bytes", len(text))
	}
	// A failing program is a tool error the agent can see, with its traceback.
	if res, text = callTool(t, cs, tools.RunPython, map[string]any{"code": "1/0"}); !res.IsError ||
		!strings.HasPrefix(text, "exit 1 (exited)") || !strings.Contains(text, "ZeroDivisionError") {
		t.Fatalf("1/0: %v %q", res.IsError, text)
	}
	// SQL: a read at once; a write held for an approver, with its approval id.
	callTool(t, cs, tools.RunPython, map[string]any{"code": "import sqlite3; c = sqlite3.connect('t.db'); c.execute('create table t (x)'); c.execute('insert into t values (7)'); c.commit()"})
	if res, text = callTool(t, cs, tools.RunSQL, map[string]any{"db": "t.db", "sql": "SELECT x * 6 FROM t"}); res.IsError || !strings.Contains(text, "[42]") {
		t.Fatalf("SQL read: %q", text)
	}
	if res, text = callTool(t, cs, tools.RunSQL, map[string]any{"db": "t.db", "sql": "DELETE FROM t"}); !res.IsError ||
		!strings.Contains(text, "approval_required") || !strings.Contains(text, "approval_id") {
		t.Fatalf("SQL write: %v %q", res.IsError, text)
	}
	// Another session of the same caller shares its workspace (and so does an agent
	// host that reconnects).
	if res, text = callTool(t, connectMCP(t, d, nil), tools.ReadFile, map[string]any{"path": "data/a.csv"}); res.IsError || text != "x,y\n1,2\n" {
		t.Fatalf("a second session: %q", text)
	}
	// Arguments past their bounds never reach the daemon.
	if res, text = callTool(t, cs, tools.RunPython, map[string]any{"code": strings.Repeat("x", tools.MaxCodeBytes+1)}); !res.IsError {
		t.Fatalf("oversized code: %q", text)
	}
	if res, text = callTool(t, cs, tools.RunPython, map[string]any{"code": "1", "timeout_ms": 99999999}); !res.IsError {
		t.Fatalf("timeout past the bound: %q", text)
	}
	if _, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "no_such_tool", Arguments: map[string]any{}}); err == nil {
		t.Fatal("an unknown tool was called")
	}
	// Every call was an API request of this caller's, in the audit log.
	evs, _ := d.store.Events(t.Context(), d.since, "", 1000)
	kinds := map[string]int{}
	for _, e := range evs {
		kinds[string(e.Kind)]++
		if e.UID != os.Getuid() {
			t.Errorf("%s by uid %d", e.Kind, e.UID)
		}
	}
	if kinds["run.finished"] != 6 || kinds["run.refused"] != 0 || kinds["workspace.created"] != 1 || kinds["approval.requested"] != 1 {
		t.Errorf("audit: %v", kinds)
	}
	// The MCP session's end (the client's DELETE) ends its interpreter before the
	// client has its answer.
	if resp, b := d.do(t, "GET", "/v1/sessions", ""); !strings.Contains(string(b), `"id"`) {
		t.Fatalf("run_cell's interpreter: %d %s", resp.StatusCode, b)
	}
	cs.Close()
	if resp, b := d.do(t, "GET", "/v1/sessions", ""); resp.StatusCode != 200 || !strings.Contains(string(b), `"sessions":[]`) {
		t.Fatalf("the interpreter outlived its MCP session: %s", b)
	}
}

// While the kill switch is on the tools are not offered: the list is empty, the
// client is told it changed, and a call is refused with the reason; switched back,
// they return.
func TestMCPToolsFollowTheKillSwitch(t *testing.T) {
	d := start(t, setup{})
	changed := make(chan struct{}, 1)
	cs := connectMCP(t, d, changed)
	if l, err := cs.ListTools(t.Context(), nil); err != nil || len(l.Tools) != 6 {
		t.Fatalf("%+v %v", l, err)
	}
	d.reload(func(c *config.Config) { c.Disabled = true })
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no tools/list_changed after the kill switch")
	}
	if l, err := cs.ListTools(t.Context(), nil); err != nil || len(l.Tools) != 0 {
		t.Fatalf("with the kill switch on: %+v %v", l, err)
	}
	if res, text := callTool(t, cs, tools.RunPython, map[string]any{"code": "1"}); !res.IsError || !strings.Contains(text, "kill switch") {
		t.Fatalf("a call with the kill switch on: %q", text)
	}
	resp, body := d.do(t, "GET", "/v1/tools", "")
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"available":false`)) || !bytes.Contains(body, []byte("kill switch")) {
		t.Fatalf("/v1/tools: %s", body)
	}
	d.reload(func(c *config.Config) { c.Disabled = false })
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no tools/list_changed after the kill switch went off")
	}
	if l, err := cs.ListTools(t.Context(), nil); err != nil || len(l.Tools) != 6 {
		t.Fatalf("after: %+v %v", l, err)
	}
}

// An MCP session is its opener's: another caller naming it gets 404; a body that is
// not JSON-RPC gets a protocol error, and the daemon goes on.
func TestMCPSessionsAreTheCallers(t *testing.T) {
	d := start(t, setup{access: &api.Access{Tokens: api.Tokens{aliceToken, bobToken}}})
	base := "http://" + d.serveTCP(t)
	post := func(token, session, body string) *http.Response {
		req, _ := http.NewRequest("POST", base+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	resp := post(aliceSecret, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || session == "" {
		t.Fatalf("initialize: %d %v", resp.StatusCode, resp.Header)
	}
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	if resp := post(bobSecret, session, list); resp.StatusCode != 404 {
		t.Fatalf("bob on alice's session: %d", resp.StatusCode)
	}
	if resp := post(aliceSecret, session, `{"jsonrpc":"2.0","id":3,`); resp.StatusCode != 400 {
		t.Fatalf("malformed JSON-RPC: %d", resp.StatusCode)
	}
	if resp := post(aliceSecret, session, list); resp.StatusCode != 200 {
		t.Fatalf("alice on her session: %d", resp.StatusCode)
	}
	// What the SDK would decode at great cost, or take other than the API does, is
	// refused before it: a batch, a body of very many values, a member given twice.
	for body, want := range map[string]int{
		"[" + list + "," + list + "]": 400,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"run_sql","arguments":{"db":"t.db","sql":"SELECT 1","params":[` +
			strings.Repeat("{},", 60_000) + `{}]}}}`: 413,
		`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"print(1)","code":"print(3)"}}}`: 400,
		`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"print('\ud800')"}}}`:            400,
		`{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"x":"` + strings.Repeat("x", 2<<20) + `"}}`:                              413,
		list + "garbage": 400,
		list + list:      400,
		"{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"tools/list\",\"params\":{\"x\":\"\xff\"}}": 400,
	} {
		if resp := post(aliceSecret, session, body); resp.StatusCode != want {
			t.Errorf("%.80s: %d, want %d", body, resp.StatusCode, want)
		}
	}
	// A caller's sessions are bounded, even when opened all at once; another
	// caller's are not counted.
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	statuses := make(chan int, 40)
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); statuses <- post(bobSecret, "", initialize).StatusCode }()
	}
	wg.Wait()
	close(statuses)
	opened := 0
	for st := range statuses {
		if st == 200 {
			opened++
		} else if st != 429 {
			t.Errorf("bob's session: %d", st)
		}
	}
	if opened != 16 {
		t.Fatalf("bob opened %d sessions at once, at most 16", opened)
	}
	resp = post(bobSecret, "", initialize)
	var p wire.Problem
	json.NewDecoder(resp.Body).Decode(&p)
	if resp.StatusCode != 429 || p.Code != wire.CodeSessionLimit || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("bob's 17th session: %d %+v", resp.StatusCode, p)
	}
	if resp := post(aliceSecret, "", initialize); resp.StatusCode != 200 {
		t.Fatalf("alice's second session: %d", resp.StatusCode)
	}
	// Each refusal is in the audit log, with its caller.
	evs, _ := d.store.Events(t.Context(), d.since, "", 1000)
	refused := map[string]int{}
	for _, e := range evs {
		if e.Kind == "mcp.refused" {
			var m struct{ Code, Token string }
			json.Unmarshal(e.Detail, &m)
			refused[m.Token+" "+m.Code]++
		}
	}
	if refused["bob not_found"] != 1 || refused["bob session_limit"] != 25 || refused["alice bad_request"] != 1 ||
		refused["alice body_too_large"] != 2 || refused["alice invalid_json"] != 5 {
		t.Fatalf("mcp.refused: %v", refused)
	}
}

// elicitingClient connects with a client that answers every elicitation with action
// (and records what it was shown); action "" makes a client that cannot be asked.
func elicitingClient(t *testing.T, d *daemon, action string, shown *[]string) *mcp.ClientSession {
	t.Helper()
	opts := &mcp.ClientOptions{}
	if action != "" {
		opts.ElicitationHandler = func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			*shown = append(*shown, req.Params.Message)
			return &mcp.ElicitResult{Action: action, Content: map[string]any{}}, nil
		}
	}
	return connectWith(t, d, opts)
}

// Where policy holds runs for approval, the person at an MCP client that can be
// asked sees the exact code and confirms or declines it there; a client that cannot
// be asked gets the approval id for an approver; where policy does not let a
// caller's own confirmation count, accepting is not enough. Each step is audited.
func TestMCPRunConfirmedAtTheClient(t *testing.T) {
	d := start(t, setup{runsHeld: true, elicitation: []string{"socket"}})
	var shown []string
	cs := elicitingClient(t, d, "accept", &shown)
	res, text := callTool(t, cs, tools.RunPython, map[string]any{"code": "print(6*7)"})
	if res.IsError || !strings.Contains(text, "\n42\n") || len(shown) != 1 || !strings.Contains(shown[0], "print(6*7)") {
		t.Fatalf("accepted: %q, shown %q", text, shown)
	}
	cs = elicitingClient(t, d, "decline", &shown)
	if res, text = callTool(t, cs, tools.RunPython, map[string]any{"code": "print('declined')"}); !res.IsError || !strings.Contains(text, "declined") {
		t.Fatalf("declined: %q", text)
	}
	cs = elicitingClient(t, d, "", nil)
	if res, text = callTool(t, cs, tools.RunPython, map[string]any{"code": "print(1)"}); !res.IsError ||
		!strings.Contains(text, "approval_required") || !strings.Contains(text, "approval_id") {
		t.Fatalf("no elicitation: %q", text)
	}
	evs, _ := d.store.Events(t.Context(), d.since, "", 1000)
	kinds := map[string]int{}
	var elicited int
	for _, e := range evs {
		kinds[string(e.Kind)]++
		if e.Kind == "approval.decided" && bytes.Contains(e.Detail, []byte(`"elicited":true`)) {
			elicited++
		}
	}
	if kinds["approval.requested"] != 3 || elicited != 2 || kinds["approval.redeemed"] != 1 || kinds["run.finished"] != 1 {
		t.Fatalf("audit: %v, %d elicited", kinds, elicited)
	}
}

func TestMCPConfirmationThatPolicyDoesNotCount(t *testing.T) {
	d := start(t, setup{runsHeld: true,
		access: &api.Access{Runners: api.Principals{UIDs: map[int]bool{os.Getuid(): true}}, Tokens: api.Tokens{approverToken}}})
	var shown []string
	cs := elicitingClient(t, d, "accept", &shown)
	res, text := callTool(t, cs, tools.RunPython, map[string]any{"code": "print(6*7)"})
	if !res.IsError || !strings.Contains(text, "approval_required") || len(shown) != 0 {
		t.Fatalf("the person was asked though it would not count: %q, shown %q", text, shown)
	}
	// The same call again waits on the same approval; an approver's approval,
	// given with the call, runs it.
	id := text[strings.LastIndex(text, "approval_id ")+len("approval_id "):]
	id = id[:strings.IndexByte(id, ']')]
	if _, again := callTool(t, cs, tools.RunPython, map[string]any{"code": "print(6*7)"}); !strings.Contains(again, id) {
		t.Fatalf("asked again: %q, not %s", again, id)
	}
	if st := approveOverTCP(t, "http://"+d.serveTCP(t), id); st != 200 {
		t.Fatalf("approve %s: %d", id, st)
	}
	if res, text = callTool(t, cs, tools.RunPython, map[string]any{"code": "print(6*7)", "approval": id}); res.IsError || !strings.Contains(text, "\n42\n") {
		t.Fatalf("with the approval: %q", text)
	}
	// Spent: once only.
	if res, text = callTool(t, cs, tools.RunPython, map[string]any{"code": "print(6*7)", "approval": id}); !res.IsError || !strings.Contains(text, "approval_invalid") {
		t.Fatalf("replayed: %q", text)
	}
}

// A path run held for approval runs the bytes that were approved: the file as the
// daemon read it when the approval was asked for. Changed since, it needs another.
func TestApprovedPathRunsTheApprovedBytes(t *testing.T) {
	d := start(t, setup{runsHeld: true,
		access: &api.Access{Runners: api.Principals{UIDs: map[int]bool{os.Getuid(): true}}, Tokens: api.Tokens{approverToken}}})
	base := "http://" + d.serveTCP(t)
	ws := d.newWorkspace(t)
	put := func(src string) {
		if resp, body := d.do(t, "PUT", "/v1/workspaces/"+ws+"/files/a.py", src); resp.StatusCode != 201 {
			t.Fatalf("upload: %d %s", resp.StatusCode, body)
		}
	}
	put("print('approved')")
	req := `{"workspace":"` + ws + `","path":"a.py"}`
	resp, body := d.do(t, "POST", "/v1/runs", req)
	var held struct {
		Program    string `json:"program"`
		ApprovalID string `json:"approval_id"`
	}
	if json.Unmarshal(body, &held); resp.StatusCode != 403 || held.Program != "print('approved')" || held.ApprovalID == "" {
		t.Fatalf("held: %d %s", resp.StatusCode, body)
	}
	// The same request while it waits: the same approval.
	if _, again := d.do(t, "POST", "/v1/runs", req); !bytes.Contains(again, []byte(held.ApprovalID)) {
		t.Fatalf("asked again: %s", again)
	}
	if st := approveOverTCP(t, base, held.ApprovalID); st != 200 {
		t.Fatalf("approve: %d", st)
	}
	approved := `{"workspace":"` + ws + `","path":"a.py","approval":"` + held.ApprovalID + `"}`
	put("print('changed')")
	resp, body = d.do(t, "POST", "/v1/runs", approved)
	wantProblem(t, resp, body, 409, wire.CodeApprovalInvalid)
	put("print('approved')")
	if resp, body = d.do(t, "POST", "/v1/runs", approved); resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"stdout":"approved\n"`)) {
		t.Fatalf("the approved bytes: %d %s", resp.StatusCode, body)
	}
}
