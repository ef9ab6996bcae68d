package api

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"io/fs"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/runs"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

func (s *Server) createRun(c echo.Context) error {
	ctx := c.Request().Context()
	peer, _ := PeerFrom(ctx)
	// Every refusal returned is recorded as run.refused (refusalKinds).
	if err := s.accepting(); err != nil {
		return err
	}
	var body wire.RunRequest
	if err := s.decode(c, &body); err != nil {
		return err
	}
	req, err := s.request(body)
	if err != nil {
		return err
	}
	if err := s.mayUseBackend(peer, req.Backend); err != nil {
		return err
	}
	acquired := ""
	defer func() {
		if acquired != "" {
			s.release(acquired)
		}
	}()
	var w *workspace.Workspace
	if body.Workspace != "" {
		var err error
		if w, err = s.workspace(c, body.Workspace); err != nil {
			return err
		}
		over, u, err := w.OverQuota()
		if err != nil {
			return err
		}
		if over {
			q := s.o.Workspaces.Quota()
			return failf(wire.CodeQuota,
				"workspace %s holds %d bytes in %d names, over its quota of %d bytes and %d names: remove files first",
				w.ID, u.Bytes, u.Files, q.Bytes, q.Files)
		}
		req.Workspace = w.Dir()
		if err := s.acquire(w.ID); err != nil {
			return acquireError(w.ID, err)
		}
		acquired = w.ID
	}
	if s.approvalRequired(ActionRun) && req.Path != "" {
		// What is approved is the file's bytes, and those bytes run: read now, the
		// program is code from here on (the file may change; the run does not).
		f, size, err := w.Open(req.Path)
		if err != nil {
			return err
		}
		src, err := io.ReadAll(io.LimitReader(f, protocol.MaxFrame/2))
		f.Close()
		if err != nil || int64(len(src)) != size {
			return failf(wire.CodeBadRequest, "path %q: cannot read it whole (at most %d bytes)", req.Path, protocol.MaxFrame/2)
		}
		req.Code, req.Filename, req.Path = string(bytes.TrimPrefix(src, []byte("\ufeff"))), GuestWorkdir+"/"+req.Path, ""
		if err := sandbox.CheckProgram(&req); err != nil {
			return fail(wire.CodeBadRequest, err.Error())
		}
	}
	held := false
	if body.Approval != "" && acquired != "" && s.approvalRequired(ActionRun) {
		// Approved code has its workspace to itself until it ends: the files the
		// approval binds are read under this hold and cannot change after (the gate).
		if !s.soleUse(acquired) {
			return failf(wire.CodeWorkspaceBusy, "workspace %s: approved code runs with nothing else in its workspace, and a run, session, statement or upload is using it", acquired)
		}
		held = true
	}
	// Everything that decides the run, as it will run: the program's source (a
	// path's file as read), its arguments, its whole stdin and environment, and the
	// limits policy resolved.
	approval, err := s.admitCode(ctx, codeRequest{kind: "run", dir: req.Workspace, approval: body.Approval, held: held,
		subject: map[string]any{"backend": req.Backend, "code": req.Code, "path": body.Path, "args": body.Args, "stdin": string(req.Stdin),
			"stdin_sha256": sha256Hex(req.Stdin), "env": req.Env, "workspace": body.Workspace, "limits": req.Limits}})
	if err != nil {
		return err
	}
	started := false
	defer func() {
		if approval != "" && !started {
			s.o.Approvals.Restore(approval) // nothing ran: it stays usable
		}
	}()
	sum := sha256.Sum256([]byte(req.Code))
	detail := map[string]any{"code_sha256": hex.EncodeToString(sum[:]), "limits": req.Limits,
		"args": len(req.Args), "stdin_bytes": len(req.Stdin), "env": envNames(req.Env),
		"workspace": body.Workspace, "backend": req.Backend}
	if req.Path != "" {
		detail["path"] = req.Path
	}
	if approval != "" {
		detail["approval"] = approval
	}
	if s.o.RecordCode {
		detail["code"] = req.Code
	}
	// No record, no run: the request is audited before a worker is spent on it.
	if err := s.record(ctx, store.RunRequested, "", detail); err != nil {
		return fail(wire.CodeAuditDown, "the audit log cannot be written: "+err.Error()).audited()
	}
	var ended func()
	if acquired != "" {
		// The workspace stays in use (alone, for approved code) until the run ends,
		// not until this answer: the run takes this request's use over, and gives
		// it back before its end is visible.
		ws := acquired
		ended = func() { s.release(ws) }
	}
	program := req.Code
	if req.Path != "" {
		program = "(the workspace's file " + req.Path + ", as it is when the run reads it)"
	}
	run, err := s.o.Service.Start(req, peer.Caller(), ended, s.guestTools(peer, "", program))
	if err != nil {
		return err // queue_full, caller_limit, stopping (problemOf)
	}
	started, acquired = true, ""
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

func envNames(env map[string]string) []string {
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// ActionRun is the approval action of a run of code.
const ActionRun = "run"

// GuestWorkdir is the workspace's path in the guest.
const GuestWorkdir = "/ws"

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// accepting refuses new work while the kill switch is on (disabled) or the sandbox
// is not verified (not_ready).
func (s *Server) accepting() error {
	if s.o.Disabled() {
		return fail(wire.CodeDisabled, "runs are disabled by the operator (the kill switch is on)")
	}
	if why := s.o.Health.Why(); why != "" {
		return fail(wire.CodeNotReady, why)
	}
	return nil
}

// request turns a body into a sandbox request under policy.
func (s *Server) request(b wire.RunRequest) (protocol.Request, error) {
	// Checked before it becomes bytes, where a value this far out would overflow.
	if m := b.Limits.MemoryMiB; m < 0 || m > 1<<20 {
		return protocol.Request{}, failf(wire.CodeLimitExceeded, "limits.memory_mib %d is out of range: between 0 and the maximum %s",
			m, mib(cmp.Or(s.policy().Max.MemoryBytes, 4<<30)))
	}
	limits, err := s.policy().Resolve(protocol.Limits{
		TimeoutMS: b.Limits.TimeoutMS, CPUMS: b.Limits.CPUMS, MemoryBytes: b.Limits.MemoryMiB * policy.MiB,
		Fuel: b.Limits.Fuel, MaxStdoutBytes: b.Limits.MaxOutputBytes, MaxStderrBytes: b.Limits.MaxOutputBytes,
	})
	if err != nil {
		return protocol.Request{}, fail(wire.CodeLimitExceeded, strings.Join(policy.Describe(err, apiLimitName), "; "))
	}
	env, err := s.policy().FilterEnv(b.Env)
	if err != nil {
		return protocol.Request{}, fail(wire.CodeBadRequest, err.Error())
	}
	switch {
	case b.Code == "" && b.Path == "":
		return protocol.Request{}, fail(wire.CodeBadRequest, "code is required (or a path in the workspace)")
	case b.Code != "" && b.Path != "":
		return protocol.Request{}, fail(wire.CodeBadRequest, "give code or path, not both")
	case b.Path != "" && b.Workspace == "":
		return protocol.Request{}, fail(wire.CodeBadRequest, "path names a file of a workspace: give the workspace too")
	case b.Path != "" && (!fs.ValidPath(b.Path) || b.Path == "."):
		return protocol.Request{}, failf(wire.CodeBadRequest, "path %q: a slash-separated path inside the workspace, without . or .. elements", b.Path)
	}
	stdin := []byte(b.Stdin)
	switch b.StdinEncoding {
	case "":
	case "base64":
		if stdin, err = base64.StdEncoding.DecodeString(b.Stdin); err != nil {
			return protocol.Request{}, fail(wire.CodeBadRequest, "stdin: "+err.Error())
		}
	default:
		return protocol.Request{}, failf(wire.CodeBadRequest, "stdin_encoding %q: only \"base64\" (or none)", b.StdinEncoding)
	}
	if err := sandbox.CheckProgram(&protocol.Request{Code: b.Code, Path: b.Path, Args: b.Args, Stdin: stdin, Env: env}); err != nil {
		return protocol.Request{}, fail(wire.CodeBadRequest, err.Error())
	}
	backend := cmp.Or(b.Backend, protocol.BackendWasm)
	if !slices.Contains(protocol.Backends(), backend) {
		return protocol.Request{}, failf(wire.CodeBadRequest, "backend %q: one of %s", b.Backend, strings.Join(protocol.Backends(), ", "))
	}
	if backend == protocol.BackendNative && limits.Fuel > 0 {
		return protocol.Request{}, fail(wire.CodeBadRequest, "limits.fuel: fuel is counted by the wasm engine; the native backend has none (use limits.cpu_ms)")
	}
	req, err := s.baseOn(backend, limits)
	if err != nil {
		return protocol.Request{}, err
	}
	req.Code, req.Path, req.Args, req.Stdin, req.Env = b.Code, b.Path, b.Args, stdin, env
	return req, nil
}

// baseOn is base for a job on backend: for the native backend, the verified root
// and policy's native hardening instead of the module.
func (s *Server) baseOn(backend string, limits protocol.Limits) (protocol.Request, error) {
	if backend != protocol.BackendNative {
		return s.base(limits)
	}
	if s.o.Native == nil {
		return protocol.Request{}, fail(wire.CodeBackendUnavailable, "the native backend is not offered by this daemon")
	}
	root, err := s.o.Native()
	if err != nil {
		return protocol.Request{}, fail(wire.CodeBackendUnavailable, "the native backend is unavailable: "+err.Error())
	}
	return protocol.Request{Backend: backend, RootDir: root, Limits: limits, Hardening: s.policy().NativeHardening(limits)}, nil
}

// mayUseBackend refuses a caller whom policy does not let run code on backend.
func (s *Server) mayUseBackend(peer Peer, backend string) error {
	if s.access().MayUseBackend(peer, backend) {
		return nil
	}
	return failf(wire.CodeForbidden, "%s may not run code on the %s backend (native.runners)", peer.who(), backend)
}

// base is the worker request every job starts from, runs and statements alike:
// limits (resolved by policy), policy's hardening for them, and the module and
// library to run; the program is the job's to fill in.
func (s *Server) base(limits protocol.Limits) (protocol.Request, error) {
	req, err := s.o.Module(limits.Fuel > 0)
	if err != nil {
		return protocol.Request{}, err
	}
	req.Limits, req.Hardening = limits, s.policy().Hardening(limits)
	return req, nil
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

// visible reports whether the caller may see run: its owner or an admin. Others get
// 404, as if it did not exist.
// runJSON answers with the run's View, its output streamed (see View.WriteJSON).
func runJSON(c echo.Context, status int, run *runs.Run) error {
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	c.Response().WriteHeader(status)
	return run.View().WriteJSON(c.Response())
}

func (s *Server) visible(c echo.Context, run *runs.Run) bool {
	peer, ok := PeerFrom(c.Request().Context())
	return ok && (peer.Caller() == run.Caller || s.access().Allows(peer, RoleAdmin))
}

func (s *Server) getRun(c echo.Context) error {
	run, err := s.o.Service.Get(c.Param("id"))
	if err != nil || !s.visible(c, run) {
		return fail(wire.CodeNotFound, "no run "+c.Param("id"))
	}
	v := run.View()
	if s.o.Tools != nil && v.State != wire.Done {
		if ap, tool, ok := s.o.Tools.Waiting(run.ID); ok {
			peer, _ := PeerFrom(c.Request().Context())
			v.Waiting = &wire.Waiting{Approval: ap, Tool: tool, Confirmable: s.mayConfirm(peer)}
		}
	}
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	c.Response().WriteHeader(http.StatusOK)
	return v.WriteJSON(c.Response())
}

// cancelRun kills the run's worker and answers with its final state; a finished run
// keeps the state it had.
func (s *Server) cancelRun(c echo.Context) error {
	run, err := s.o.Service.Get(c.Param("id"))
	if err != nil || !s.visible(c, run) {
		return fail(wire.CodeNotFound, "no run "+c.Param("id"))
	}
	if run.View().State != wire.Done {
		s.o.Service.Cancel(run.ID)
		s.record(c.Request().Context(), store.RunCancel, run.ID, map[string]any{})
	}
	select {
	case <-run.Done():
	case <-time.After(10 * time.Second):
		return fail(wire.CodeInternal, "the worker did not end after cancel")
	}
	return runJSON(c, http.StatusOK, run)
}
