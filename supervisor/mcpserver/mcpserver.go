// Package mcpserver serves the agent tools (package tools) over the Model Context
// Protocol, on the official Go SDK: over stdio for an agent host that starts
// `sandcell mcp` (its calls go to the daemon's socket as the host's user), and as
// streamable HTTP at the daemon's /mcp (its calls go to the daemon's own API, in
// process, as the caller who opened the session).
//
// Each tool call becomes one API request (POST /v1/runs, POST /v1/sql, the workspace
// routes), so the roles, policy, quotas, approvals and audit of the API apply to it
// unchanged. The sessions of one owner (Options.Owner: over HTTP, the caller) share
// a workspace, created at its first use and kept after the sessions end (an agent's
// files are never removed behind its back); a call may name another workspace its
// caller owns.
//
// The tools are offered only while the daemon accepts work: while it is not ready,
// stopping or switched off, tools/list is empty, clients are told the list changed,
// and a call is refused with the reason.
package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/supervisor/tools"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// Backend is the daemon as one session's calls reach it (a *client.Client).
type Backend interface {
	Run(ctx context.Context, req wire.RunRequest) (wire.View, error)
	SQL(ctx context.Context, req wire.SQLRequest) (json.RawMessage, error)
	CreateWorkspace(ctx context.Context) (wire.Workspace, error)
	Workspace(ctx context.Context, id, after string, limit int) (wire.Workspace, error)
	ReadFile(ctx context.Context, id, path string, max int64) ([]byte, int64, error)
	WriteFile(ctx context.Context, id, path string, data []byte) error
	ConfirmApproval(ctx context.Context, id string, approve bool) error
	// Get, ConfirmGrant and Approval follow a program's tool calls (code mode).
	Get(ctx context.Context, id string) (wire.View, error)
	ConfirmGrant(ctx context.Context, id string, approve bool, n int) error
	Approval(ctx context.Context, id string) (json.RawMessage, error)
	OpenSession(ctx context.Context, req wire.SessionRequest) (wire.SessionView, error)
	Cell(ctx context.Context, id string, req wire.CellRequest) (wire.CellAnswer, error)
	CloseSession(ctx context.Context, id string) error
}

var _ Backend = (*client.Client)(nil)

// Options configure a Server.
type Options struct {
	// Backend returns the daemon as the caller of MCP session id sees it ("" over
	// stdio, where there is one session).
	Backend func(session string) Backend
	// Unavailable says why the tools cannot be offered now, or "" when they can.
	Unavailable func(ctx context.Context) string
	// Version is the daemon's, given to clients as the server's.
	Version string
	// Log receives the SDK's log; nil discards it.
	Log *slog.Logger
	// Owner names whom session's calls are for: sessions of one owner share one
	// workspace, the owner's, for as long as this server runs (an agent host that
	// reconnects finds its files). nil: each session has its own.
	Owner func(session string) string
	// Workspace is the id of a workspace an earlier run of this server made for the
	// owner "" (`sandcell mcp` keeps it between starts), used while it exists.
	Workspace string
	// Remember, if set, is told the id of each workspace the server makes, with its
	// owner.
	Remember func(owner, id string)
	// GuestTools, if set, lists the operator's tools the code of run_python and
	// run_cell may call (see tools.WithGuestTools); a change is offered at the next
	// Refresh.
	GuestTools func() string
}

// Server is the MCP server of the tools.
type Server struct {
	o   Options
	mcp *mcp.Server

	refreshing sync.Mutex // one Refresh at a time: a later state never loses to an earlier one
	opening    sync.Mutex // one run_cell opening an interpreter at a time
	mu         sync.Mutex
	offered    bool
	guest      string            // the guest tools the offered descriptions list
	reason     string            // why not offered
	workspaces map[string]string // owner (see Options.Owner) -> its workspace id
	cells      map[string]cell   // MCP session -> its interpreter session (run_cell)
}

// cell is the interpreter session run_cell opened for an MCP session, and the
// daemon as that session's caller reaches it (to close it once the MCP session
// has ended, when the caller is known no longer).
type cell struct {
	id string
	b  Backend
}

// New returns a server whose tools are not offered until the first Refresh (or
// the first tools/list or tools/call, which refresh first).
func New(o Options) *Server {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{o: o, workspaces: map[string]string{}, cells: map[string]cell{}, reason: "not checked yet"}
	if o.Workspace != "" {
		s.workspaces[""] = o.Workspace
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "sandcell", Title: "Sandcell", Version: o.Version},
		&mcp.ServerOptions{Logger: o.Log, Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
			Instructions: "Sandcell runs Python and SQL in a sandbox that can touch only one workspace directory (/ws)."})
	s.mcp.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "tools/list" || method == "tools/call" {
				s.Refresh(ctx)
			}
			if method == "tools/call" {
				s.mu.Lock()
				reason := s.reason
				s.mu.Unlock()
				if reason != "" {
					// Withdrawn tools: the call is refused with why, not as unknown.
					return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{
						Text: "the sandbox is not available: " + reason}}}, nil
				}
			}
			return next(ctx, method, req)
		}
	})
	return s
}

// RunStdio serves one session on stdin and stdout until the client ends it or ctx
// ends. A line that is not JSON, or is longer than tools.MaxMessageBytes, is
// answered with JSON-RPC's parse error (-32700) and the session goes on (the SDK's
// own reading would end the session at the first).
func (s *Server) RunStdio(ctx context.Context) error {
	out := &lockedWriter{w: os.Stdout}
	pr, pw := io.Pipe()
	go filterLines(os.Stdin, pw, out, tools.MaxMessageBytes)
	defer s.closeCells(nil)
	return s.mcp.Run(ctx, &mcp.IOTransport{Reader: pr, Writer: out, MaxLineLength: tools.MaxMessageBytes + 1})
}

// closeCells ends the interpreter sessions run_cell opened for MCP sessions that
// are not live (over stdio at its end, nil: every one), so they hold no place, no
// memory and no disk until their idle timeout.
func (s *Server) closeCells(live map[string]bool) {
	s.mu.Lock()
	var ended []cell
	for session, c := range s.cells {
		if !live[session] {
			ended = append(ended, c)
			delete(s.cells, session)
		}
	}
	s.mu.Unlock()
	s.closeEach(ended)
}

// CloseCellsOf ends the interpreter session run_cell opened for MCP session id, if
// any, before it returns: its client is ending the session (DELETE /mcp), and
// the interpreter's place and workspace are free once the client has its answer
// (the watch would end it within a second).
func (s *Server) CloseCellsOf(id string) {
	s.mu.Lock()
	c, ok := s.cells[id]
	delete(s.cells, id)
	s.mu.Unlock()
	if ok {
		s.closeEach([]cell{c})
	}
}

func (s *Server) closeEach(ended []cell) {
	for _, c := range ended {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c.b.CloseSession(ctx, c.id)
		cancel()
	}
}

// lockedWriter serialises the SDK's messages and filterLines' errors.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (l *lockedWriter) Close() error { return nil }

// parseError is JSON-RPC's answer to a message that cannot be read.
const parseError = `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: %s"}}` + "\n"

// invalidRequest is JSON-RPC's answer to JSON that is not a message.
const invalidRequest = `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: one JSON-RPC 2.0 message (an object) per line"}}` + "\n"

// isMessage reports whether t (valid JSON) is one JSON-RPC 2.0 message: an object
// with "jsonrpc": "2.0", and an id, if any, that is a string, a number or null.
func isMessage(t []byte) bool {
	var m struct {
		JSONRPC *string         `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
	}
	if t[0] != '{' || json.Unmarshal(t, &m) != nil || m.JSONRPC == nil || *m.JSONRPC != "2.0" {
		return false
	}
	if len(m.ID) > 0 && (m.ID[0] == '{' || m.ID[0] == '[' || m.ID[0] == 't' || m.ID[0] == 'f') {
		return false
	}
	return true
}

// filterLines copies the newline-delimited messages of in to w, and answers on out
// each line that is not one JSON value, or is longer than max bytes (the rest of such
// a line is skipped, never held). It closes w at the end of in.
func filterLines(in io.Reader, w *io.PipeWriter, out io.Writer, max int) {
	defer w.Close()
	r := bufio.NewReaderSize(in, 64<<10)
	var line []byte
	long := false
	for {
		chunk, err := r.ReadSlice('\n')
		if !long {
			if len(line)+len(chunk) > max {
				long, line = true, line[:0]
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue // the line goes on
		}
		switch t := bytes.TrimSpace(line); {
		case long:
			fmt.Fprintf(out, parseError, fmt.Sprintf("a message longer than %d bytes", max))
		case len(t) == 0:
		case !json.Valid(t):
			fmt.Fprintf(out, parseError, "not JSON")
		case !isMessage(t):
			fmt.Fprint(out, invalidRequest)
		default:
			if _, werr := w.Write(append(t, '\n')); werr != nil {
				return
			}
		}
		line, long = line[:0], false
		if err != nil {
			return
		}
	}
}

// HTTPHandler serves MCP's streamable HTTP transport: many sessions, each named by
// its Mcp-Session-Id header. maxBody bounds a request body in bytes; a session idle
// for idle ends. The handler does not authenticate: it is mounted behind the
// daemon's own.
func (s *Server) HTTPHandler(maxBody int64, idle time.Duration) http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{MaxRequestBodyBytes: maxBody, SessionTimeout: idle,
			// The socket is the daemon's own, and its TCP listener takes only bearer
			// tokens, which a page of another origin cannot send unasked: the SDK's
			// check of the Host header would only refuse the daemon's own callers.
			DisableLocalhostProtection: true})
}

// Refresh offers the tools or withdraws them as Unavailable says; a change notifies
// every session (notifications/tools/list_changed). Without Options.Owner it also
// forgets the workspaces of sessions that have ended (they stay on the daemon).
func (s *Server) Refresh(ctx context.Context) {
	s.refreshing.Lock()
	defer s.refreshing.Unlock()
	reason := s.o.Unavailable(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reason = reason
	guest := ""
	if s.o.GuestTools != nil {
		guest = s.o.GuestTools()
	}
	switch {
	case reason == "" && (!s.offered || guest != s.guest):
		s.offered, s.guest = true, guest
		s.add() // (again: the same tools, their descriptions changed)
	case reason != "" && s.offered:
		s.offered = false
		var names []string
		for _, d := range tools.Definitions() {
			names = append(names, d.Name)
		}
		s.mcp.RemoveTools(names...)
	}
	live := s.Sessions()
	if s.o.Owner == nil {
		for id := range s.workspaces {
			if id != "" && !live[id] {
				delete(s.workspaces, id)
			}
		}
	}
	if len(s.cells) > 0 {
		go s.closeCells(live) // the interpreters of MCP sessions that have ended
	}
}

// Sessions returns the ids of the open sessions.
func (s *Server) Sessions() map[string]bool {
	live := map[string]bool{}
	for ss := range s.mcp.Sessions() {
		live[ss.ID()] = true
	}
	return live
}

// CloseCells ends every interpreter session run_cell opened (a stopping daemon's:
// its MCP sessions over HTTP do not outlive it, and their interpreters, which it
// would keep, would only hold their callers' places until their idle timeout).
func (s *Server) CloseCells() { s.closeCells(nil) }

// Close ends every session (a stopping daemon's; their clients see the end of the
// connection and may reconnect to the next daemon).
func (s *Server) Close() {
	for ss := range s.mcp.Sessions() {
		ss.Close()
	}
}

// Watch refreshes every interval until ctx ends, so clients hear of a change while
// they are idle.
func (s *Server) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Refresh(ctx)
		}
	}
}

// Definitions are the tools as MCP tools/list shows them, run_python's and
// run_cell's descriptions listing the guest tools (see tools.WithGuestTools). Their
// results have no output schema: the structured content is the API's own answer
// (see docs/agents.md).
func Definitions(guest string) []*mcp.Tool {
	var out []*mcp.Tool
	for _, d := range tools.WithGuestTools(guest) {
		out = append(out, &mcp.Tool{Name: d.Name, Title: d.Title, Description: d.Description, InputSchema: d.InputSchema,
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: d.ReadOnly, OpenWorldHint: new(false)}})
	}
	return out
}

// add registers the tools (the caller holds mu).
func (s *Server) add() {
	for _, t := range Definitions(s.guest) {
		switch t.Name {
		case tools.RunPython:
			mcp.AddTool(s.mcp, t, s.runPython)
		case tools.RunCell:
			mcp.AddTool(s.mcp, t, s.runCell)
		case tools.RunSQL:
			mcp.AddTool(s.mcp, t, s.runSQL)
		case tools.ListFiles:
			mcp.AddTool(s.mcp, t, s.listFiles)
		case tools.ReadFile:
			mcp.AddTool(s.mcp, t, s.readFile)
		case tools.WriteFile:
			mcp.AddTool(s.mcp, t, s.writeFile)
		}
	}
}

// call is what every tool does first: refuse while the tools are not offered, and
// find the backend and the workspace of the calling session (its owner's). done
// is to be given the backend's error: a workspace of the owner's that has gone
// (removed through the API) is forgotten, and the next call makes another.
func (s *Server) call(ctx context.Context, req *mcp.CallToolRequest, workspace string) (b Backend, ws string, done func(error) error, err error) {
	s.mu.Lock()
	reason := s.reason
	s.mu.Unlock()
	if reason != "" {
		return nil, "", nil, fmt.Errorf("the sandbox is not available: %s", reason)
	}
	session := ""
	if req != nil && req.Session != nil {
		session = req.Session.ID()
	}
	if b = s.o.Backend(session); b == nil {
		return nil, "", nil, errors.New("this MCP session has no caller")
	}
	if workspace != "" {
		return b, workspace, describe, nil
	}
	owner := session
	if s.o.Owner != nil {
		owner = s.o.Owner(session)
	}
	done = func(err error) error {
		var p *wire.Problem
		if errors.As(err, &p) && p.Code == wire.CodeNotFound && strings.Contains(p.Detail, "no workspace") {
			s.mu.Lock()
			if s.workspaces[owner] == ws {
				delete(s.workspaces, owner)
			}
			s.mu.Unlock()
			return fmt.Errorf("%v (the session's workspace %s is gone; the next call makes a new one)", describe(err), ws)
		}
		return describe(err)
	}
	s.mu.Lock()
	id, ok := s.workspaces[owner]
	s.mu.Unlock()
	if ok {
		return b, id, done, nil
	}
	w, err := b.CreateWorkspace(ctx)
	if err != nil {
		return nil, "", nil, describe(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.workspaces[owner]; ok {
		return b, id, done, nil // another call created one first (this one stays empty)
	}
	s.workspaces[owner] = w.ID
	if s.o.Remember != nil {
		s.o.Remember(owner, w.ID)
	}
	return b, w.ID, done, nil
}

// approvalID is the approval id of a refusal that asks for one ("" otherwise), and
// whether the daemon would take the caller's own confirmation of it.
func approvalID(err error) (string, bool) {
	var p *wire.Problem
	if !errors.As(err, &p) || p.Code != wire.CodeApprovalRequired {
		return "", false
	}
	var id string
	var confirmable bool
	json.Unmarshal(p.Extensions["approval_id"], &id)
	json.Unmarshal(p.Extensions["confirmable"], &confirmable)
	return id, confirmable
}

// visible makes text safe to show a person whole: every control character but
// newline and tab, and every character that reorders or hides text (bidirectional
// controls, zero-width characters), written as an escape, so that what is shown is
// what runs.
func visible(text string) string {
	var b strings.Builder
	for _, r := range text {
		switch {
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case unicode.IsControl(r), unicode.Is(unicode.Cf, r), r == utf8.RuneError:
			fmt.Fprintf(&b, "\\u{%04X}", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// confirmInput names the one input request of a held call: the person's answer.
const confirmInput = "confirm"

// canAsk reports whether the session's client can ask the person at it (it declared
// the elicitation capability).
func canAsk(req *mcp.CallToolRequest) bool {
	if req == nil || req.Session == nil {
		return false
	}
	init := req.Session.InitializeParams()
	return init != nil && init.Capabilities != nil && init.Capabilities.Elicitation != nil
}

// ask is the answer to a call the daemon held for approval id, when the client can
// ask the person at it: an input request (MCP's multi round-trip requests; the SDK
// asks a client of an older protocol version itself) showing message, with the
// approval id as the state the client sends back with the person's answer. It
// returns nil when the client cannot ask: the refusal, with its id, stands for an
// approver.
func ask(req *mcp.CallToolRequest, id, message string) *mcp.CallToolResult {
	if !canAsk(req) {
		return nil
	}
	return &mcp.CallToolResult{RequestState: id, InputRequests: mcp.InputRequestMap{confirmInput: &mcp.ElicitParams{
		Message: message, RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}}}}}
}

// answered gives the daemon the person's answer, when this call is the client's
// retry with it: the approval then holds (true), or the error says why not (declined,
// or the daemon's policy does not let this caller's confirmation count). It returns
// "" when the call carries no answer.
func answered(ctx context.Context, req *mcp.CallToolRequest, b Backend) (string, error) {
	if req == nil || req.Params == nil || req.Params.RequestState == "" || strings.HasPrefix(req.Params.RequestState, runState) {
		return "", nil // (a run's tool call's answer: resumeRun)
	}
	id := req.Params.RequestState
	res, ok := req.Params.InputResponses[confirmInput].(*mcp.ElicitResult)
	if !ok {
		return "", fmt.Errorf("the client sent no answer for approval %s", id)
	}
	accepted := res.Action == "accept"
	if err := b.ConfirmApproval(ctx, id, accepted); err != nil {
		return "", fmt.Errorf("the confirmation was not taken (%v): an approver must decide approval %s, then call again with \"approval\": %q", describe(err), id, id)
	}
	if !accepted {
		return "", fmt.Errorf("declined at the client (%s): nothing ran", res.Action)
	}
	return id, nil
}

// describe is an error as an agent reads it: a daemon's refusal by its code and why.
func describe(err error) error {
	var p *wire.Problem
	if errors.As(err, &p) {
		msg := fmt.Sprintf("refused (%s): %s", p.Code, p.Detail)
		if id, ok := p.Extensions["approval_id"]; ok {
			var s string
			json.Unmarshal(id, &s)
			msg += " [approval_id " + s + "]"
		}
		return errors.New(msg)
	}
	return err
}

// heldMessage is what the person at the client is shown of code held for approval
// (err, the daemon's approval_required): head, then the whole program as the daemon
// will run it (a path's file as it read it) and everything else that decides it:
// the arguments, standard input and time limit, and the workspace's files (any of
// which it could import or read as code), which the approval binds too.
func heldMessage(err error, head string, args []string, timeoutMS int64) string {
	var p *wire.Problem
	errors.As(err, &p)
	var code, stdin string
	var files []struct {
		Path   string `json:"path"`
		Type   string `json:"type"`
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	}
	json.Unmarshal(p.Extensions["program"], &code)
	json.Unmarshal(p.Extensions["stdin"], &stdin)
	json.Unmarshal(p.Extensions["workspace_files"], &files)
	var msg strings.Builder
	fmt.Fprintf(&msg, "%s\n\n%s\n", head, visible(code))
	if len(args) > 0 {
		fmt.Fprintf(&msg, "\nArguments: %s\n", visible(fmt.Sprintf("%q", args)))
	}
	if stdin != "" {
		fmt.Fprintf(&msg, "\nStandard input:\n%s\n", visible(stdin))
	}
	if timeoutMS > 0 {
		fmt.Fprintf(&msg, "\nTime limit: %d ms\n", timeoutMS)
	}
	if len(files) > 0 {
		fmt.Fprintf(&msg, "\nThe workspace's files, which it could import (as they are now; changed, the approval is void):\n")
		for _, f := range files {
			if f.Type == "dir" {
				fmt.Fprintf(&msg, "  %s/\n", visible(f.Path))
				continue
			}
			fmt.Fprintf(&msg, "  %s (%d bytes, SHA-256 %.12s)\n", visible(f.Path), f.Size, f.SHA256)
		}
	}
	return msg.String()
}

// RunResult is run_python's structured result.
type RunResult struct {
	Workspace string    `json:"workspace"`
	Run       wire.View `json:"run"`
	// Saved are the workspace files that hold the whole output (save_output).
	Saved []string `json:"saved,omitempty"`
}

func (s *Server) runPython(ctx context.Context, req *mcp.CallToolRequest, in tools.RunPythonArgs) (*mcp.CallToolResult, any, error) {
	if (in.Code == "") == (in.Path == "") {
		return nil, nil, errors.New("give exactly one of code and path")
	}
	b, ws, done, err := s.call(ctx, req, in.Workspace)
	if err != nil {
		return nil, nil, err
	}
	rr := wire.RunRequest{Code: in.Code, Path: in.Path, Args: in.Args, Stdin: in.Stdin, Workspace: ws,
		Limits: wire.RunLimits{TimeoutMS: in.TimeoutMS}, Approval: in.Approval, Backend: in.Backend}
	if id, err := answered(ctx, req, b); err != nil {
		return nil, nil, err
	} else if id != "" {
		rr.Approval = id
	}
	if runID, decided, err := s.resumeRun(ctx, req, b); err != nil {
		return nil, nil, err
	} else if runID != "" {
		return s.followRun(ctx, req, b, ws, in, runID, decided)
	}
	// Code mode, where the client can ask the person at it: the run is started,
	// and followed; a tool call of its that waits for a decision is asked at the
	// client (followRun).
	following := canAsk(req) && s.o.GuestTools != nil && s.o.GuestTools() != ""
	if following {
		rr.Wait = new(false)
	}
	v, err := b.Run(ctx, rr)
	if err == nil && following {
		return s.followRun(ctx, req, b, ws, in, v.ID, "")
	}
	if id, confirmable := approvalID(err); id != "" && confirmable {
		head := fmt.Sprintf("Run this Python in Sandcell's sandbox (workspace %s)?", ws)
		if in.Path != "" {
			head += fmt.Sprintf(" It is the workspace's file %s, as it is now.", visible(in.Path))
		}
		if res := ask(req, id, heldMessage(err, head, in.Args, in.TimeoutMS)); res != nil {
			return res, nil, nil
		}
	}
	if err != nil {
		return nil, nil, done(err)
	}
	return runResult(ctx, b, ws, in, v)
}

// runResult is run_python's answer for the run v (ended).
func runResult(ctx context.Context, b Backend, ws string, in tools.RunPythonArgs, v wire.View) (*mcp.CallToolResult, any, error) {
	out := RunResult{Workspace: ws, Run: v}
	text := tools.RunText(v)
	if in.SaveOutput != "" && v.Result != nil {
		for _, f := range []struct {
			ext string
			b   []byte
		}{{".stdout", v.Result.Stdout}, {".stderr", v.Result.Stderr}} {
			if err := b.WriteFile(ctx, ws, in.SaveOutput+f.ext, f.b); err != nil {
				text += fmt.Sprintf("(the output was not saved as %s%s: %v)\n", in.SaveOutput, f.ext, describe(err))
			} else {
				out.Saved = append(out.Saved, in.SaveOutput+f.ext)
			}
		}
		if len(out.Saved) > 0 {
			text += "(the whole output is in " + strings.Join(out.Saved, " and ") + ")\n"
		}
	}
	var shown []mcp.Content
	if v.Result != nil && len(v.Result.Displays) > 0 {
		var about string
		shown, about = displayContent(ctx, b, ws, v.Result.Displays)
		text += about
	}
	res := &mcp.CallToolResult{Content: append([]mcp.Content{&mcp.TextContent{Text: text}}, shown...)}
	// A run that did not exit 0 is an error the agent sees as one.
	res.IsError = v.Result == nil || v.Result.ExitCode != 0 || v.Result.Reason != "exited"
	return res, out, nil
}

// runState is the state of a run_python answer that asks the person about a tool
// call of the run: "run RUN-ID APPROVAL-ID".
const runState = "run "

// followRun waits for run id to end and answers with it; a tool call of the run
// that waits for a decision the caller's own confirmation would take is asked of
// the person at the client instead (an input request: the client's retry carries
// the answer, see resumeRun, and the run is followed again; decided is the approval
// that answer decided, which the run's view may still show for a moment).
func (s *Server) followRun(ctx context.Context, req *mcp.CallToolRequest, b Backend, ws string, in tools.RunPythonArgs, id, decided string) (*mcp.CallToolResult, any, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		v, err := b.Get(ctx, id)
		if err != nil {
			return nil, nil, describe(err)
		}
		if v.State == wire.Done {
			return runResult(ctx, b, ws, in, v)
		}
		if w := v.Waiting; w != nil && w.Confirmable && w.Approval != decided {
			return &mcp.CallToolResult{RequestState: runState + id + " " + w.Approval,
				InputRequests: mcp.InputRequestMap{confirmInput: &mcp.ElicitParams{Message: s.toolCallMessage(ctx, b, w),
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{
						"calls": map[string]any{"type": "integer", "minimum": 1, "maximum": 10000, "default": 1,
							"title": "Calls to approve", "description": "this call and the program's next calls to " +
								w.Tool + ", this many in all (one answer for a loop)"}}}}}}, nil, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// toolCallMessage is what the person at the client is shown of a program's tool
// call that waits for them: the tool, its arguments and the program.
func (s *Server) toolCallMessage(ctx context.Context, b Backend, w *wire.Waiting) string {
	var ap struct {
		Subject struct {
			Tool      string          `json:"tool"`
			Arguments json.RawMessage `json:"arguments"`
			Program   string          `json:"program"`
		} `json:"subject"`
	}
	raw, err := b.Approval(ctx, w.Approval)
	if err == nil {
		json.Unmarshal(raw, &ap)
	}
	return fmt.Sprintf("The program running in Sandcell's sandbox calls %s, a tool that writes. Allow it?\n\n"+
		"Arguments: %s\n\nThe program:\n%s\n", visible(w.Tool), visible(string(ap.Subject.Arguments)), visible(ap.Subject.Program))
}

// resumeRun takes the person's answer about a run's tool call, when this call is
// the client's retry with one (see followRun): it gives the daemon the decision and
// returns the run to follow and the approval decided. It returns "" when this call
// carries no such answer.
func (s *Server) resumeRun(ctx context.Context, req *mcp.CallToolRequest, b Backend) (run, approval string, err error) {
	if req == nil || req.Params == nil || !strings.HasPrefix(req.Params.RequestState, runState) {
		return "", "", nil
	}
	run, approval, ok := strings.Cut(strings.TrimPrefix(req.Params.RequestState, runState), " ")
	if !ok {
		return "", "", errors.New("the client sent back a state this server did not give")
	}
	res, ok := req.Params.InputResponses[confirmInput].(*mcp.ElicitResult)
	if !ok {
		return "", "", fmt.Errorf("the client sent no answer for approval %s of run %s", approval, run)
	}
	n := 1
	if c, ok := res.Content["calls"].(float64); ok && c >= 1 {
		n = int(min(c, 10000))
	}
	// Refused (decided already by an approver, or not this caller's to decide):
	// the run goes on either way, and is followed.
	_ = b.ConfirmGrant(ctx, approval, res.Action == "accept", n)
	return run, approval, nil
}

// CellResult is run_cell's structured result.
type CellResult struct {
	Workspace string          `json:"workspace"`
	Cell      wire.CellAnswer `json:"cell"`
	// Fresh: this call started a new interpreter (its first, a restart, or after
	// the state was lost).
	Fresh bool `json:"fresh"`
}

// runCell runs a cell in the calling MCP session's interpreter session, opened at
// its first call in the owner's workspace (and again after a restart, or once the
// state was lost: the answer says the interpreter is fresh).
func (s *Server) runCell(ctx context.Context, req *mcp.CallToolRequest, in tools.RunCellArgs) (*mcp.CallToolResult, any, error) {
	if in.Code == "" {
		return nil, nil, errors.New("code is required")
	}
	b, ws, done, err := s.call(ctx, req, "")
	if err != nil {
		return nil, nil, err
	}
	session := ""
	if req != nil && req.Session != nil {
		session = req.Session.ID()
	}
	// One opening at a time per server: two first calls of one MCP session at once
	// would open two interpreters and orphan one.
	confirmed, err := answered(ctx, req, b)
	if err != nil {
		return nil, nil, err
	}
	s.opening.Lock()
	s.mu.Lock()
	id := s.cells[session].id
	s.mu.Unlock()
	if id != "" && in.Restart && confirmed == "" {
		// (A retry that carries the person's answer runs in the session it was
		// held for: a restart would make it another request.)
		b.CloseSession(ctx, id)
		id = ""
	}
	fresh := id == ""
	if fresh {
		v, err := b.OpenSession(ctx, wire.SessionRequest{Workspace: ws, Backend: in.Backend})
		if err != nil {
			s.opening.Unlock()
			return nil, nil, done(err)
		}
		id = v.ID
		s.mu.Lock()
		s.cells[session] = cell{id: id, b: b}
		s.mu.Unlock()
	}
	s.opening.Unlock()
	forget := func() {
		s.mu.Lock()
		mine := s.cells[session].id == id
		if mine {
			delete(s.cells, session)
		}
		s.mu.Unlock()
		if mine {
			// Its state is gone: it holds its caller's place no longer.
			b.CloseSession(context.WithoutCancel(ctx), id)
		}
	}
	cr := wire.CellRequest{Code: in.Code, Stdin: in.Stdin, Limits: wire.RunLimits{TimeoutMS: in.TimeoutMS}, Approval: in.Approval}
	if confirmed != "" {
		cr.Approval = confirmed
	}
	a, err := b.Cell(ctx, id, cr)
	if held, confirmable := approvalID(err); held != "" && confirmable {
		head := fmt.Sprintf("Run this cell in this session's Python interpreter in Sandcell's sandbox (workspace %s)?", ws)
		if res := ask(req, held, heldMessage(err, head, nil, in.TimeoutMS)); res != nil {
			return res, nil, nil
		}
	}
	var p *wire.Problem
	if errors.As(err, &p) && (p.Code == wire.CodeSessionLost || p.Code == wire.CodeNotFound) {
		// Lost earlier, or ended by its idle timeout: said, and the next call is fresh.
		forget()
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "state: lost " +
			"(the interpreter of this session is gone: " + p.Detail + "); nothing ran. Call run_cell again to " +
			"start a fresh interpreter: what earlier cells defined must be defined again (the workspace's files stay).\n"}}}, nil, nil
	}
	if err != nil {
		return nil, nil, done(err)
	}
	var text strings.Builder
	if fresh {
		text.WriteString("(a fresh interpreter: nothing from earlier cells is defined)\n")
	}
	switch a.State {
	case wire.SessionPreserved:
		text.WriteString("state: preserved (what this cell defined is kept for the next call)\n")
	case wire.SessionRestored:
		text.WriteString("state: restored (the interpreter had been paused to disk, idle or over a daemon restart, " +
			"and is back as the last cell that ended by itself left it; file objects it held open are closed)\n")
	case wire.SessionRolledBack:
		fmt.Fprintf(&text, "state: rolled_back (the cell ended %s: the interpreter is back to its state before "+
			"this cell; files it wrote stay)\n", a.Result.Reason)
	default:
		forget()
		fmt.Fprintf(&text, "state: lost (%s): the interpreter was ended; the next call starts a fresh one, "+
			"where what earlier cells defined must be defined again (the workspace's files stay)\n", a.Session.Lost)
	}
	text.WriteString(tools.RunText(wire.View{ID: id, State: wire.Done, Result: &a.Result}))
	if a.Value != "" || a.ValueTruncated {
		// As the interactive interpreter shows a last expression.
		text.WriteString("--- value")
		if a.ValueTruncated {
			text.WriteString(" (stopped at the run's output limit)")
		}
		fmt.Fprintf(&text, " ---\n%s\n", tools.Clip([]byte(a.Value), tools.MaxShownOutput))
	}
	var shown []mcp.Content
	if len(a.Result.Displays) > 0 {
		var about string
		shown, about = displayContent(ctx, b, ws, a.Result.Displays)
		text.WriteString(about)
	}
	res := &mcp.CallToolResult{Content: append([]mcp.Content{&mcp.TextContent{Text: text.String()}}, shown...)}
	res.IsError = a.Result.ExitCode != 0 || a.Result.Reason != "exited" ||
		a.State != wire.SessionPreserved && a.State != wire.SessionRestored
	return res, CellResult{Workspace: ws, Cell: a, Fresh: fresh}, nil
}

// SQLResult is run_sql's structured result.
type SQLResult struct {
	Workspace string          `json:"workspace"`
	Result    json.RawMessage `json:"result"`
}

func (s *Server) runSQL(ctx context.Context, req *mcp.CallToolRequest, in tools.RunSQLArgs) (*mcp.CallToolResult, any, error) {
	b, ws, done, err := s.call(ctx, req, in.Workspace)
	if err != nil {
		return nil, nil, err
	}
	sr := wire.SQLRequest{Workspace: ws, DB: in.DB, SQL: in.SQL, Params: in.Params, MaxRows: in.MaxRows, Approval: in.Approval}
	if id, err := answered(ctx, req, b); err != nil {
		return nil, nil, err
	} else if id != "" {
		sr.Approval = id
	}
	out, err := b.SQL(ctx, sr)
	if id, confirmable := approvalID(err); id != "" && confirmable {
		msg := fmt.Sprintf("Let this SQL statement write to %s (workspace %s)?\n\n%s\n", visible(in.DB), ws, visible(in.SQL))
		if len(in.Params) > 0 {
			msg += "\nParameters: " + visible(string(in.Params)) + "\n"
		}
		if res := ask(req, id, msg); res != nil {
			return res, nil, nil
		}
	}
	if err != nil {
		return nil, nil, done(err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: tools.Clip(out, tools.MaxShownOutput)}}},
		SQLResult{Workspace: ws, Result: out}, nil
}

// FilesResult is list_files' structured result.
type FilesResult struct {
	Workspace string               `json:"workspace"`
	Files     []wire.WorkspaceFile `json:"files"`
	Next      string               `json:"next,omitempty"`
}

func (s *Server) listFiles(ctx context.Context, req *mcp.CallToolRequest, in tools.ListFilesArgs) (*mcp.CallToolResult, any, error) {
	b, ws, done, err := s.call(ctx, req, in.Workspace)
	if err != nil {
		return nil, nil, err
	}
	w, err := b.Workspace(ctx, ws, in.After, 0)
	if err != nil {
		return nil, nil, done(err)
	}
	var text strings.Builder
	fmt.Fprintf(&text, "workspace %s: %d names", ws, len(w.Files))
	if w.Next != "" {
		fmt.Fprintf(&text, " (more after %q)", w.Next)
	}
	text.WriteString("\n")
	for _, f := range w.Files {
		fmt.Fprintf(&text, "%s\t%s\t%d\n", f.Type, f.Path, f.Size)
	}
	files := w.Files
	if files == nil {
		files = []wire.WorkspaceFile{}
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text.String()}}},
		FilesResult{Workspace: ws, Files: files, Next: w.Next}, nil
}

// FileResult is read_file's structured result.
type FileResult struct {
	Workspace string `json:"workspace"`
	Path      string `json:"path"`
	Size      int64  `json:"size"`
	Encoding  string `json:"encoding"`
	Content   string `json:"content"`
	// Truncated: the file is larger than what was read (tools.MaxReadBytes).
	Truncated bool `json:"truncated,omitempty"`
}

func (s *Server) readFile(ctx context.Context, req *mcp.CallToolRequest, in tools.ReadFileArgs) (*mcp.CallToolResult, any, error) {
	b, ws, done, err := s.call(ctx, req, in.Workspace)
	if err != nil {
		return nil, nil, err
	}
	data, size, err := b.ReadFile(ctx, ws, in.Path, tools.MaxReadBytes)
	if err != nil {
		return nil, nil, done(err)
	}
	out := FileResult{Workspace: ws, Path: in.Path, Size: size, Encoding: "text", Truncated: size > int64(len(data))}
	switch {
	case in.Encoding == "base64":
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(data)
	case !utf8.Valid(data):
		return nil, nil, fmt.Errorf("%s is not UTF-8 text: read it with encoding base64", in.Path)
	default:
		out.Content = string(data)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: out.Content}}}, out, nil
}

// WrittenResult is write_file's structured result.
type WrittenResult struct {
	Workspace string `json:"workspace"`
	Path      string `json:"path"`
	Bytes     int    `json:"bytes"`
}

func (s *Server) writeFile(ctx context.Context, req *mcp.CallToolRequest, in tools.WriteFileArgs) (*mcp.CallToolResult, any, error) {
	data := []byte(in.Content)
	if in.Encoding == "base64" {
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, nil, fmt.Errorf("content is not base64: %v", err)
		}
	}
	b, ws, done, err := s.call(ctx, req, in.Workspace)
	if err != nil {
		return nil, nil, err
	}
	if err := b.WriteFile(ctx, ws, in.Path, data); err != nil {
		return nil, nil, done(err)
	}
	out := WrittenResult{Workspace: ws, Path: in.Path, Bytes: len(data)}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
		Text: fmt.Sprintf("wrote %d bytes to %s in workspace %s", len(data), in.Path, ws)}}}, out, nil
}
