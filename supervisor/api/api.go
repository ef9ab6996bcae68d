// Package api is the daemon's HTTP API (labstack/echo v4) on a Unix socket. Every
// error is an RFC 9457 problem document (application/problem+json) with a stable
// "code" member; the codes are wire's Code* constants, listed in wire.Codes.
//
// The files: api.go the server, its options and routes; auth.go who may do what;
// errors.go the one error edge (handlers return errors; one table gives each
// its status and code; refusals are recorded there) and strict decoding; gate.go the one gate of
// code held for approval (runs and cells); runs.go runs; events.go their
// event streams; workspaces.go workspaces and their use; sql.go statements and
// approvals; peer.go and tokens.go callers' identities and connection bounds.
package api

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"

	"github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/healthz"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/approvals"
	"github.com/sandcell/sandcell/supervisor/audit"
	"github.com/sandcell/sandcell/supervisor/e2b"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/runs"
	"github.com/sandcell/sandcell/supervisor/sessions"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/toolbroker"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the API's contract (OpenAPI 3.1, JSON), served at /v1/openapi.json.
func OpenAPI() []byte { return slices.Clone(openAPI) }

// Statuses lists, per route ("METHOD /path" as echo names it), every status the
// route answers with. TestOpenAPI checks that the document and this list agree and
// that the server has exactly these routes.
func Statuses() map[string][]int {
	return map[string][]int{
		"GET /livez":              {200, 503},
		"GET /healthz":            {200, 503},
		"GET /readyz":             {200, 503},
		"GET /metrics":            {200},
		"GET /v1/openapi.json":    {200},
		"GET /v1/info":            {200, 401, 403},
		"POST /v1/runs":           {200, 202, 400, 401, 403, 404, 408, 409, 413, 415, 429, 500, 503, 507},
		"GET /v1/runs/:id":        {200, 401, 403, 404},
		"DELETE /v1/runs/:id":     {200, 401, 403, 404, 500},
		"GET /v1/runs/:id/events": {200, 400, 401, 403, 404},
		"GET /v1/audit":           {200, 400, 401, 403, 500},

		"POST /v1/workspaces":               {201, 401, 403, 500, 503, 507},
		"GET /v1/workspaces/:id":            {200, 401, 403, 404, 500},
		"DELETE /v1/workspaces/:id":         {204, 401, 403, 404, 409, 500},
		"PUT /v1/workspaces/:id/files/*":    {201, 400, 401, 403, 404, 408, 409, 500, 507},
		"GET /v1/workspaces/:id/files/*":    {200, 400, 401, 403, 404, 409, 500},
		"DELETE /v1/workspaces/:id/files/*": {204, 400, 401, 403, 404, 409, 500},

		"POST /v1/sql": {200, 400, 401, 403, 404, 409, 413, 415, 422, 429, 500, 503},

		"POST /v1/sessions":           {201, 400, 401, 403, 404, 408, 409, 413, 415, 429, 500, 503, 507},
		"GET /v1/sessions":            {200, 401, 403},
		"GET /v1/sessions/:id":        {200, 401, 403, 404},
		"DELETE /v1/sessions/:id":     {204, 401, 403, 404, 409},
		"POST /v1/sessions/:id/cells": {200, 400, 401, 403, 404, 408, 409, 410, 413, 415, 500, 503, 507},
		"POST /v1/sessions/:id/fork":  {201, 401, 403, 404, 409, 410, 429, 500, 503, 507},
		"GET /v1/tools":               {200, 401, 403},
		"POST /mcp":                   {200, 202, 400, 401, 403, 404, 406, 413, 415, 429},
		"GET /mcp":                    {200, 400, 401, 403, 404, 405, 406},
		"DELETE /mcp":                 {204, 400, 401, 403, 404},
		"GET /v1/approvals":           {200, 400, 401, 403},
		"GET /v1/approvals/:id":       {200, 401, 403, 404},
		"POST /v1/approvals/:id":      {200, 400, 401, 403, 404, 408, 409, 413, 415, 503},

		"POST /v1/approvals/:id/confirm": {200, 400, 401, 403, 404, 408, 409, 413, 415, 503},

		// E2B's API and a sandbox's services (supervisor/e2b): a status the calls it
		// makes answered passes through; 502 where the API itself could not answer.
		"POST /e2b/v2/sandboxes":             {201, 400, 401, 403, 404, 409, 429, 500, 502, 503, 507},
		"POST /e2b/sandboxes":                {201, 400, 401, 403, 404, 409, 429, 500, 502, 503, 507},
		"GET /e2b/sandboxes/:id":             {200, 401, 403, 404, 502},
		"DELETE /e2b/sandboxes/:id":          {204, 401, 403, 404, 409, 500, 502},
		"GET /e2b/sandboxes":                 {200, 401, 403},
		"GET /e2b/v2/sandboxes":              {200, 401, 403},
		"POST /e2b/sandboxes/:id/connect":    {200, 401, 403, 404},
		"POST /e2b/v2/sandboxes/:id/connect": {200, 401, 403, 404},
		"POST /e2b/sandboxes/:id/timeout":    {204, 400, 401, 403, 404},
		"GET /e2b/*":                         {401, 403, 501},
		"POST /e2b/*":                        {401, 403, 501},
		"DELETE /e2b/*":                      {401, 403, 501},
		"GET /e2b/sandbox/health":            {204, 502},
		"POST /e2b/sandbox/files":            {200, 400, 403, 404, 409, 413, 415, 500, 502, 507},
		"GET /e2b/sandbox/files":             {200, 400, 403, 404, 409, 413, 500, 502},
		"POST /e2b/sandbox/execute":          {200, 400, 403, 404, 409, 429, 500, 502, 503},
		"POST /e2b/sandbox/*":                {200, 404, 501},
	}
}

// Auditor records decisions (an error means nothing was recorded) and reads them back.
type Auditor interface {
	Record(ctx context.Context, kind store.Kind, who identity.Caller, runID string, detail any) error
	// RecordRefusal records a refusal, or only logs it while the log is known not
	// to be writable (audit.Writer.RecordRefusal): a refusal waits for no lock.
	RecordRefusal(ctx context.Context, kind store.Kind, who identity.Caller, detail any) error
	// Events returns up to limit records with seq > after, oldest first, only those
	// of runID when it is not empty.
	Events(ctx context.Context, after int64, runID string, limit int) (any, error)
}

// The daemon's parts are what the API needs (checked when it compiles).
var (
	_ Service = (*runs.Manager)(nil)
	_ Auditor = (*audit.Writer)(nil)
)

// Service is what the API needs from the daemon.
type Service interface {
	// Start admits a run; ended (if not nil) is called once it no longer uses its
	// workspace, before its end is visible.
	// tools, if not nil, gives the run (by its ID) what answers its guest's tool
	// calls.
	Start(req protocol.Request, caller identity.Caller, ended func(), tools func(runID string) sandbox.Tools) (*runs.Run, error)
	// Get returns the run, whose Output and Done the event stream follows.
	Get(id string) (*runs.Run, error)
	Cancel(id string) (*runs.Run, error)
	// Do runs a job that is not a run (a SQL statement's worker) to its end and
	// keeps nothing of it.
	Do(ctx context.Context, kind runs.JobKind, req protocol.Request, caller identity.Caller) (protocol.Result, error)
}

// Options configure a Server.
type Options struct {
	Service Service
	Access  Access
	Policy  policy.Policy
	// MaxBodyBytes bounds a request body (413 above it).
	MaxBodyBytes int64
	// Module returns the interpreter of a wasm job with or without fuel: a Request
	// with ModulePath and LibDir set, and without fuel EpochlessModulePath
	// (selftest's Interpreter).
	Module func(fuel bool) (protocol.Request, error)
	// Native returns the verified native root for a run on the native backend, or
	// why there is none; nil means the backend is not offered.
	Native func() (root string, err error)
	// Disabled reports the kill switch.
	Disabled func() bool
	// Ready reports whether the sandbox has been verified, and why not.
	Health *healthz.Registry
	// Info is the body of GET /v1/info.
	Info func() any
	// Metrics, if set, is served at GET /metrics (Prometheus text format).
	Metrics http.Handler
	// Audit records every request, decision and refusal.
	Audit Auditor
	// RecordCode puts each run's code in the audit log, not only its SHA-256.
	RecordCode bool
	// ReadTimeout bounds reading a request, body included; 0 means 30 s.
	ReadTimeout time.Duration
	// Version is the daemon's, as the MCP server names itself.
	Version string
	// Workspaces, if set, serves /v1/workspaces and lets runs name a workspace.
	Workspaces *workspace.Store
	// Approvals holds requests for approval; ApprovalActions names the actions that
	// need one (ActionSQLWrite).
	Approvals       *approvals.Queue
	ApprovalActions []string
	// Elicitation names the callers ("socket", "tcp") whose own confirmation, asked
	// at their MCP client, approves their request (POST /v1/approvals/{id}/confirm).
	Elicitation []string
	// Sessions keeps the interpreter sessions of /v1/sessions.
	Sessions *sessions.Manager
	// Tools, if set, answers the tool calls of runs' and cells' guests ([tools]).
	Tools *toolbroker.Broker
}

// Server is the HTTP API.
type Server struct {
	o    Options
	echo *echo.Echo
	// The parts a configuration reload may change (SetAccess, SetPolicy).
	acc atomic.Pointer[Access]
	pol atomic.Pointer[policy.Policy]

	// denials bounds the audit records of unauthenticated TCP callers (10 a second):
	// remote callers without a token cannot grow the audit log (fsynced, kept for
	// months) as fast as they send requests; the next record counts those left out.
	denials *rate.Limiter
	skipped atomic.Int64

	// Workspaces in use by runs and statements, and those being deleted.
	wsMu     sync.Mutex
	inUse    map[string]int
	alone    map[string]*aloneHold // in use by one holder only (an approved write or code), its mark
	deleting map[string]bool

	// mcp serves /mcp; stopping withdraws its tools once Shutdown has begun.
	mcp      *mcpHTTP
	e2b      *e2b.Server
	stopping atomic.Bool
}

// e2bAPIKey takes E2B's API key (X-API-KEY, which E2B's SDKs send) as the bearer
// token of a request that carries none.
func e2bAPIKey(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Request().Header
		if k := h.Get("X-API-KEY"); k != "" && h.Get("Authorization") == "" {
			h.Set("Authorization", "Bearer "+k)
		}
		return next(c)
	}
}

// healthPaths are the endpoints answered on a connection that holds a probe slot.
var healthPaths = map[string]bool{"/livez": true, "/healthz": true, "/readyz": true}

// SetAccess replaces who may do what (a configuration reload); requests already
// admitted keep the access they were admitted with.
func (s *Server) SetAccess(a Access) { s.acc.Store(&a) }

// SetPolicy replaces the limits, environment allowlist and hardening of runs
// admitted from now on (a configuration reload).
func (s *Server) SetPolicy(p policy.Policy) { s.pol.Store(&p) }

func (s *Server) access() *Access        { return s.acc.Load() }
func (s *Server) policy() *policy.Policy { return s.pol.Load() }

// New builds the server and its routes.
func New(o Options) *Server {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	s := &Server{o: o, echo: e, inUse: map[string]int{}, alone: map[string]*aloneHold{}, deleting: map[string]bool{},
		denials: rate.NewLimiter(10, 10)}
	s.SetAccess(o.Access)
	s.SetPolicy(o.Policy)
	e.HTTPErrorHandler = s.errorHandler
	// Each request notes whether it has written an audit record (see recordRefusal).
	e.Pre(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.SetRequest(c.Request().WithContext(context.WithValue(c.Request().Context(), recordedKey{}, new(atomic.Bool))))
			return next(c)
		}
	})
	e.Server.ConnContext = ConnContext
	e.Server.ConnState = ConnState
	// A connection that has presented no valid token (a probe's, a stranger's) is
	// closed after its answer, and its request's unread body is never waited for:
	// a client that announces a body and sends none cannot hold a slot for the read
	// timeout (a valid token removes the header; see require).
	e.Pre(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			lc, ok := c.Request().Context().Value(connKey{}).(*limitedConn)
			if !ok || lc.authenticated.Load() {
				return next(c)
			}
			c.Response().Header().Set("Connection", "close")
			if lc.probe && !healthPaths[c.Request().URL.Path] {
				lc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				return fail(wire.CodeConnLimit,
					"every connection to the daemon is in the middle of a request: this one is kept for /livez, /healthz and /readyz")
			}
			err := next(c)
			if !lc.authenticated.Load() {
				// The server would read up to 256 KiB of an unread body before
				// closing, for as long as the read timeout allows.
				lc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			}
			return err
		}
	})
	// Slow clients cannot hold a connection: headers within 5 s, a body within 30 s.
	// No write timeout: a synchronous run answers when it ends (at most the maximum
	// timeout).
	e.Server.ReadHeaderTimeout = 5 * time.Second
	e.Server.ReadTimeout = o.ReadTimeout
	if o.ReadTimeout == 0 {
		e.Server.ReadTimeout = 30 * time.Second
	}
	e.Server.IdleTimeout = 2 * time.Minute
	e.Server.MaxHeaderBytes = 16 << 10

	live := echo.WrapHandler(healthz.Handler(o.Health.Live, wire.CodeNotAlive)) // (healthPaths)
	e.GET("/livez", live)
	e.GET("/healthz", live)
	e.GET("/readyz", echo.WrapHandler(healthz.Handler(o.Health.Ready, wire.CodeNotReady)))
	e.GET("/v1/openapi.json", func(c echo.Context) error { return c.Blob(http.StatusOK, "application/json", openAPI) })
	if o.Metrics != nil {
		e.GET("/metrics", echo.WrapHandler(o.Metrics))
	}
	// Per-route middleware, not a group's: a group's catch-all would turn 405 into 404.
	runner := s.require(RoleRunner)
	e.GET("/v1/info", s.info, runner)
	e.POST("/v1/runs", s.createRun, runner)
	e.GET("/v1/runs/:id", s.getRun, runner)
	e.DELETE("/v1/runs/:id", s.cancelRun, runner)
	e.GET("/v1/runs/:id/events", s.runEvents, runner)
	e.GET("/v1/audit", s.audit, s.require(RoleAdmin))
	e.POST("/v1/workspaces", s.createWorkspace, runner)
	e.GET("/v1/workspaces/:id", s.getWorkspace, runner)
	e.DELETE("/v1/workspaces/:id", s.deleteWorkspace, runner)
	e.PUT("/v1/workspaces/:id/files/*", s.putFile, runner)
	e.GET("/v1/workspaces/:id/files/*", s.getFile, runner)
	e.DELETE("/v1/workspaces/:id/files/*", s.deleteFile, runner)
	e.POST("/v1/sql", s.sql, runner)
	e.POST("/v1/sessions", s.createSession, runner, s.sessionsOn)
	e.GET("/v1/sessions", s.listSessions, runner, s.sessionsOn)
	e.GET("/v1/sessions/:id", s.getSession, runner, s.sessionsOn)
	e.DELETE("/v1/sessions/:id", s.deleteSession, runner, s.sessionsOn)
	e.POST("/v1/sessions/:id/cells", s.runCell, runner, s.sessionsOn)
	e.POST("/v1/sessions/:id/fork", s.forkSession, runner, s.sessionsOn)
	e.GET("/v1/tools", s.tools, runner)
	s.mcp = s.newMCP(o.Version)
	for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
		e.Add(method, "/mcp", s.serveMCP, runner)
	}
	// E2B's API and sandbox protocol, for E2B's own SDKs (supervisor/e2b): its API
	// with the caller's token as the API key, a sandbox's services with the sandbox's
	// access token; every call it makes comes back through this handler as the caller.
	s.e2b = e2b.New(e2b.Options{
		Caller: func(r *http.Request) (any, string, bool) {
			p, ok := PeerFrom(r.Context())
			c := p.Caller()
			return p, fmt.Sprintf("uid %d token %q", c.UID, c.Token), ok
		},
		Backend: func(who any) e2b.Backend {
			return client.NewHTTP(&http.Client{Transport: inProcess{h: s.echo, peer: who.(Peer)}})
		},
		Authenticated: func(r *http.Request) { authenticated(r.Context()) },
	})
	e2bSandbox := echo.WrapHandler(http.StripPrefix("/e2b/sandbox", s.e2b.Sandbox()))
	e.GET("/e2b/sandbox/health", e2bSandbox)
	e.POST("/e2b/sandbox/files", e2bSandbox)
	e.GET("/e2b/sandbox/files", e2bSandbox)
	e.POST("/e2b/sandbox/execute", e2bSandbox)
	e.POST("/e2b/sandbox/*", e2bSandbox)
	e2bAPI := echo.WrapHandler(http.StripPrefix("/e2b", s.e2b.API()))
	e.POST("/e2b/v2/sandboxes", e2bAPI, e2bAPIKey, runner)
	e.POST("/e2b/sandboxes", e2bAPI, e2bAPIKey, runner)
	e.GET("/e2b/sandboxes/:id", e2bAPI, e2bAPIKey, runner)
	e.DELETE("/e2b/sandboxes/:id", e2bAPI, e2bAPIKey, runner)
	e.GET("/e2b/sandboxes", e2bAPI, e2bAPIKey, runner)
	e.GET("/e2b/v2/sandboxes", e2bAPI, e2bAPIKey, runner)
	e.POST("/e2b/sandboxes/:id/connect", e2bAPI, e2bAPIKey, runner)
	e.POST("/e2b/v2/sandboxes/:id/connect", e2bAPI, e2bAPIKey, runner)
	e.POST("/e2b/sandboxes/:id/timeout", e2bAPI, e2bAPIKey, runner)
	for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		e.Add(method, "/e2b/*", e2bAPI, e2bAPIKey, runner) // the rest of E2B's API: not offered, in its shape
	}
	e.GET("/v1/approvals", s.listApprovals, s.require(RoleApprover))
	e.GET("/v1/approvals/:id", s.getApproval, s.require(RoleRunner, RoleApprover))
	e.POST("/v1/approvals/:id", s.decideApproval, s.require(RoleApprover))
	e.POST("/v1/approvals/:id/confirm", s.confirmApproval, runner)
	return s
}

// Routes returns "METHOD /path" of every route the server has.
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.echo.Routes() {
		out = append(out, r.Method+" "+r.Path)
	}
	return out
}

// Handler returns the server as an http.Handler (for tests).
func (s *Server) Handler() http.Handler { return s.echo }

// Serve answers requests on l until Shutdown.
func (s *Server) Serve(l net.Listener) error {
	err := s.echo.Server.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// EndMCPInterpreters ends the interpreter sessions /mcp's run_cell opened: MCP
// sessions over HTTP end with the daemon, so the daemon must not keep their
// interpreters (call it before the sessions are paused for the stop).
func (s *Server) EndMCPInterpreters() { s.mcp.server.CloseCells() }

// Shutdown stops accepting connections and waits for the open ones, at most until
// ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopping.Store(true)
	s.mcp.server.Refresh(ctx) // sessions hear that the tools are gone
	// Sessions' event streams would hold the shutdown to its end: close the
	// sessions once no tool call is in flight (each answers first).
	go s.mcp.closeWhenIdle(ctx)
	return s.echo.Server.Shutdown(ctx)
}

func (s *Server) info(c echo.Context) error { return c.JSON(http.StatusOK, s.o.Info()) }

// audit answers GET /v1/audit?after=SEQ&run=ID&limit=N (admins only): records in
// order, at most 1000 per page; page on with after= the last seq.
func (s *Server) audit(c echo.Context) error {
	after, limit := int64(0), 100
	if v := c.QueryParam("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fail(wire.CodeBadRequest, "after: a record number")
		}
		after = n
	}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return fail(wire.CodeBadRequest, "limit: 1 to 1000")
		}
		limit = n
	}
	evs, err := s.o.Audit.Events(c.Request().Context(), after, c.QueryParam("run"), limit)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"events": evs})
}
