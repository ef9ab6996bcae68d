// Package api is the daemon's HTTP API (labstack/echo v4) on a Unix socket. Every
// error is an RFC 9457 problem document (application/problem+json) with a stable
// "code" member; the codes are the Code* constants, listed in Codes.
package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"

	"github.com/sandcell/sandcell/healthz"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor"
	"github.com/sandcell/sandcell/supervisor/store"
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

		"POST /v1/sql":           {200, 400, 401, 403, 404, 409, 413, 415, 422, 429, 500, 503},
		"GET /v1/approvals":      {200, 400, 401, 403},
		"GET /v1/approvals/:id":  {200, 401, 403, 404},
		"POST /v1/approvals/:id": {200, 400, 401, 403, 404, 409, 413, 415},
	}
}

// problem answers a problem document (wire.NewProblem: the one way one is built).
func problem(c echo.Context, status int, code, detail string) error {
	return problemWith(c, status, code, detail, nil)
}

// problemWith answers a problem with extension members (RFC 9457 section 3.2).
func problemWith(c echo.Context, status int, code, detail string, ext map[string]any) error {
	return c.Blob(status, wire.ContentType, wire.NewProblem(status, code, detail).JSON(ext))
}

// Auditor records decisions (an error means nothing was recorded) and reads them back.
type Auditor interface {
	Record(ctx context.Context, kind store.Kind, who supervisor.Caller, runID string, detail any) error
	// Events returns up to limit records with seq > after, oldest first, only those
	// of runID when it is not empty.
	Events(ctx context.Context, after int64, runID string, limit int) (any, error)
}

// The daemon's parts are what the API needs (checked when it compiles).
var (
	_ Service = (*supervisor.Manager)(nil)
	_ Auditor = (*supervisor.Audit)(nil)
)

// Service is what the API needs from the daemon.
type Service interface {
	Start(req protocol.Request, caller supervisor.Caller) (*supervisor.Run, error)
	// Get returns the run, whose Output and Done the event stream follows.
	Get(id string) (*supervisor.Run, error)
	Cancel(id string) (*supervisor.Run, error)
	// Do runs a job that is not a run (a SQL statement's worker) to its end and
	// keeps nothing of it.
	Do(ctx context.Context, kind supervisor.JobKind, req protocol.Request, caller supervisor.Caller) (protocol.Result, error)
}

// Options configure a Server.
type Options struct {
	Service Service
	Access  Access
	Policy  policy.Policy
	// MaxBodyBytes bounds a request body (413 above it).
	MaxBodyBytes int64
	// Module returns the precompiled module and library directory for a run.
	Module func(fuel bool) (module, lib string, err error)
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
	// Workspaces, if set, serves /v1/workspaces and lets runs name a workspace.
	Workspaces *workspace.Store
	// Approvals holds requests for approval; ApprovalActions names the actions that
	// need one (ActionSQLWrite).
	Approvals       *supervisor.Approvals
	ApprovalActions []string
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
	alone    map[string]bool // in use by an approved SQL write only
	deleting map[string]bool
}

// healthPaths are the endpoints answered on a connection that holds a probe slot.
var healthPaths = map[string]bool{"/livez": true, "/healthz": true, "/readyz": true}

// Why a workspace cannot be acquired.
var (
	errWorkspaceGone = errors.New("the workspace is being deleted")
	errWorkspaceBusy = errors.New("the workspace is busy")
)

// acquire marks workspace id in use (it cannot be deleted meanwhile): errWorkspaceGone
// when it is being deleted, errWorkspaceBusy while an approved write holds it alone.
func (s *Server) acquire(id string) error { return s.use(id, false) }

// acquireAlone marks workspace id in use by nothing else (an approved SQL write: no
// run or upload may change the file between the worker's check of its bytes and the
// write); errWorkspaceBusy while anything else uses it.
func (s *Server) acquireAlone(id string) error { return s.use(id, true) }

func (s *Server) use(id string, alone bool) error {
	s.wsMu.Lock()
	defer s.wsMu.Unlock()
	switch {
	case s.deleting[id]:
		return errWorkspaceGone
	case s.alone[id]:
		return fmt.Errorf("%w: an approved SQL write holds it alone", errWorkspaceBusy)
	case alone && s.inUse[id] > 0:
		return fmt.Errorf("%w: a run, statement or upload is using it, and an approved write waits for none", errWorkspaceBusy)
	}
	s.inUse[id]++
	if alone {
		s.alone[id] = true
	}
	return nil
}

// soleUse reports whether the one use of workspace id is the caller's own (its
// acquire, shared or alone), and if so holds it alone until its release: nothing
// else may start in it meanwhile.
func (s *Server) soleUse(id string) bool {
	s.wsMu.Lock()
	defer s.wsMu.Unlock()
	if s.inUse[id] != 1 {
		return false
	}
	s.alone[id] = true
	return true
}

// acquireError answers a failed acquire.
func acquireError(c echo.Context, id string, err error) error {
	if errors.Is(err, errWorkspaceBusy) {
		return problem(c, http.StatusConflict, wire.CodeWorkspaceBusy, fmt.Sprintf("workspace %s: %v", id, err))
	}
	return problem(c, http.StatusNotFound, wire.CodeNotFound, "no workspace "+id)
}

func (s *Server) release(id string) {
	s.wsMu.Lock()
	defer s.wsMu.Unlock()
	if s.inUse[id]--; s.inUse[id] <= 0 {
		delete(s.inUse, id)
		delete(s.alone, id)
	}
}

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
	s := &Server{o: o, echo: e, inUse: map[string]int{}, alone: map[string]bool{}, deleting: map[string]bool{},
		denials: rate.NewLimiter(10, 10)}
	s.SetAccess(o.Access)
	s.SetPolicy(o.Policy)
	e.HTTPErrorHandler = s.errorHandler
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
				c.Response().Header().Set("Retry-After", "1")
				return problem(c, http.StatusTooManyRequests, wire.CodeConnLimit,
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
	e.GET("/v1/approvals", s.listApprovals, s.require(RoleApprover))
	e.GET("/v1/approvals/:id", s.getApproval, s.require(RoleRunner, RoleApprover))
	e.POST("/v1/approvals/:id", s.decideApproval, s.require(RoleApprover))
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

// Shutdown stops accepting connections and waits for the open ones, at most until
// ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.echo.Server.Shutdown(ctx) }

func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		code := wire.CodeInternal
		switch he.Code {
		case http.StatusNotFound:
			code = wire.CodeNotFound
		case http.StatusMethodNotAllowed:
			code = wire.CodeMethod
		}
		problem(c, he.Code, code, fmt.Sprint(he.Message))
		return
	}
	problem(c, http.StatusInternalServerError, wire.CodeInternal, "")
}

// require admits only callers holding role: a Unix peer by its SO_PEERCRED
// credentials, any other (TCP) by its bearer token, which then identifies it.
func (s *Server) require(roles ...Role) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			ctx := c.Request().Context()
			role := roles[0]
			peer, ok := PeerFrom(ctx)
			if !ok {
				t, found := s.access().Tokens.Authenticate(c.Request())
				if !found {
					if s.denials.Allow() {
						s.record(ctx, store.AccessDenied, "", map[string]any{"method": c.Request().Method,
							"path": c.Path(), "role": role, "remote": c.Request().RemoteAddr, "reason": "no valid bearer token",
							"unrecorded_before": s.skipped.Swap(0)})
					} else {
						s.skipped.Add(1)
					}
					c.Response().Header().Set("WWW-Authenticate", `Bearer realm="sandcell"`)
					return problem(c, http.StatusUnauthorized, wire.CodeUnauthorized, "present a configured bearer token")
				}
				peer, ok = Peer{PID: -1, UID: -1, GID: -1, Token: t.Name}, true
				authenticated(ctx)
				c.Response().Header().Del("Connection")
				c.SetRequest(c.Request().WithContext(context.WithValue(ctx, peerKey{}, peer)))
			}
			allowed := false
			for _, role := range roles {
				allowed = allowed || s.access().Allows(peer, role)
			}
			if !allowed {
				who := fmt.Sprintf("uid %d", peer.UID)
				if peer.Token != "" {
					who = fmt.Sprintf("token %q", peer.Token)
				}
				s.record(c.Request().Context(), store.AccessDenied, "", map[string]any{"method": c.Request().Method,
					"path": c.Path(), "role": role, "pid": peer.PID})
				c.Response().Header().Set("Connection", "close") // nor wait for its body
				return problem(c, http.StatusForbidden, wire.CodeForbidden, fmt.Sprintf("%s is not allowed the %s role", who, role))
			}
			return next(c)
		}
	}
}

func (s *Server) info(c echo.Context) error { return c.JSON(http.StatusOK, s.o.Info()) }

func (s *Server) createRun(c echo.Context) error {
	ctx := c.Request().Context()
	peer, _ := PeerFrom(ctx)
	refuse := func(status int, code, detail string) error {
		// A refusal is audited too; if it cannot be, the caller still gets it.
		s.record(ctx, store.RunRefused, "", map[string]any{"status": status, "code": code, "detail": detail})
		return problem(c, status, code, detail)
	}
	if s.o.Disabled() {
		return refuse(http.StatusServiceUnavailable, wire.CodeDisabled, "runs are disabled by the operator (the kill switch is on)")
	}
	if why := s.o.Health.Why(); why != "" {
		return refuse(http.StatusServiceUnavailable, wire.CodeNotReady, why)
	}
	var body wire.RunRequest
	if bad := s.decode(c, &body); bad != nil {
		return refuse(bad.status, bad.code, bad.detail)
	}
	req, perr := s.request(body)
	if perr != nil {
		return refuse(perr.status, perr.code, perr.detail)
	}
	acquired := ""
	defer func() {
		if acquired != "" {
			s.release(acquired)
		}
	}()
	if body.Workspace != "" {
		w := s.workspace(c, body.Workspace)
		if w == nil {
			s.record(ctx, store.RunRefused, "", map[string]any{"status": http.StatusNotFound,
				"code": wire.CodeNotFound, "detail": "no workspace " + body.Workspace})
			return nil
		}
		over, u, err := w.OverQuota()
		if err != nil {
			return refuse(workspaceStatus(err))
		}
		if over {
			q := s.o.Workspaces.Quota()
			return refuse(http.StatusInsufficientStorage, wire.CodeQuota, fmt.Sprintf(
				"workspace %s holds %d bytes in %d names, over its quota of %d bytes and %d names: remove files first",
				w.ID, u.Bytes, u.Files, q.Bytes, q.Files))
		}
		req.Workspace = w.Dir()
		if err := s.acquire(w.ID); errors.Is(err, errWorkspaceBusy) {
			return refuse(http.StatusConflict, wire.CodeWorkspaceBusy, fmt.Sprintf("workspace %s: %v", w.ID, err))
		} else if err != nil {
			return refuse(http.StatusNotFound, wire.CodeNotFound, "no workspace "+w.ID)
		}
		acquired = w.ID
		// No single file the run writes may be larger than the whole quota.
		req.Hardening.Rlimits.FSIZE = min(req.Hardening.Rlimits.FSIZE, uint64(s.o.Workspaces.Quota().Bytes))
	}
	sum := sha256.Sum256([]byte(req.Code))
	detail := map[string]any{"code_sha256": hex.EncodeToString(sum[:]), "limits": req.Limits,
		"args": len(req.Args), "stdin_bytes": len(req.Stdin), "env": envNames(req.Env),
		"workspace": body.Workspace}
	if s.o.RecordCode {
		detail["code"] = req.Code
	}
	// No record, no run: the request is audited before a worker is spent on it.
	if err := s.record(ctx, store.RunRequested, "", detail); err != nil {
		return problem(c, http.StatusServiceUnavailable, wire.CodeAuditDown, "the audit log cannot be written: "+err.Error())
	}
	run, err := s.o.Service.Start(req, peer.Caller())
	switch {
	case errors.Is(err, supervisor.ErrQueueFull):
		c.Response().Header().Set("Retry-After", "1")
		return refuse(http.StatusTooManyRequests, wire.CodeQueueFull, err.Error())
	case errors.Is(err, supervisor.ErrCallerLimit):
		c.Response().Header().Set("Retry-After", "1")
		return refuse(http.StatusTooManyRequests, wire.CodeCallerLimit, err.Error())
	case errors.Is(err, supervisor.ErrStopping):
		return refuse(http.StatusServiceUnavailable, wire.CodeStopping, err.Error())
	case err != nil:
		return refuse(http.StatusInternalServerError, wire.CodeInternal, err.Error())
	}
	if acquired != "" {
		// The workspace stays in use until the run ends, not until this answer.
		ws := acquired
		s.acquire(ws) // cannot fail: the acquire above still holds it
		go func() { <-run.Done(); s.release(ws) }()
	}
	s.record(ctx, store.RunAdmitted, run.ID, map[string]any{"code_sha256": detail["code_sha256"]})
	if body.Wait != nil && !*body.Wait {
		c.Response().Header().Set("Location", "/v1/runs/"+run.ID)
		return runJSON(c, http.StatusAccepted, run)
	}
	select {
	case <-run.Done():
	case <-ctx.Done():
		// The caller went away: nobody will read the result, so stop the work.
		s.o.Service.Cancel(run.ID)
		<-run.Done()
	}
	return runJSON(c, http.StatusOK, run)
}

// record appends an audit record of the request of ctx by its caller (uid -1 before
// anyone is known); a TCP caller's token name goes into detail["token"] (see
// supervisor.Audit.Record). Every record the API writes names its caller this way.
func (s *Server) record(ctx context.Context, kind store.Kind, runID string, detail map[string]any) error {
	who := supervisor.Caller{UID: -1}
	if peer, ok := PeerFrom(ctx); ok {
		who = peer.Caller()
	}
	return s.o.Audit.Record(ctx, kind, who, runID, detail)
}

func envNames(env map[string]string) []string {
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

type badRequest struct {
	status       int
	code, detail string
}

// request turns a body into a sandbox request under policy.
func (s *Server) request(b wire.RunRequest) (protocol.Request, *badRequest) {
	if b.Limits.MemoryMiB > 1<<20 {
		return protocol.Request{}, &badRequest{http.StatusBadRequest, wire.CodeLimitExceeded,
			fmt.Sprintf("limits.memory_mib %d is above any maximum", b.Limits.MemoryMiB)}
	}
	limits, err := s.policy().Resolve(protocol.Limits{
		TimeoutMS: b.Limits.TimeoutMS, CPUMS: b.Limits.CPUMS, MemoryBytes: b.Limits.MemoryMiB * policy.MiB,
		Fuel: b.Limits.Fuel, MaxStdoutBytes: b.Limits.MaxOutputBytes, MaxStderrBytes: b.Limits.MaxOutputBytes,
	})
	if err != nil {
		return protocol.Request{}, &badRequest{http.StatusBadRequest, wire.CodeLimitExceeded, strings.Join(policy.Describe(err, apiLimitName), "; ")}
	}
	env, err := s.policy().FilterEnv(b.Env)
	if err != nil {
		return protocol.Request{}, &badRequest{http.StatusBadRequest, wire.CodeBadRequest, err.Error()}
	}
	if b.Code == "" {
		return protocol.Request{}, &badRequest{http.StatusBadRequest, wire.CodeBadRequest, "code is required"}
	}
	stdin := []byte(b.Stdin)
	switch b.StdinEncoding {
	case "":
	case "base64":
		if stdin, err = base64.StdEncoding.DecodeString(b.Stdin); err != nil {
			return protocol.Request{}, &badRequest{http.StatusBadRequest, wire.CodeBadRequest, "stdin: " + err.Error()}
		}
	default:
		return protocol.Request{}, &badRequest{http.StatusBadRequest, wire.CodeBadRequest,
			fmt.Sprintf("stdin_encoding %q: only \"base64\" (or none)", b.StdinEncoding)}
	}
	if err := sandbox.CheckProgram(&protocol.Request{Code: b.Code, Args: b.Args, Stdin: stdin, Env: env}); err != nil {
		return protocol.Request{}, &badRequest{http.StatusBadRequest, wire.CodeBadRequest, err.Error()}
	}
	module, lib, err := s.o.Module(limits.Fuel > 0)
	if err != nil {
		return protocol.Request{}, &badRequest{http.StatusInternalServerError, wire.CodeInternal, err.Error()}
	}
	return protocol.Request{Code: b.Code, Args: b.Args, Stdin: stdin, Env: env, Limits: limits,
		Hardening: s.policy().Hardening(limits), ModulePath: module, LibDir: lib}, nil
}

// apiLimitName names a limit as a caller of the API knows it (see wire.RunLimits).
func apiLimitName(e *policy.LimitError, v int64) (string, string) {
	switch e.Field {
	case "memory_bytes":
		return "limits.memory_mib", mib(v)
	case "max_stdout_bytes", "max_stderr_bytes":
		return "limits.max_output_bytes", strconv.FormatInt(v, 10)
	}
	return "limits." + e.Field, strconv.FormatInt(v, 10)
}

// mib says n bytes in MiB, with a fraction only when there is one.
func mib(n int64) string { return strconv.FormatFloat(float64(n)/policy.MiB, 'f', -1, 64) }

// decode reads a JSON body strictly: at most MaxBodyBytes (413 beyond, before reading
// the rest), UTF-8, no unknown, repeated or differently cased members, one value.
func (s *Server) decode(c echo.Context, v any) *badRequest {
	r := c.Request()
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return &badRequest{http.StatusUnsupportedMediaType, wire.CodeUnsupportedMed, "send application/json"}
		}
	}
	tooLarge := &badRequest{http.StatusRequestEntityTooLarge, wire.CodeBodyTooLarge,
		fmt.Sprintf("at most %d bytes are accepted", s.o.MaxBodyBytes)}
	if r.ContentLength > s.o.MaxBodyBytes {
		return tooLarge
	}
	raw, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, s.o.MaxBodyBytes))
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		return tooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &badRequest{http.StatusRequestTimeout, wire.CodeTimeout, "the body did not arrive within the read timeout"}
	case err != nil:
		return &badRequest{http.StatusBadRequest, wire.CodeInvalidJSON, err.Error()}
	case !utf8.Valid(raw):
		return &badRequest{http.StatusBadRequest, wire.CodeInvalidJSON, "the body is not valid UTF-8"}
	}
	if code, err := checkKeys(raw); err != nil {
		return &badRequest{http.StatusBadRequest, code, err.Error()}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("more than one JSON value in the body")
	}
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return &badRequest{http.StatusBadRequest, wire.CodeUnknownField, err.Error()}
	case errors.As(err, &typeErr):
		// Name the member and the JSON type given, not the Go types behind them.
		return &badRequest{http.StatusBadRequest, wire.CodeInvalidJSON, fmt.Sprintf(
			"member %q: a JSON %s is not accepted here", typeErr.Field, typeErr.Value)}
	default:
		return &badRequest{http.StatusBadRequest, wire.CodeInvalidJSON, err.Error()}
	}
}

// checkKeys refuses what encoding/json would quietly accept: a member name given
// twice in any object (the last would win), a member of the request's own objects
// (the body and its "limits") in other letter case ("CODE" for "code"), and an
// escaped lone surrogate in any string (it would become U+FFFD, so the code run would
// not be the code sent).
//
// A recased member is CodeUnknownField; the others are CodeInvalidJSON.
func checkKeys(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	type frame struct {
		object, schema bool
		keys           map[string]bool
		key            bool   // the next string token is a member name
		last           string // the last member name
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", nil // io.EOF, or a syntax error, which is the decoder's to report
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				schema := top == nil || (top.schema && len(stack) == 1 && top.last == "limits")
				stack = append(stack, &frame{object: true, schema: schema, keys: map[string]bool{}, key: true})
				continue
			case '[':
				stack = append(stack, &frame{})
				continue
			default:
				stack = stack[:len(stack)-1]
			}
		case string:
			if top != nil && top.object && top.key {
				if top.keys[t] {
					return wire.CodeInvalidJSON, fmt.Errorf("member %q is given twice", t)
				}
				if top.schema && t != strings.ToLower(t) {
					return wire.CodeUnknownField, fmt.Errorf("member %q: the request's member names are lower case", t)
				}
				top.keys[t], top.key, top.last = true, false, t
				continue
			}
			// U+FFFD that the body did not spell (as the character or as \ufffd) came
			// from a lone surrogate.
			if strings.ContainsRune(t, utf8.RuneError) && !bytes.Contains(raw, []byte("\uFFFD")) &&
				!bytes.Contains(bytes.ToLower(raw), []byte(`\ufffd`)) {
				return wire.CodeInvalidJSON, errors.New("a string holds an escaped lone surrogate, which is not a character")
			}
		}
		// A value ended: in an object, the next string is a member name again.
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].key = true
		}
	}
}

// audit answers GET /v1/audit?after=SEQ&run=ID&limit=N (admins only): records in
// order, at most 1000 per page; page on with after= the last seq.
func (s *Server) audit(c echo.Context) error {
	after, limit := int64(0), 100
	if v := c.QueryParam("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return problem(c, http.StatusBadRequest, wire.CodeBadRequest, "after: a record number")
		}
		after = n
	}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return problem(c, http.StatusBadRequest, wire.CodeBadRequest, "limit: 1 to 1000")
		}
		limit = n
	}
	evs, err := s.o.Audit.Events(c.Request().Context(), after, c.QueryParam("run"), limit)
	if err != nil {
		return problem(c, http.StatusInternalServerError, wire.CodeInternal, err.Error())
	}
	return c.JSON(http.StatusOK, map[string]any{"events": evs})
}

// visible reports whether the caller may see run: its owner or an admin. Others get
// 404, as if it did not exist.
// runJSON answers with the run's View, its output streamed (see View.WriteJSON).
func runJSON(c echo.Context, status int, run *supervisor.Run) error {
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	c.Response().WriteHeader(status)
	return run.View().WriteJSON(c.Response())
}

func (s *Server) visible(c echo.Context, run *supervisor.Run) bool {
	peer, ok := PeerFrom(c.Request().Context())
	return ok && (peer.Caller() == run.Caller || s.access().Allows(peer, RoleAdmin))
}

func (s *Server) getRun(c echo.Context) error {
	run, err := s.o.Service.Get(c.Param("id"))
	if err != nil || !s.visible(c, run) {
		return problem(c, http.StatusNotFound, wire.CodeNotFound, "no run "+c.Param("id"))
	}
	return runJSON(c, http.StatusOK, run)
}

// cancelRun kills the run's worker and answers with its final state; a finished run
// keeps the state it had.
func (s *Server) cancelRun(c echo.Context) error {
	run, err := s.o.Service.Get(c.Param("id"))
	if err != nil || !s.visible(c, run) {
		return problem(c, http.StatusNotFound, wire.CodeNotFound, "no run "+c.Param("id"))
	}
	if run.View().State != wire.Done {
		s.o.Service.Cancel(run.ID)
		s.record(c.Request().Context(), store.RunCancel, run.ID, map[string]any{})
	}
	select {
	case <-run.Done():
	case <-time.After(10 * time.Second):
		return problem(c, http.StatusInternalServerError, wire.CodeInternal, "the worker did not end after cancel")
	}
	return runJSON(c, http.StatusOK, run)
}
