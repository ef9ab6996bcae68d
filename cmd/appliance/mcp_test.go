package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandcell/sandcell/bundle/bundletest"
	sandcellclient "github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/supervisor/api"
)

// mcpDaemon is `sandcell serve` with a TCP listener and one runner token, for the
// MCP clients.
type mcpDaemon struct {
	sock, url, token string
	// approverToken and otherToken are the secrets of an approver's token and of a
	// second runner's.
	approverToken, otherToken string
	setDisabled               func(bool)
	stop                      func() // SIGTERM, and wait for the end
}

func startMCPDaemon(t *testing.T, extra ...string) *mcpDaemon {
	t.Helper()
	dir := t.TempDir()
	d := &mcpDaemon{sock: filepath.Join(dir, "s.sock")}
	secret, tok := api.NewToken("agent", []api.Role{api.RoleRunner})
	approverSecret, approverTok := api.NewToken("approver", []api.Role{api.RoleApprover})
	otherSecret, otherTok := api.NewToken("other", []api.Role{api.RoleRunner})
	d.token, d.approverToken, d.otherToken = secret, approverSecret, otherSecret
	var tokens bytes.Buffer
	toml.NewEncoder(&tokens).Encode(map[string]any{"token": []api.Token{tok, approverTok, otherTok}})
	tokensFile := filepath.Join(dir, "tokens.toml")
	if err := os.WriteFile(tokensFile, tokens.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	d.url = "http://" + addr + "/mcp"
	bundleDir := bundletest.Dir(t)
	uid := strconv.Itoa(os.Getuid())
	conf := filepath.Join(dir, "sandcell.toml")
	write := func(disabled bool) {
		s := "disabled = " + strconv.FormatBool(disabled) + "\n[bundle]\ndir = \"" + bundleDir + "\"\ncache_dir = \"" + bundleDir +
			"\"\n[tcp]\nlisten = \"" + addr + "\"\ntokens_file = \"" + tokensFile + "\"\n[access]\nrunners = [\"" + uid +
			"\"]\napprovers = [\"" + uid + "\"]\nadmins = [\"" + uid + "\"]\n" + strings.Join(extra, "\n")
		if err := os.WriteFile(conf, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(false)
	cmd := cliCmd(t, "serve", "--config", conf, "--socket", d.sock, "--state-dir", filepath.Join(dir, "state"))
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	waitReady(t, sandcellclient.HTTP(d.sock), logs.String)
	d.stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}
	d.setDisabled = func(on bool) {
		write(on)
		cmd.Process.Signal(syscall.SIGHUP)
	}
	return d
}

// `sandcell mcp` over stdio, with the official Go SDK's client: the tools, a run, and
// their absence while the kill switch is on.
func TestMCPStdio(t *testing.T) {
	d := startMCPDaemon(t)
	changed := make(chan struct{}, 16)
	c := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case changed <- struct{}{}:
			default:
			}
		}})
	cmd := cliCmd(t, "mcp", "--socket", d.sock)
	cmd.Stderr = os.Stderr
	cs, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if l, err := cs.ListTools(t.Context(), nil); err != nil || len(l.Tools) != 6 {
		t.Fatalf("tools: %+v %v", l, err)
	}
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print(6*7)"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "\n42\n") {
		t.Fatalf("run_python: %+v %v", res, err)
	}
	// The tools' arrival sent notifications too, and they may still be on their way:
	// after the kill switch, some notification is followed by an empty list.
	d.setDisabled(true)
	deadline := time.After(10 * time.Second)
	for n := -1; n != 0; {
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no tools/list_changed followed by an empty list after the kill switch (%d tools)", n)
		}
		l, err := cs.ListTools(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		n = len(l.Tools)
	}
	// The daemon gone: a call is refused, and `sandcell mcp` stays up to say why.
	d.setDisabled(false)
	d.stop()
	if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1"}}); err != nil ||
		!res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "cannot be reached") {
		t.Fatalf("a call with the daemon gone: %+v %v", res, err)
	}
	if l, err := cs.ListTools(t.Context(), nil); err != nil || len(l.Tools) != 0 {
		t.Fatalf("tools with the daemon gone: %+v %v", l, err)
	}
}

// The official TypeScript SDK's client (@modelcontextprotocol/sdk from npm, pinned
// by test/mcp-client/package-lock.json) over stdio and over streamable HTTP: see
// test/mcp-client/client.mjs for what it checks.
func TestMCPWithTheTypeScriptSDK(t *testing.T) {
	dir, err := filepath.Abs("../../test/mcp-client")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the TypeScript SDK is not installed (make mcp-client, as make test does): %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is required (make mcp-client installs it): %v", err)
	}
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			d := startMCPDaemon(t)
			cmd := exec.Command(node, "client.mjs")
			cmd.Dir = dir
			if mode == "http" {
				cmd.Env = append(os.Environ(), "SANDCELL_MCP_URL="+d.url, "SANDCELL_MCP_TOKEN="+d.token)
			} else {
				mcpCmd := cliCmd(t, "mcp", "--socket", d.sock)
				env := map[string]string{}
				for _, kv := range mcpCmd.Env {
					if k, v, ok := strings.Cut(kv, "="); ok {
						env[k] = v
					}
				}
				args, _ := json.Marshal(mcpCmd.Args[1:])
				envJSON, _ := json.Marshal(env)
				cmd.Env = append(os.Environ(), "SANDCELL_MCP_COMMAND="+mcpCmd.Path, "SANDCELL_MCP_ARGS="+string(args),
					"SANDCELL_MCP_ENV="+string(envJSON))
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			lines := bufio.NewScanner(out)
			var seen []string
			for lines.Scan() {
				seen = append(seen, lines.Text())
				if lines.Text() == "waiting for the kill switch" {
					d.setDisabled(true)
				}
			}
			if err := cmd.Wait(); err != nil || len(seen) == 0 || seen[len(seen)-1] != "ok" {
				t.Fatalf("%v\nstdout: %s\nstderr: %s", err, strings.Join(seen, "\n"), stderr.String())
			}
		})
	}
	// Runs held for approval, confirmed (or not) by the person at the client; token
	// holders' confirmations count here (approvals.elicitation has "tcp").
	t.Run("elicitation", func(t *testing.T) {
		d := startMCPDaemon(t, "[approvals]", `required = ["sql.write", "run"]`, `elicitation = ["socket", "tcp"]`)
		cmd := exec.Command(node, "elicit.mjs")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "SANDCELL_MCP_URL="+d.url, "SANDCELL_MCP_TOKEN="+d.token)
		if out, err := cmd.CombinedOutput(); err != nil || !strings.HasSuffix(string(out), "ok\n") {
			t.Fatalf("%v: %s", err, out)
		}
	})
}

// `sandcell mcp --workspace DIR` with no daemon of the system's (it runs one in
// process): runs in DIR (their files are the host's), its files read and written
// beneath DIR and never through a link, a SQL write confirmed by the person at the
// client; the daemon's private state directory is gone with it, DIR stays.
func TestMCPStdioWithoutADaemon(t *testing.T) {
	dir := t.TempDir()
	os.Symlink("/etc/passwd", filepath.Join(dir, "passwd"))
	var shown []string
	c := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			shown = append(shown, req.Params.Message)
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
		}})
	cmd := cliCmd(t, "mcp", "--workspace", dir)
	cmd.Stderr = os.Stderr
	before := stateDirs()
	cs, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var state string
	for d := range stateDirs() {
		if !before[d] {
			state = d
		}
	}
	if _, err := os.Stat(filepath.Join(state, "audit.db")); err != nil {
		t.Fatalf("the daemon's private state directory: %q %v", state, err)
	}
	call := func(name string, args map[string]any) (bool, string) {
		t.Helper()
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res.IsError, res.Content[0].(*mcp.TextContent).Text
	}
	if bad, text := call("run_python", map[string]any{"code": "open('out.txt', 'w').write('from the guest'); print(6*7)"}); bad || !strings.Contains(text, "\n42\n") {
		t.Fatalf("run_python: %q", text)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out.txt")); err != nil || string(b) != "from the guest" {
		t.Fatalf("the run's file on the host: %q %v", b, err)
	}
	if bad, text := call("read_file", map[string]any{"path": "passwd"}); !bad || !strings.Contains(text, "unsafe_file") {
		t.Fatalf("a link out of the workspace: %v %q", bad, text)
	}
	if bad, text := call("write_file", map[string]any{"path": "../escape", "content": "x"}); !bad || !strings.Contains(text, "bad_request") {
		t.Fatalf("a path out of the workspace: %v %q", bad, text)
	}
	call("write_file", map[string]any{"path": "mk.py", "content": "import sqlite3; c = sqlite3.connect('t.db'); c.execute('create table t (x)'); c.commit()"})
	if bad, text := call("run_python", map[string]any{"path": "mk.py"}); bad {
		t.Fatalf("a workspace file: %q", text)
	}
	if bad, text := call("run_sql", map[string]any{"db": "t.db", "sql": "INSERT INTO t VALUES (42)"}); bad || len(shown) != 1 || !strings.Contains(shown[0], "INSERT INTO t") {
		t.Fatalf("a write confirmed at the client: %q, shown %q", text, shown)
	}
	if bad, text := call("run_sql", map[string]any{"db": "t.db", "sql": "SELECT x FROM t"}); bad || !strings.Contains(text, "[42]") {
		t.Fatalf("the write's row: %q", text)
	}
	// (A confirmed write needs the workspace alone: it comes before run_cell's
	// interpreter, which holds a use of the workspace while the MCP session lasts.)
	if bad, text := call("run_cell", map[string]any{"code": "y = open('out.txt').read()"}); bad || !strings.Contains(text, "state: preserved") {
		t.Fatalf("run_cell without a daemon: %q", text)
	}
	if bad, text := call("run_cell", map[string]any{"code": "y.upper()"}); bad || !strings.Contains(text, "'FROM THE GUEST'") {
		t.Fatalf("run_cell's state without a daemon: %q", text)
	}
	// The model is shown a cell's output (held in pieces), as a run's.
	if bad, text := call("run_cell", map[string]any{"code": "import sys; print('to out'); print('to err', file=sys.stderr)"}); bad ||
		!strings.Contains(text, "--- stdout ---\nto out\n") || !strings.Contains(text, "--- stderr ---\nto err\n") {
		t.Fatalf("run_cell's output without a daemon: %q", text)
	}
	// list_files lists DIR.
	if bad, text := call("list_files", map[string]any{}); bad || !strings.Contains(text, "out.txt") {
		t.Fatalf("list_files: %q", text)
	}
	// Its end ends the daemon, whose state directory goes with it.
	cs.Close()
	if _, err := os.Stat(state); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("left behind: %s %v", state, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out.txt")); err != nil || string(b) != "from the guest" {
		t.Fatalf("DIR after the end: %q %v", b, err)
	}
}

// stateDirs are the in-process daemons' state directories there are now (see
// localStateBases).
func stateDirs() map[string]bool {
	dirs := map[string]bool{}
	for _, base := range localStateBases() {
		entries, _ := os.ReadDir(base)
		for _, e := range entries {
			dirs[filepath.Join(base, e.Name())] = true
		}
	}
	return dirs
}

// The in-process daemon's state directory is never inside DIR, even where DIR is
// $TMPDIR, and a DIR that holds where the state directories are is refused: no
// guest reaches an audit log or a socket, its own daemon's or another's. A state
// directory a killed one left is removed by the next.
func TestMCPStdioStateOutsideTheWorkspace(t *testing.T) {
	// What a killed one left (its lock held by nobody, older than a minute) goes.
	base, err := localStateBase()
	if err != nil {
		t.Fatal(err)
	}
	stale, err := os.MkdirTemp(base, "")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(stale, "lock"), nil, 0o600)
	old := time.Now().Add(-2 * time.Minute)
	os.Chtimes(stale, old, old)
	dir := t.TempDir()
	cmd := cliCmd(t, "mcp", "--workspace", dir)
	cmd.Env = append(cmd.Env, "TMPDIR="+dir)
	cmd.Stderr = os.Stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "run_python",
		Arguments: map[string]any{"code": "import os; print(sorted(os.listdir('.')))"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "\n[]\n") {
		t.Fatalf("the guest's view of DIR: %v %+v", err, res)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a killed daemon's state: %v", err)
	}
	bases := localStateBases()
	out, err := cliCmd(t, "mcp", "--workspace", filepath.Dir(bases[len(bases)-1])).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "where daemons keep their state") {
		t.Fatalf("a DIR that holds the state directories: %v %s", err, out)
	}
}

// `sandcell mcp --workspace DIR` refuses a DIR that holds the bundle (or lies in
// it): the daemon's own files are never a guest's workspace.
func TestMCPStdioRefusesTheDaemonsFiles(t *testing.T) {
	cmd := cliCmd(t, "mcp", "--workspace", filepath.Dir(bundletest.Dir(t)))
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "overlaps bundle.dir") {
		t.Fatalf("%v: %s", err, out)
	}
}

// A line on stdin that is not JSON, or is too long, is answered with a parse error
// and the session goes on.
func TestMCPStdioMalformedLines(t *testing.T) {
	cmd := cliCmd(t, "mcp", "--workspace", t.TempDir())
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	go func() {
		io.WriteString(in, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`+"\n")
		io.WriteString(in, "garbage\n")
		io.WriteString(in, "{}\n")
		io.WriteString(in, "[1, 2]\n")
		io.WriteString(in, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
		io.WriteString(in, strings.Repeat("x", 2<<20)+"\n")
		io.WriteString(in, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`+"\n")
	}()
	lines := bufio.NewScanner(out)
	lines.Buffer(nil, 4<<20)
	var parseErrors int
	for lines.Scan() {
		var m struct {
			ID    *int `json:"id"`
			Error *struct {
				Code int `json:"code"`
			} `json:"error"`
			Result struct {
				Tools []any `json:"tools"`
			} `json:"result"`
		}
		json.Unmarshal(lines.Bytes(), &m)
		if m.Error != nil && (m.Error.Code == -32700 || m.Error.Code == -32600) {
			parseErrors++
		}
		if m.ID != nil && *m.ID == 2 {
			if parseErrors != 4 || len(m.Result.Tools) != 6 {
				t.Fatalf("%d parse errors, then %s", parseErrors, lines.Bytes())
			}
			in.Close()
			cmd.Wait()
			return
		}
	}
	t.Fatalf("no answer to tools/list after %d parse errors: %v", parseErrors, lines.Err())
}

// Code mode through the official TypeScript SDK's client over `sandcell mcp`: the
// daemon's [tools.memory] is the reference memory server from npm, and the person at
// the client approves the program's loop of writes once (see
// test/mcp-client/codemode.mjs).
func TestMCPCodeModeWithTheTypeScriptSDK(t *testing.T) {
	dir, err := filepath.Abs("../../test/mcp-client")
	if err != nil {
		t.Fatal(err)
	}
	server := filepath.Join(dir, "node_modules", ".bin", "mcp-server-memory")
	if _, err := os.Stat(server); err != nil {
		t.Fatalf("the reference memory server is not installed (make mcp-client, as make test does): %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is required (make mcp-client installs it): %v", err)
	}
	d := startMCPDaemon(t, "[approvals]\nelicitation = [\"socket\"]\n[tools.memory]\ncommand = ["+strconv.Quote(server)+
		"]\nenv = { MEMORY_FILE_PATH = "+strconv.Quote(filepath.Join(t.TempDir(), "memory.jsonl"))+" }\n")
	mcpCmd := cliCmd(t, "mcp", "--socket", d.sock)
	env := map[string]string{}
	for _, kv := range mcpCmd.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	args, _ := json.Marshal(mcpCmd.Args[1:])
	envJSON, _ := json.Marshal(env)
	cmd := exec.Command(node, "codemode.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SANDCELL_MCP_COMMAND="+mcpCmd.Path, "SANDCELL_MCP_ARGS="+string(args),
		"SANDCELL_MCP_ENV="+string(envJSON))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
		t.Fatalf("%v\n%s", err, out)
	}
}
