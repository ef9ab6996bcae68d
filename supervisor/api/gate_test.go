package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/approvals"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/tools"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// held is the approval_required refusal of code held for approval.
type held struct {
	Code           string `json:"code"`
	ApprovalID     string `json:"approval_id"`
	Kind           string `json:"kind"`
	Program        string `json:"program"`
	Session        string `json:"session"`
	WorkspaceFiles []struct {
		Path   string `json:"path"`
		SHA256 string `json:"sha256"`
	} `json:"workspace_files"`
}

func (d *daemon) held(t *testing.T, path, body string) held {
	t.Helper()
	resp, b := d.do(t, "POST", path, body)
	var h held
	if json.Unmarshal(b, &h); resp.StatusCode != 403 || h.Code != wire.CodeApprovalRequired || h.ApprovalID == "" {
		t.Fatalf("%s %s: not held: %d %s", path, body, resp.StatusCode, b)
	}
	return h
}

func heldDaemon(t *testing.T) (*daemon, string) {
	d := start(t, setup{runsHeld: true,
		access: &api.Access{Runners: api.Principals{UIDs: map[int]bool{os.Getuid(): true}}, Tokens: api.Tokens{approverToken}}})
	return d, "http://" + d.serveTCP(t)
}

// An approval of code binds the workspace's files, those the program could import among them:
// a module planted after approval (here one named like the standard library's json,
// which the workspace's place first on sys.path would let shadow it, and the
// workspace's own helper module changed) voids it, with the files named; as they
// were, the approved code runs with the approved modules. While approved code runs,
// its workspace is its own: an upload waits for its end (409 workspace_busy). The
// same for a session's cell.
func TestApprovalBindsTheWorkspace(t *testing.T) {
	d, base := heldDaemon(t)
	ws := d.newWorkspace(t)
	put := func(name, src string) {
		t.Helper()
		if resp, body := d.do(t, "PUT", "/v1/workspaces/"+ws+"/files/"+name, src); resp.StatusCode != 201 {
			t.Fatalf("upload %s: %d %s", name, resp.StatusCode, body)
		}
	}
	put("helper.py", "def hello(): return 'approved helper'")
	put("data.csv", "a,b\n1,2\n")
	req := `{"workspace":"` + ws + `","code":"import json, helper\nprint(helper.hello(), json.dumps([1]))"}`
	h := d.held(t, "/v1/runs", req)
	if len(h.WorkspaceFiles) != 2 || h.WorkspaceFiles[0].Path != "data.csv" || h.WorkspaceFiles[1].Path != "helper.py" || h.Kind != "run" {
		t.Fatalf("the files shown to the approver: %+v", h)
	}
	if st := approveOverTCP(t, base, h.ApprovalID); st != 200 {
		t.Fatalf("approve: %d", st)
	}
	approved := strings.Replace(req, `{`, `{"approval":"`+h.ApprovalID+`",`, 1)
	put("json.py", "print('planted'); open('/ws/pwned', 'w').write('x')\ndumps = str")
	resp, body := d.do(t, "POST", "/v1/runs", approved)
	wantProblem(t, resp, body, 409, wire.CodeApprovalInvalid)
	if !bytes.Contains(body, []byte("json.py (added)")) {
		t.Fatalf("the refusal does not name the planted file: %s", body)
	}
	if resp, _ := d.do(t, "DELETE", "/v1/workspaces/"+ws+"/files/json.py", ""); resp.StatusCode != 204 {
		t.Fatal("remove json.py")
	}
	put("helper.py", "def hello(): return 'changed helper'")
	resp, body = d.do(t, "POST", "/v1/runs", approved)
	wantProblem(t, resp, body, 409, wire.CodeApprovalInvalid)
	if !bytes.Contains(body, []byte("helper.py (changed)")) {
		t.Fatalf("the refusal does not name the changed file: %s", body)
	}
	put("helper.py", "def hello(): return 'approved helper'")
	// Any file could be what runs (an earlier cell may have put a zip of any name
	// on sys.path): the tree is bound whole.
	put("data.csv", "a,b\n3,4\n")
	resp, body = d.do(t, "POST", "/v1/runs", approved)
	if resp.StatusCode != 409 || !bytes.Contains(body, []byte("data.csv (changed)")) {
		t.Fatalf("a changed data file: %d %s", resp.StatusCode, body)
	}
	put("data.csv", "a,b\n1,2\n")
	resp, body = d.do(t, "POST", "/v1/runs", approved)
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"stdout":"approved helper [1]\n"`)) {
		t.Fatalf("the approved code with the approved files: %d %s", resp.StatusCode, body)
	}
	if _, err := os.Stat(filepath.Join(d.workspaces, ws, "files", "pwned")); err == nil {
		t.Fatal("the planted module ran")
	}

	// Approved code has its workspace to itself while it runs.
	slow := `{"workspace":"` + ws + `","code":"import time\ntime.sleep(2)\nprint('slept')"}`
	h = d.held(t, "/v1/runs", slow)
	if st := approveOverTCP(t, base, h.ApprovalID); st != 200 {
		t.Fatalf("approve: %d", st)
	}
	resp, body = d.do(t, "POST", "/v1/runs", strings.Replace(slow, `{`, `{"wait":false,"approval":"`+h.ApprovalID+`",`, 1))
	var v wire.View
	if json.Unmarshal(body, &v); resp.StatusCode != 202 {
		t.Fatalf("async approved run: %d %s", resp.StatusCode, body)
	}
	resp, body = d.do(t, "PUT", "/v1/workspaces/"+ws+"/files/json.py", "dumps = str")
	wantProblem(t, resp, body, 409, wire.CodeWorkspaceBusy)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, b := d.do(t, "GET", "/v1/runs/"+v.ID, "")
		if json.Unmarshal(b, &v); v.State == wire.Done || time.Now().After(deadline) {
			break
		}
	}
	if v.Result == nil || string(v.Result.Stdout) != "slept\n" {
		t.Fatalf("the approved slow run: %+v", v)
	}
	put("json.py", "dumps = str") // free again once it ended

	// A cell: the same binding, in its session's workspace.
	id := d.openSession(t, `{"workspace":"`+ws+`"}`)
	cell := `{"code":"import helper\nhelper.hello()"}`
	h = d.held(t, "/v1/sessions/"+id+"/cells", cell)
	// The tree as it is (the approved run's import of helper cached no bytecode).
	var names []string
	for _, f := range h.WorkspaceFiles {
		names = append(names, f.Path)
	}
	if h.Kind != "cell" || h.Session != id || h.Program != "import helper\nhelper.hello()" ||
		!slices.Equal(names, []string{"data.csv", "helper.py", "json.py"}) {
		t.Fatalf("the cell shown to the approver: %+v", h)
	}
	if st := approveOverTCP(t, base, h.ApprovalID); st != 200 {
		t.Fatalf("approve: %d", st)
	}
	approvedCell := `{"approval":"` + h.ApprovalID + `","code":"import helper\nhelper.hello()"}`
	put("helper.py", "def hello(): return 'changed helper'")
	st, _, body := d.cell(t, id, approvedCell)
	if st != 409 || !bytes.Contains(body, []byte("helper.py (changed)")) {
		t.Fatalf("a changed module voids a cell's approval: %d %s", st, body)
	}
	put("helper.py", "def hello(): return 'approved helper'")
	st, a, body := d.cell(t, id, approvedCell)
	if st != 200 || a.Value != "'approved helper'" {
		t.Fatalf("the approved cell: %d %s", st, body)
	}
	// Spent by that cell: not again, not by a run.
	if st, _, body = d.cell(t, id, approvedCell); st != 409 || !bytes.Contains(body, []byte(wire.CodeApprovalInvalid)) {
		t.Fatalf("the cell's approval replayed: %d %s", st, body)
	}
}

// Every route and MCP tool that executes a caller's code passes the one gate: with
// runs held for approval, each is held (403 approval_required, an
// approval.requested record), and those that execute none are listed as such. A
// route or tool this test does not list fails it: a new one must say which it is.
func TestEveryCodePathIsGated(t *testing.T) {
	d, _ := heldDaemon(t)
	ws := d.newWorkspace(t)
	session := d.openSession(t, `{"workspace":"`+ws+`"}`)
	// The routes that execute code, each with a request that would run some.
	code := map[string]func() (string, string){
		"POST /v1/runs":               func() (string, string) { return "/v1/runs", `{"code":"print(1)"}` },
		"POST /v1/sessions/:id/cells": func() (string, string) { return "/v1/sessions/" + session + "/cells", `{"code":"x = 1"}` },
	}
	noCode := []string{
		"GET /livez", "GET /healthz", "GET /readyz", "GET /metrics", "GET /v1/openapi.json", "GET /v1/info",
		"GET /v1/runs/:id", "DELETE /v1/runs/:id", "GET /v1/runs/:id/events", "GET /v1/audit",
		"POST /v1/workspaces", "GET /v1/workspaces/:id", "DELETE /v1/workspaces/:id",
		"PUT /v1/workspaces/:id/files/*", "GET /v1/workspaces/:id/files/*", "DELETE /v1/workspaces/:id/files/*",
		// A statement is the SQL tool's own program; a write is held as sql.write.
		"POST /v1/sql",
		// A session's interpreter runs no caller code until a cell; a fork's cells
		// each pass the gate.
		"POST /v1/sessions", "GET /v1/sessions", "GET /v1/sessions/:id", "DELETE /v1/sessions/:id",
		"POST /v1/sessions/:id/fork",
		"GET /v1/tools", "GET /v1/approvals", "GET /v1/approvals/:id", "POST /v1/approvals/:id",
		"POST /v1/approvals/:id/confirm",
		// MCP's tools call this API in process: each is checked below.
		"POST /mcp", "GET /mcp", "DELETE /mcp",
		// E2B's protocol calls it in process too: its sandbox is a session, its
		// files the workspace's, its execute a cell (checked below).
		"POST /e2b/v2/sandboxes", "POST /e2b/sandboxes", "GET /e2b/sandboxes/:id", "DELETE /e2b/sandboxes/:id",
		"GET /e2b/sandbox/health", "POST /e2b/sandbox/files", "GET /e2b/sandbox/files", "POST /e2b/sandbox/*",
		"GET /e2b/sandboxes", "GET /e2b/v2/sandboxes", "POST /e2b/sandboxes/:id/connect", "POST /e2b/v2/sandboxes/:id/connect",
		"POST /e2b/sandboxes/:id/timeout", "GET /e2b/*", "POST /e2b/*", "DELETE /e2b/*",
	}
	code["POST /e2b/sandbox/execute"] = nil
	for _, r := range d.server.Routes() {
		if _, ok := code[r]; !ok && !slices.Contains(noCode, r) {
			t.Errorf("route %s: say whether it executes code (and gate it if it does)", r)
		}
	}
	requested := func() int {
		evs, err := d.store.Events(t.Context(), d.since, "", 10000)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range evs {
			if e.Kind == store.ApprovalRequested {
				n++
			}
		}
		return n
	}
	for r, req := range code {
		if req == nil {
			continue
		}
		before := requested()
		path, body := req()
		d.held(t, path, body)
		if requested() != before+1 {
			t.Errorf("%s: held with no approval.requested record", r)
		}
	}
	// E2B's execute: its cell is held, as its own protocol can say (403, the code).
	resp, b := d.do(t, "POST", "/e2b/v2/sandboxes", `{}`)
	var sb struct{ SandboxID, EnvdAccessToken string }
	if json.Unmarshal(b, &sb); resp.StatusCode != 201 || sb.EnvdAccessToken == "" {
		t.Fatalf("an E2B sandbox: %d %s", resp.StatusCode, b)
	}
	before := requested()
	resp, b = d.do(t, "POST", "/e2b/sandbox/execute", `{"code":"x = 1"}`, "X-Access-Token", sb.EnvdAccessToken,
		"E2b-Sandbox-Id", sb.SandboxID)
	if resp.StatusCode != 403 || !bytes.Contains(b, []byte(wire.CodeApprovalRequired)) || requested() != before+1 {
		t.Errorf("E2B's execute ran without approval: %d %s", resp.StatusCode, b)
	}
	if resp, b = d.do(t, "DELETE", "/e2b/sandboxes/"+sb.SandboxID, ""); resp.StatusCode != 204 {
		t.Fatalf("killing the E2B sandbox: %d %s", resp.StatusCode, b)
	}

	// The MCP tools.
	codeTools := map[string]map[string]any{
		tools.RunPython: {"code": "print(1)"},
		tools.RunCell:   {"code": "x = 1"},
	}
	noCodeTools := []string{tools.RunSQL, tools.ListFiles, tools.ReadFile, tools.WriteFile}
	cs := connectMCP(t, d, nil)
	list, err := cs.ListTools(t.Context(), &mcp.ListToolsParams{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range list.Tools {
		if _, ok := codeTools[tool.Name]; !ok && !slices.Contains(noCodeTools, tool.Name) {
			t.Errorf("tool %s: say whether it executes code (and gate it if it does)", tool.Name)
		}
	}
	for name, args := range codeTools {
		before := requested()
		res, text := callTool(t, cs, name, args)
		if !res.IsError || !strings.Contains(text, wire.CodeApprovalRequired) || requested() != before+1 {
			t.Errorf("tool %s ran without approval: %q", name, text)
		}
	}
	// Nothing ran: no run admitted, no cell recorded.
	evs, _ := d.store.Events(t.Context(), d.since, "", 10000)
	for _, e := range evs {
		if e.Kind == store.SessionCell || e.Kind == store.RunAdmitted {
			t.Errorf("code ran without approval: %s %s", e.Kind, e.Detail)
		}
	}
}

// A cell held for approval and confirmed by the person at an MCP client that can
// be asked runs in the session it was held for, shown its code.
func TestMCPCellConfirmedAtTheClient(t *testing.T) {
	d := start(t, setup{runsHeld: true, elicitation: []string{"socket"}})
	var shown []string
	cs := elicitingClient(t, d, "accept", &shown)
	res, text := callTool(t, cs, tools.RunCell, map[string]any{"code": "x = 6*7\nx"})
	if res.IsError || !strings.Contains(text, "42") || len(shown) != 1 || !strings.Contains(shown[0], "x = 6*7") {
		t.Fatalf("accepted: %q, shown %q", text, shown)
	}
	res, text = callTool(t, cs, tools.RunCell, map[string]any{"code": "x + 1"})
	if res.IsError || !strings.Contains(text, "43") || len(shown) != 2 {
		t.Fatalf("the session's state after a confirmed cell: %q, shown %q", text, shown)
	}
}

// A module of the workspace runs from its source, never from bytecode: bytecode
// cannot be reviewed, and a cached one marked "unchecked" would run whatever its
// source says (an approval binds the source). The guest writes no __pycache__ in
// the workspace, and a .pyc there is no module.
func TestWorkspaceModulesRunFromSource(t *testing.T) {
	d := start(t, setup{})
	ws := d.newWorkspace(t)
	run := func(code string) wire.View {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"workspace": ws, "code": code})
		v := d.run(t, string(b))
		if v.Result == nil || v.Result.ExitCode != 0 {
			t.Fatalf("%q: %+v", code, v.Result)
		}
		return v
	}
	// Bytecode made in the guest by CPython 3.13 itself: the cache of helper.py,
	// unchecked (used whatever the source), and a module with no source.
	run(`import os, py_compile
open("evil.py", "w").write("x = 'bytecode ran'\n")
for cfile in ("__pycache__/helper.cpython-313.pyc", "nosource.pyc"):
    py_compile.compile("evil.py", cfile=cfile, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH, doraise=True)
os.remove("evil.py")`)
	if resp, b := d.do(t, "PUT", "/v1/workspaces/"+ws+"/files/helper.py", "x = 'source ran'\n"); resp.StatusCode != 201 {
		t.Fatalf("upload: %d %s", resp.StatusCode, b)
	}
	// Also by another spelling of /ws ("//ws" is a path POSIX keeps apart).
	v := run(`import sys; sys.path.insert(0, "//ws")
import helper, os, importlib.util
print(helper.x)
print(importlib.util.find_spec("nosource"))
import json, sys
print(sorted(os.listdir("__pycache__")))`)
	if got := string(v.Result.Stdout); got != "source ran\nNone\n['helper.cpython-313.pyc']\n" {
		t.Fatalf("imports from the workspace: %q", got)
	}
}

// What the gate can refuse without the workspace's files it refuses before reading
// them (hashing costs up to workspaces.max_bytes): a caller with approvals.MaxPending
// approvals waiting, and an approval that is not this caller's or not approved,
// are refused as such, not with what reading the files would have said (here the
// symbolic link planted from outside, 409 unsafe_file). Before, each such request
// hashed the whole workspace first.
func TestGateRefusesBeforeReadingTheWorkspace(t *testing.T) {
	d, base := heldDaemon(t)
	ws := d.newWorkspace(t)
	var first held
	for i := range approvals.MaxPending {
		h := d.held(t, "/v1/runs", fmt.Sprintf(`{"workspace":%q,"code":"print(%d)"}`, ws, i))
		if i == 0 {
			first = h
		}
	}
	// At the cap, a waiting request sent again gets its approval, as below it.
	if again := d.held(t, "/v1/runs", fmt.Sprintf(`{"workspace":%q,"code":"print(0)"}`, ws)); again.ApprovalID != first.ApprovalID {
		t.Fatalf("the same request again at the cap: %s, first %s", again.ApprovalID, first.ApprovalID)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(d.workspaces, ws, "files", "link")); err != nil {
		t.Fatal(err)
	}
	resp, body := d.do(t, "POST", "/v1/runs", fmt.Sprintf(`{"workspace":%q,"code":"print('one more')"}`, ws))
	wantProblem(t, resp, body, 429, wire.CodeTooManyPending)
	for id, want := range map[string]struct {
		status int
		code   string
	}{"01JAAAAAAAAAAAAAAAAAAAAAAA": {404, wire.CodeNotFound}, first.ApprovalID: {409, wire.CodeApprovalInvalid}} {
		resp, body := d.do(t, "POST", "/v1/runs", fmt.Sprintf(`{"workspace":%q,"code":"print(0)","approval":%q}`, ws, id))
		wantProblem(t, resp, body, want.status, want.code)
		if want.code == wire.CodeApprovalInvalid && !bytes.Contains(body, []byte("it is pending")) {
			t.Fatalf("a pending approval presented: %s", body)
		}
	}
	// A request that passes them is decided by the files: approved, the link is
	// refused.
	if st := approveOverTCP(t, base, first.ApprovalID); st != 200 {
		t.Fatalf("approve: %d", st)
	}
	resp, body = d.do(t, "POST", "/v1/runs", fmt.Sprintf(`{"workspace":%q,"code":"print(0)","approval":%q}`, ws, first.ApprovalID))
	wantProblem(t, resp, body, 409, wire.CodeUnsafeFile)
}

// A cell that can never run (its code over a session's frame) is refused as it
// is, before it is held for approval: before, it was held, approved, and refused
// only once its approval was spent.
func TestCellThatCannotRunIsNotHeld(t *testing.T) {
	d, _ := heldDaemon(t)
	id := d.openSession(t, `{}`)
	body, _ := json.Marshal(map[string]string{"code": "#" + strings.Repeat("x", 1<<20-3000)})
	resp, b := d.do(t, "POST", "/v1/sessions/"+id+"/cells", string(body))
	wantProblem(t, resp, b, 400, wire.CodeBadRequest)
	if !bytes.Contains(b, []byte("a cell's code, stdin and environment are")) {
		t.Fatalf("%s", b)
	}
}
