package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/supervisor/sessions"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// Interpreter sessions: /v1/sessions. A session is one hardened worker for one
// caller and one workspace whose interpreter keeps its state from cell to cell
// (sessions.Manager); every answer says what became of that state.

// sessionsOn refuses every session route when sessions.max is 0.
func (s *Server) sessionsOn(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.o.Sessions == nil {
			return fail(wire.CodeNotFound, "interpreter sessions are off here (sessions.max = 0)")
		}
		return next(c)
	}
}

func (s *Server) createSession(c echo.Context) error {
	ctx := c.Request().Context()
	peer, _ := PeerFrom(ctx)
	if err := s.accepting(); err != nil {
		return err
	}
	var body wire.SessionRequest
	if err := s.decode(c, &body); err != nil {
		return err
	}
	req, err := s.request(wire.RunRequest{Code: "pass", Limits: body.Limits, Env: body.Env, Backend: body.Backend})
	if err != nil {
		return err
	}
	if err := s.mayUseBackend(peer, req.Backend); err != nil {
		return err
	}
	req.Code = ""
	if req.Limits.MemoryBytes > sessions.MaxMemoryBytes {
		return failf(wire.CodeLimitExceeded, "limits.memory_mib %s is over a session's maximum, %s: its worker holds the memory and a checkpoint of it",
			mib(req.Limits.MemoryBytes), mib(sessions.MaxMemoryBytes))
	}
	if body.Workspace != "" {
		w, err := s.workspace(c, body.Workspace)
		if err != nil {
			return err
		}
		over, u, err := w.OverQuota()
		if err != nil {
			return err
		}
		if over {
			return failf(wire.CodeQuota, "workspace %s holds %d bytes in %d names, over its quota: remove files first",
				w.ID, u.Bytes, u.Files)
		}
		req.Workspace = w.Dir()
	}
	ss, err := s.o.Sessions.Open(ctx, req, peer.Caller(), body.Workspace)
	if err != nil {
		return err // session_limit, stopping, workspace busy, or the worker's refusal (problemOf)
	}
	v := ss.View()
	s.record(ctx, store.SessionOpened, "", map[string]any{"session": ss.ID, "workspace": body.Workspace,
		"limits": req.Limits, "env": envNames(req.Env), "layers": v.Enforcement.ActiveLayers()})
	c.Response().Header().Set("Location", "/v1/sessions/"+ss.ID)
	return c.JSON(http.StatusCreated, v)
}

// forkSession makes a new session from another's state, with a copy of its
// workspace as its private one (sessions.Manager.Fork).
func (s *Server) forkSession(c echo.Context) error {
	ctx := c.Request().Context()
	peer, _ := PeerFrom(ctx)
	if err := s.accepting(); err != nil {
		return err
	}
	ss, err := s.o.Sessions.Fork(ctx, c.Param("id"), peer.Caller())
	if err != nil {
		return err
	}
	v := ss.View()
	s.record(ctx, store.SessionOpened, "", map[string]any{"session": ss.ID, "forked_from": ss.ForkedFrom,
		"limits": ss.Limits, "layers": v.Enforcement.ActiveLayers()})
	c.Response().Header().Set("Location", "/v1/sessions/"+ss.ID)
	return c.JSON(http.StatusCreated, v)
}

// SessionHooks are what the daemon's sessions need of the API: a named workspace
// marked in use while a session's worker holds it, and an audit record for each
// change of a session's life (session.paused, session.resumed, session.lost,
// session.closed), in its caller's name.
func (s *Server) SessionHooks() sessions.Hooks {
	kinds := map[sessions.Event]store.Kind{sessions.Paused: store.SessionPaused,
		sessions.Resumed: store.SessionResumed, sessions.Lost: store.SessionLost,
		sessions.Closed: store.SessionClosed}
	return sessions.Hooks{
		Acquire: func(id string) (func(), error) {
			if err := s.acquire(id); err != nil {
				return nil, acquireError(id, err)
			}
			return func() { s.release(id) }, nil
		},
		Event: func(ss *sessions.Session, e sessions.Event, detail map[string]any) {
			detail["session"] = ss.ID
			s.o.Audit.Record(context.Background(), kinds[e], ss.Caller, "", detail)
		},
	}
}

func (s *Server) listSessions(c echo.Context) error {
	peer, _ := PeerFrom(c.Request().Context())
	views := []wire.SessionView{}
	for _, ss := range s.o.Sessions.List(peer.Caller()) {
		views = append(views, ss.View())
	}
	return c.JSON(http.StatusOK, map[string]any{"sessions": views})
}

func (s *Server) getSession(c echo.Context) error {
	peer, _ := PeerFrom(c.Request().Context())
	ss, err := s.o.Sessions.Get(c.Param("id"), peer.Caller())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ss.View())
}

func (s *Server) deleteSession(c echo.Context) error {
	ctx := c.Request().Context()
	peer, _ := PeerFrom(ctx)
	if err := s.o.Sessions.Close(c.Param("id"), peer.Caller()); err != nil {
		return err // its session.closed record is written as it ends
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) runCell(c echo.Context) error {
	ctx := c.Request().Context()
	peer, _ := PeerFrom(ctx)
	if err := s.accepting(); err != nil {
		return err
	}
	ss, err := s.o.Sessions.Get(c.Param("id"), peer.Caller())
	if err != nil {
		return err
	}
	var body wire.CellRequest
	if err := s.decode(c, &body); err != nil {
		return err
	}
	if body.Code == "" {
		return fail(wire.CodeBadRequest, "code is required")
	}
	if body.Limits.MemoryMiB != 0 || body.Limits.Fuel != 0 {
		return fail(wire.CodeLimitExceeded, "limits.memory_mib and limits.fuel are the session's: give them when it is opened")
	}
	// The cell's limits: the session's, lowered where the body asks.
	lim := ss.Limits
	cell, err := s.request(wire.RunRequest{Code: body.Code, Stdin: body.Stdin, StdinEncoding: body.StdinEncoding,
		Limits: wire.RunLimits{TimeoutMS: body.Limits.TimeoutMS, CPUMS: body.Limits.CPUMS, MaxOutputBytes: body.Limits.MaxOutputBytes}})
	if err != nil {
		return err
	}
	if body.Limits.TimeoutMS != 0 {
		lim.TimeoutMS = min(lim.TimeoutMS, cell.Limits.TimeoutMS)
	}
	if body.Limits.CPUMS != 0 {
		lim.CPUMS = cell.Limits.CPUMS
		if ss.Limits.CPUMS > 0 {
			lim.CPUMS = min(lim.CPUMS, ss.Limits.CPUMS)
		}
	}
	if body.Limits.MaxOutputBytes != 0 {
		lim.MaxStdoutBytes = min(lim.MaxStdoutBytes, cell.Limits.MaxStdoutBytes)
		lim.MaxStderrBytes = min(lim.MaxStderrBytes, cell.Limits.MaxStderrBytes)
	}
	cell.Limits = lim
	// What can never run is refused before an approval is asked for or spent.
	if err := sandbox.CheckCell(cell); err != nil {
		return err
	}
	// The gate: what decides the cell, as it will run (its session's state is what
	// the session's earlier cells, each through this gate, left).
	gate := codeRequest{kind: "cell", dir: ss.WorkspaceDir(), approval: body.Approval,
		subject: map[string]any{"code": body.Code, "stdin": string(cell.Stdin), "stdin_sha256": sha256Hex(cell.Stdin),
			"session": ss.ID, "workspace": ss.Workspace, "env": ss.Env(), "limits": lim}}
	if body.Approval == "" {
		// Held before the session is taken (or resumed) for it.
		if _, err := s.admitCode(ctx, gate); err != nil {
			return err
		}
	}
	sum := sha256Hex([]byte(body.Code))
	detail := map[string]any{"session": ss.ID, "code_sha256": sum, "limits": lim, "stdin_bytes": len(cell.Stdin)}
	if s.o.RecordCode {
		detail["code"] = body.Code
	}
	// With Accept: text/event-stream the answer is a stream of the cell's output
	// as it comes, then the answer (see cellEvents); it starts at the first output,
	// so a refusal before the cell runs is a problem document as any.
	var stream *cellEvents
	var observe sandbox.Observer
	if acceptsEvents(c.Request()) {
		stream = &cellEvents{w: c.Response()}
		observe = stream.output
	}
	// No record, no cell: the cell is audited once it holds the session, before its
	// code runs.
	unhold := func() {}
	defer func() { unhold() }()
	if tools := s.guestTools(peer, ss.ID, body.Code); tools != nil {
		ctx = sandbox.WithTools(ctx, tools(""))
	}
	out, state, err := s.o.Sessions.Cell(ctx, ss.ID, peer.Caller(), cell, observe, func() error {
		if body.Approval != "" {
			// An approval is spent once the cell holds its session, with its
			// workspace held alone (a named one: the session's own use is the one
			// left; a private one is the session's alone), as the cell will run.
			if ss.Workspace != "" {
				undo, ok := s.holdAlone(ss.Workspace)
				if !ok {
					return failf(wire.CodeWorkspaceBusy, "workspace %s: approved code runs with nothing else in its workspace, and a run, another session, a statement or an upload is using it", ss.Workspace)
				}
				unhold = undo
			}
			gate.held = true
			approval, err := s.admitCode(ctx, gate)
			if err != nil {
				return err
			}
			detail["approval"] = approval
		}
		if err := s.record(ctx, store.SessionCell, "", detail); err != nil {
			if body.Approval != "" {
				s.o.Approvals.Restore(body.Approval) // nothing ran: it stays usable
			}
			return fail(wire.CodeAuditDown, "the audit log cannot be written: "+err.Error()).audited()
		}
		return nil
	})
	unhold() // the cell is over: its workspace is shared again before the answer
	unhold = func() {}
	if err != nil {
		if stream != nil && stream.started() {
			// Past the status line: the failure is the stream's last event.
			s.record(ctx, store.SessionCellFinished, "", map[string]any{"session": ss.ID, "code_sha256": sum,
				"state": wire.SessionLost, "error": err.Error()})
			return stream.problem(err)
		}
		return err
	}
	res := out.Result
	stdout, stderr := res.Streams()
	s.record(ctx, store.SessionCellFinished, "", map[string]any{"session": ss.ID, "code_sha256": sum,
		"state": state, "reason": res.Reason, "exit_code": res.ExitCode, "elapsed_ms": res.ElapsedMS,
		"stdout_bytes": stdout.Len(), "stderr_bytes": stderr.Len(), "value_bytes": len(out.Value),
		"diagnostics": res.Diagnostics})
	answer := wire.CellAnswer{State: state, Value: out.Value, ValueTruncated: out.ValueTruncated, Result: res,
		Session: ss.View()}
	if stream != nil {
		return stream.answer(answer)
	}
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	c.Response().WriteHeader(http.StatusOK)
	return answer.WriteJSON(c.Response())
}

// acceptsEvents says the request asks for server-sent events.
func acceptsEvents(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			if mt, _, _ := strings.Cut(strings.TrimSpace(part), ";"); strings.EqualFold(mt, "text/event-stream") {
				return true
			}
		}
	}
	return false
}

// cellEvents answers a cell with server-sent events: "stdout" and "stderr" events
// (as GET /v1/runs/{id}/events's, each chunk's last with an id) as the worker
// produces the output, then one "answer" event with the cell's answer as the JSON
// answer would be (its result holding the output too), or one "error" event with a
// problem document when the session failed after the output began; then the
// stream ends. A cell cannot be resumed: there is no Last-Event-ID.
type cellEvents struct {
	w    *echo.Response
	mu   sync.Mutex
	sent bool // the status and headers
	next int  // the next chunk's id
	gone bool // the client stopped reading
}

// start sends the status and headers once; c.mu is held.
func (c *cellEvents) start() {
	if c.sent {
		return
	}
	c.sent = true
	h := c.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	c.w.WriteHeader(http.StatusOK)
}

func (c *cellEvents) started() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent
}

// cellEventWait bounds each write of a cell's events: a client that stops reading
// loses its stream (the rest of the output is in the answer it no longer reads)
// rather than holding the worker's output, and so the cell, its session and its
// place.
const cellEventWait = 2 * time.Second

// output is the cell's observer.
func (c *cellEvents) output(stream string, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start()
	if c.gone {
		return
	}
	http.NewResponseController(c.w).SetWriteDeadline(time.Now().Add(cellEventWait))
	if !writeChunk(c.w, c.next, stream, b) || http.NewResponseController(c.w).Flush() != nil {
		c.gone = true
		return
	}
	c.next++
}

func (c *cellEvents) answer(a wire.CellAnswer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start()
	http.NewResponseController(c.w).SetWriteDeadline(time.Now().Add(cellEventWait))
	fmt.Fprint(c.w, "event: answer\ndata: ")
	a.WriteJSON(c.w)
	fmt.Fprint(c.w, "\n\n")
	c.w.Flush()
	return nil
}

func (c *cellEvents) problem(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, _ := json.Marshal(AsProblem(err))
	http.NewResponseController(c.w).SetWriteDeadline(time.Now().Add(cellEventWait))
	fmt.Fprintf(c.w, "event: error\ndata: %s\n\n", b)
	c.w.Flush()
	return nil
}
