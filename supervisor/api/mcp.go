package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/mcpserver"
	"github.com/sandcell/sandcell/supervisor/toolbroker"
	"github.com/sandcell/sandcell/supervisor/tools"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// The agent tools over HTTP: GET /v1/tools, and MCP's streamable HTTP at /mcp.
//
// An MCP session belongs to the caller who opened it (its uid on the socket, its
// token over TCP): a request naming another caller's session is answered 404, as if
// the session did not exist. Each tool call is a request to this same API, made in
// process as that caller, so it passes the same roles, policy and audit.

// mcpSessionHeader names a streamable HTTP session (MCP's transport).
const mcpSessionHeader = "Mcp-Session-Id"

// The sessions /mcp keeps: at most maxMCPSessionsPerCaller open for one caller
// (429 session_limit beyond), each ended after mcpSessionIdle without a request.
// A session costs the daemon its state (a workspace id, the SDK's buffers), and a
// caller who opens them in a loop must not make it keep them all.
const (
	maxMCPSessionsPerCaller = 16
	mcpSessionIdle          = 30 * time.Minute
)

// The bounds of one /mcp message, checked before the SDK decodes it: its bytes (the
// largest tool arguments, with room for the envelope), its JSON values (decoded,
// each costs tens of bytes of Go values: a body of tiny values would cost fifty
// times its size) and its nesting. A batch (an array of messages, which the
// protocol's versions since 2025-06-18 no longer have) is refused.
const (
	maxMCPBodyBytes = tools.MaxMessageBytes
	maxMCPValues    = 50_000
	maxMCPDepth     = 64
)

// mcpHTTP is the MCP server of /mcp and who owns each of its sessions.
type mcpHTTP struct {
	server  *mcpserver.Server
	handler http.Handler
	owners  sync.Map     // session id -> Peer
	posts   atomic.Int64 // POSTs in flight (tool calls among them)

	openMu  sync.Mutex
	opening map[identity.Caller]int // new sessions being made, by caller
}

// reserve takes one of caller's session places for a session being made (until
// release), or says that none is left.
func (m *mcpHTTP) reserve(caller identity.Caller) error {
	m.openMu.Lock()
	defer m.openMu.Unlock()
	m.forget()
	n := m.opening[caller]
	m.owners.Range(func(_, owner any) bool {
		if owner.(Peer).Caller() == caller {
			n++
		}
		return true
	})
	if n >= maxMCPSessionsPerCaller {
		return failf(wire.CodeSessionLimit, "%d MCP sessions are open for this caller: end one (DELETE /mcp) or let one idle out (%v)",
			n, mcpSessionIdle)
	}
	m.opening[caller]++
	return nil
}

// release gives back a place reserve took (the session, if made, now has its owner).
func (m *mcpHTTP) release(caller identity.Caller) {
	m.openMu.Lock()
	defer m.openMu.Unlock()
	if m.opening[caller]--; m.opening[caller] <= 0 {
		delete(m.opening, caller)
	}
}

// checkMCPBody reads a POST's body within its bounds (maxMCPBodyBytes, maxMCPValues,
// maxMCPDepth), refuses a batch and what the API's own bodies may not hold (a
// member given twice, an escaped lone surrogate: see checkKeys), and puts the body
// back for the SDK.
func (s *Server) checkMCPBody(c echo.Context) error {
	r := c.Request()
	if r.ContentLength > maxMCPBodyBytes {
		return failf(wire.CodeBodyTooLarge, "an MCP message is at most %d bytes", maxMCPBodyBytes)
	}
	raw, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, maxMCPBodyBytes))
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		return failf(wire.CodeBodyTooLarge, "an MCP message is at most %d bytes", maxMCPBodyBytes)
	case err != nil:
		return problemOf(err)
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
	if !utf8.Valid(raw) {
		return fail(wire.CodeInvalidJSON, "the body is not valid UTF-8")
	}
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) > 0 && t[0] == '[' {
		return fail(wire.CodeBadRequest, "a JSON-RPC batch: send one message per request")
	}
	// One message, and nothing after it (the SDK would read the first and drop the
	// rest unseen).
	one := json.NewDecoder(bytes.NewReader(raw))
	var msg json.RawMessage
	if one.Decode(&msg) == nil && len(bytes.TrimSpace(raw[one.InputOffset():])) > 0 {
		return fail(wire.CodeInvalidJSON, "more than one JSON value in the body")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	values, depth := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			break // the end, or a syntax error, which is the SDK's to answer
		}
		values++
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if values > maxMCPValues || depth > maxMCPDepth {
			return failf(wire.CodeBodyTooLarge, "an MCP message holds at most %d JSON values, nested at most %d deep",
				maxMCPValues, maxMCPDepth)
		}
	}
	if code, err := checkKeys(raw); err != nil {
		return fail(code, err.Error())
	}
	return nil
}

// forget drops the owners of sessions that have ended.
func (m *mcpHTTP) forget() {
	live := m.server.Sessions()
	m.owners.Range(func(id, _ any) bool {
		if !live[id.(string)] {
			m.owners.Delete(id)
		}
		return true
	})
}

// closeWhenIdle ends every session once no POST is in flight, or when ctx ends.
func (m *mcpHTTP) closeWhenIdle(ctx context.Context) {
	for m.posts.Load() > 0 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	m.server.Close()
}

// newMCP builds /mcp's server over s's own handler.
func (s *Server) newMCP(version string) *mcpHTTP {
	m := &mcpHTTP{opening: map[identity.Caller]int{}}
	m.server = mcpserver.New(mcpserver.Options{
		Version:     version,
		GuestTools:  s.guestSummary,
		Unavailable: func(context.Context) string { return s.toolsUnavailable() },
		// A caller's sessions share its workspace: an agent host that reconnects (or
		// opens many sessions) finds its files, and holds one workspace, not one a
		// session.
		Owner: func(session string) string {
			if p, ok := m.owners.Load(session); ok {
				c := p.(Peer).Caller()
				return fmt.Sprintf("uid %d token %q", c.UID, c.Token)
			}
			return session
		},
		Backend: func(session string) mcpserver.Backend {
			p, ok := m.owners.Load(session)
			if !ok {
				return nil
			}
			return client.NewHTTP(&http.Client{Transport: inProcess{h: s.echo, peer: p.(Peer)}})
		},
	})
	m.handler = m.server.HTTPHandler(maxMCPBodyBytes, mcpSessionIdle)
	return m
}

// serveMCP answers /mcp for the caller (past require).
func (s *Server) serveMCP(c echo.Context) error {
	peer, _ := PeerFrom(c.Request().Context())
	if id := c.Request().Header.Get(mcpSessionHeader); id != "" {
		owner, ok := s.mcp.owners.Load(id)
		if !ok || owner.(Peer).Caller() != peer.Caller() {
			return fail(wire.CodeNotFound, "no MCP session "+id)
		}
	}
	if c.Request().Method == http.MethodPost {
		if err := s.checkMCPBody(c); err != nil {
			return err
		}
	}
	if id := c.Request().Header.Get(mcpSessionHeader); id != "" && c.Request().Method == http.MethodDelete {
		// The client ends its session: its interpreter ends before the answer.
		s.mcp.server.CloseCellsOf(id)
	}
	reserved := false
	if c.Request().Header.Get(mcpSessionHeader) == "" && c.Request().Method == http.MethodPost {
		// A new session: within the caller's share, counting those being made.
		if err := s.mcp.reserve(peer.Caller()); err != nil {
			return err
		}
		reserved = true
		defer func() {
			if reserved {
				s.mcp.release(peer.Caller())
			}
		}()
	}
	if c.Request().Method == http.MethodPost {
		s.mcp.posts.Add(1)
		defer s.mcp.posts.Add(-1)
	}
	w := &sessionRecorder{ResponseWriter: c.Response().Writer, record: func(id string) {
		// The place reserved becomes the session's, in one step: a burst of new
		// sessions is counted once each.
		s.mcp.openMu.Lock()
		defer s.mcp.openMu.Unlock()
		if _, loaded := s.mcp.owners.LoadOrStore(id, peer); !loaded && reserved {
			reserved = false
			if s.mcp.opening[peer.Caller()]--; s.mcp.opening[peer.Caller()] <= 0 {
				delete(s.mcp.opening, peer.Caller())
			}
		}
	}, none: func() {
		// No session was made: the place is free before the answer is.
		if reserved {
			reserved = false
			s.mcp.release(peer.Caller())
		}
	}}
	s.mcp.handler.ServeHTTP(w, c.Request())
	return nil
}

// sessionRecorder notes the session id an answer gives (the one of a new session).
type sessionRecorder struct {
	http.ResponseWriter
	record func(id string) // an answer that names a session
	none   func()          // one that names none
	wrote  bool
}

func (w *sessionRecorder) WriteHeader(status int) {
	if w.wrote {
		return
	}
	w.wrote = true
	if id := w.Header().Get(mcpSessionHeader); id != "" {
		w.record(id)
	} else {
		w.none()
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *sessionRecorder) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

func (w *sessionRecorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// WatchTools offers /mcp's tools or withdraws them as the daemon's state changes,
// looking every interval until ctx ends; sessions are notified of each change.
func (s *Server) WatchTools(ctx context.Context, interval time.Duration) {
	s.mcp.server.Watch(ctx, interval)
}

// toolsUnavailable says why the tools are not offered now, or "".
func (s *Server) toolsUnavailable() string {
	switch {
	case s.stopping.Load():
		return "the daemon is stopping"
	case s.o.Disabled():
		return "runs are disabled by the operator (the kill switch is on)"
	}
	return s.o.Health.Why()
}

// tools answers GET /v1/tools: the agent tools, and the tools a guest of the
// caller's may call (guest_tools: sandcell.tools in the guest).
func (s *Server) tools(c echo.Context) error {
	listing := struct {
		tools.Listing
		GuestTools []toolbroker.Source `json:"guest_tools"`
	}{Listing: tools.NewListing(s.toolsUnavailable(), s.guestSummary()), GuestTools: []toolbroker.Source{}}
	if s.o.Tools != nil {
		peer, _ := PeerFrom(c.Request().Context())
		listing.GuestTools = s.o.Tools.List(c.Request().Context(), s.allowsFor(peer))
	}
	return c.JSON(http.StatusOK, listing)
}

// guestSummary lists the guest tools for the agent tools' descriptions ("": none).
func (s *Server) guestSummary() string {
	if s.o.Tools == nil {
		return ""
	}
	return s.o.Tools.Summary()
}

// guestTools returns what answers the tool calls of a run (given its ID) or of a
// session's cell (session not "") that peer starts with program, with the roles
// peer holds now; nil when no tools are declared.
func (s *Server) guestTools(peer Peer, session, program string) func(runID string) sandbox.Tools {
	if s.o.Tools == nil {
		return nil
	}
	allows := s.allowsFor(peer)
	return func(runID string) sandbox.Tools {
		return s.o.Tools.For(toolbroker.Scope{Caller: peer.Caller(), Allows: allows, RunID: runID,
			Session: session, Program: program})
	}
}

// allowsFor says which roles peer holds now.
func (s *Server) allowsFor(peer Peer) func(role string) bool {
	a := s.access()
	return func(role string) bool { return a.Allows(peer, Role(role)) }
}

// inProcess sends a request to the API's own handler as peer, without a
// connection: what a tool call of an MCP session does.
type inProcess struct {
	h    http.Handler
	peer Peer
}

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	// The call's cancellation, but none of its values: the request is the peer's,
	// not the connection's that carried the MCP message.
	ctx := context.WithValue(valueless{req.Context()}, peerKey{}, t.peer)
	req = req.Clone(ctx)
	req.RemoteAddr = "in-process"
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, body: pw, ready: make(chan struct{})}
	go func() {
		defer pw.Close()
		t.h.ServeHTTP(w, req)
		w.WriteHeader(http.StatusOK) // if the handler wrote nothing
	}()
	<-w.ready
	size := int64(-1)
	if n, err := strconv.ParseInt(w.sent.Get("Content-Length"), 10, 64); err == nil {
		size = n
	}
	return &http.Response{Status: strconv.Itoa(w.status) + " " + http.StatusText(w.status), StatusCode: w.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: w.sent, Body: pr, ContentLength: size, Request: req}, nil
}

// valueless is a context's deadline and cancellation without its values.
type valueless struct{ context.Context }

func (valueless) Value(any) any { return nil }

// pipeWriter is a ResponseWriter whose body is read from the other end of a pipe.
type pipeWriter struct {
	header http.Header
	body   *io.PipeWriter
	status int
	sent   http.Header // the headers as they were at WriteHeader
	once   sync.Once
	ready  chan struct{} // closed when status and sent are known
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(status int) {
	w.once.Do(func() { w.status, w.sent = status, w.header.Clone(); close(w.ready) })
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

func (w *pipeWriter) Flush() {}
