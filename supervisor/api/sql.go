package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/labstack/echo/v4"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/approvals"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/runs"
	"github.com/sandcell/sandcell/supervisor/sqltool"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/toolbroker"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// ActionSQLWrite is the approval action of a SQL statement that writes.
const ActionSQLWrite = "sql.write"

// SQLResult is the body of a 200 answer.
type SQLResult struct {
	sqltool.Outcome
	// Approval is the approval spent on this write, if any.
	Approval string `json:"approval,omitempty"`
}

// sqlDigest identifies a request for an approval: what runs and where. The bytes
// it runs on are bound too, but not here: the tool's worker hashes the database file
// when it holds a write for approval (the approval keeps that SHA-256 as its
// subject's db_sha256), and again just before the approved write, which it refuses
// ("stale") when the file has changed. Nothing on the request path reads a file the
// guest controls, and a read is never hashed.
func sqlDigest(b wire.SQLRequest) string {
	canon, _ := json.Marshal([]any{b.Workspace, b.DB, b.SQL, b.Params})
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:])
}

// approvedFile is the database file's SHA-256 that approval ap was requested on.
func approvedFile(ap approvals.Approval) string {
	var m struct {
		DBSHA256 string `json:"db_sha256"`
	}
	json.Unmarshal(ap.Subject, &m)
	return m.DBSHA256
}

// sqlStatus maps a tool error code to its HTTP status.
var sqlStatus = map[string]int{
	"sql_syntax_error": http.StatusBadRequest, "sql_error": http.StatusBadRequest,
	"sql_not_authorized": http.StatusBadRequest, "sql_cannot_open": http.StatusNotFound,
	"sql_not_a_database": http.StatusUnprocessableEntity, "sql_interrupted": http.StatusUnprocessableEntity,
	"sql_result_too_large": http.StatusUnprocessableEntity, "sql_busy": http.StatusConflict,
	"sql_out_of_memory": http.StatusUnprocessableEntity, "sql_quota_exceeded": http.StatusInsufficientStorage,
}

// managerRunner runs the tool's worker through the run manager as a job of its own
// (runs.JobSQL): it shares the bounded pool, queue, callers' shares and
// shutdown of code runs, but is not a run (no run.* record, not kept: the tool's
// answer is this response; 15 SELECTs of 20 MB each were once kept an hour).
type managerRunner struct {
	s      *Server
	caller identity.Caller
}

var _ sqltool.Runner = managerRunner{}

func (m managerRunner) Run(ctx context.Context, req protocol.Request) (protocol.Result, error) {
	return m.s.o.Service.Do(ctx, runs.JobSQL, req, m.caller)
}

func (s *Server) sql(c echo.Context) error {
	ctx := c.Request().Context()
	peer, _ := PeerFrom(ctx)
	caller := peer.Caller()
	audit := func(kind store.Kind, d map[string]any) { s.record(ctx, kind, "", d) }
	// Every refusal returned is recorded as sql.refused (refusalKinds), with the
	// request's members once they are known.
	if s.o.Disabled() {
		return fail(wire.CodeDisabled, "the kill switch is on")
	}
	if why := s.o.Health.Why(); why != "" {
		return fail(wire.CodeNotReady, why)
	}
	var body wire.SQLRequest
	if err := s.decode(c, &body); err != nil {
		return err
	}
	w, err := s.workspace(c, body.Workspace)
	if err != nil {
		return err
	}
	acquire := s.acquire
	if body.Approval != "" {
		// An approved write runs with nothing else in the workspace: no run or upload
		// can swap the file between the worker's check of its bytes and the write.
		acquire = s.acquireAlone
	}
	if err := acquire(w.ID); err != nil {
		return acquireError(w.ID, err)
	}
	release := s.releaser(w.ID)
	defer release()
	digest := sqlDigest(body)
	detail := map[string]any{"workspace": w.ID, "db": body.DB, "sql_sha256": digest}
	if s.o.RecordCode {
		detail["sql"] = body.SQL
	}
	if err := s.record(ctx, store.SQLRequested, "", detail); err != nil {
		return fail(wire.CodeAuditDown, "the audit log cannot be written: "+err.Error()).audited()
	}
	refused := func(e *apiError) error { e.record = detail; return e }
	req := sqltool.Request{DB: body.DB, SQL: body.SQL, Params: body.Params, MaxRows: body.MaxRows}
	if body.Approval != "" {
		ap, err := s.o.Approvals.Redeem(body.Approval, caller, digest)
		audit(store.ApprovalRedeemed, map[string]any{"approval": body.Approval, "sql_sha256": digest, "error": errString(err)})
		switch {
		case errors.Is(err, approvals.ErrNotFound), ap.Requester != caller:
			// Another caller's approval is, to this one, no approval: its statement and
			// parameters are not shown (as GET /v1/approvals/{id} shows them not).
			return refused(fail(wire.CodeNotFound, "no approval "+body.Approval))
		case errors.Is(err, approvals.ErrMismatch):
			return refused(fail(wire.CodeApprovalInvalid, "the approval is for another request").with(map[string]any{"approval": ap}))
		case err != nil:
			return refused(fail(wire.CodeApprovalInvalid, err.Error()).with(map[string]any{"approval": ap}))
		case approvedFile(ap) == "":
			// Every sql.write approval names the file's bytes; one that does not binds
			// nothing, and nothing runs on it.
			return refused(fail(wire.CodeApprovalInvalid, "the approval names no database file").with(map[string]any{"approval": ap}))
		}
		req.Write, req.DBSHA256 = true, approvedFile(ap)
	}
	failed := func(err error) error {
		// Every accepted statement has one final record, whatever became of it.
		audit(store.SQLFailed, map[string]any{"workspace": w.ID, "db": body.DB, "sql_sha256": digest,
			"approval": body.Approval, "error": errString(err)})
		if body.Approval != "" && !started(err) {
			// No worker ran the statement: the approval stays usable. Once one ran,
			// it is spent whatever the client saw (it may have committed).
			s.o.Approvals.Restore(body.Approval)
		}
		return problemOf(err).audited()
	}
	if body.Approval == "" && !s.approvalRequired(ActionSQLWrite) {
		// Policy does not hold SQL writes for approval: a write runs as it is
		// classified, in the one worker (a read still reads on a read-only connection).
		req.Write = true
	}
	out, err := s.runSQL(c, w, req, caller)
	if err == nil && out.Error != nil && out.Error.Code == "sql_busy" && s.soleUse(w.ID) {
		// Locked with nothing else in the workspace: a worker stopped while it held
		// the database (a run past its time limit, a statement cancelled) left its
		// lock, and maybe a hot journal. Undo both, then run the statement again.
		rec, rerr := s.runSQL(c, w, sqltool.Request{DB: body.DB, Recover: true}, caller)
		d := map[string]any{"workspace": w.ID, "db": body.DB, "error": errString(rerr)}
		if rec.Recovered != nil {
			d["lock_removed"], d["journal_rolled_back"] = rec.Recovered.LockRemoved, rec.Recovered.JournalRolledBack
		} else if rec.Error != nil {
			d["error"] = rec.Error.Message
		}
		audit(store.SQLRecovered, d)
		if rerr != nil {
			return failed(rerr)
		}
		if rec.Recovered != nil {
			out, err = s.runSQL(c, w, req, caller)
		}
	}
	release() // the statement is over: the workspace is free before the answer
	if err != nil {
		return failed(err)
	}
	d := map[string]any{"workspace": w.ID, "db": body.DB, "sql_sha256": digest, "status": out.Status,
		"classification": out.Classification, "changes": out.Changes, "elapsed_ms": out.ElapsedMS, "layers": out.Layers}
	class := map[string]any{"classification": out.Classification}
	detail = d // what a refusal from here on records
	switch out.Status {
	case "ok":
		audit(store.SQLFinished, d)
		return c.JSON(http.StatusOK, SQLResult{Outcome: out, Approval: body.Approval})
	case "stale":
		d["reason"] = out.Reason
		return refused(fail(wire.CodeApprovalInvalid, out.Reason+": the approval is void, request a new one").with(class))
	case "refused":
		d["reason"] = out.Reason
		return refused(fail(wire.CodeStatementRefused, out.Reason).with(class))
	case "approval_required":
		if !s.approversExist() && !s.mayConfirm(peer) {
			return refused(fail(wire.CodeApprovalUnavailable,
				"the statement writes, and no one can approve this caller's writes: they are refused").with(class))
		}
		ap, err := s.o.Approvals.Request(ActionSQLWrite, caller, map[string]any{"workspace": w.ID, "db": body.DB,
			"sql": body.SQL, "params": body.Params, "classification": out.Classification, "db_sha256": out.DBSHA256}, digest, "")
		if err != nil {
			return refused(fail(wire.CodeTooManyPending, err.Error()))
		}
		d["approval"], d["db_sha256"] = ap.ID, out.DBSHA256
		audit(store.ApprovalRequested, d)
		c.Response().Header().Set("Location", "/v1/approvals/"+ap.ID)
		who := "an approver must approve it"
		switch {
		case s.mayConfirm(peer) && !s.approversExist():
			who = "the person at your MCP client must confirm it"
		case s.mayConfirm(peer):
			who = "an approver must approve it (or the person at your MCP client confirm it)"
		}
		return fail(wire.CodeApprovalRequired,
			"the statement writes: "+who+", then send the same request with \"approval\": \""+ap.ID+"\"").
			with(map[string]any{"approval_id": ap.ID, "statement": body.SQL, "classification": out.Classification,
				"expires_at": ap.ExpiresAt, "confirmable": s.mayConfirm(peer)}).audited()
	default:
		d["error"] = out.Error
		audit(store.SQLFailed, d)
		e := fail(wire.CodeSQLError, "the statement failed")
		code := "sql_error"
		if out.Error != nil {
			code, e.detail = out.Error.Code, out.Error.Message
			if st, ok := sqlStatus[code]; ok {
				e.status = st
			}
		}
		return e.with(map[string]any{"sql_code": code, "classification": out.Classification}).audited()
	}
}

// errNotRun: the statement's worker was never started (the request's limits).
var errNotRun = errors.New("not run")

// started reports whether a runSQL error came after a worker was given the
// statement (it may have run to its end: a write may have committed).
func started(err error) bool {
	for _, e := range []error{errNotRun, sqltool.ErrBadRequest, workspace.ErrBadPath, workspace.ErrNotFound,
		workspace.ErrUnsafe, runs.ErrQueueFull, runs.ErrCallerLimit, runs.ErrStopping} {
		if errors.Is(err, e) {
			return false
		}
	}
	return true
}

// runSQL runs the tool; an error says why it could not (problemOf maps it).
func (s *Server) runSQL(c echo.Context, w *workspace.Workspace, req sqltool.Request, caller identity.Caller) (sqltool.Outcome, error) {
	limits, err := s.policy().Resolve(protocol.Limits{})
	if err != nil {
		return sqltool.Outcome{}, fmt.Errorf("%w: %w", errNotRun, err)
	}
	base, err := s.base(limits)
	if err != nil {
		return sqltool.Outcome{}, fmt.Errorf("%w: %w", errNotRun, err)
	}
	return sqltool.Run(c.Request().Context(), managerRunner{s, caller}, w.Dir(), req, base)
}

// RunSQLFile runs one statement of a guest's database tool (toolbroker.SQL) for
// caller, in a SQL worker given dir as its workspace, under the policy in force,
// through the run manager as POST /v1/sql's statements run.
func (s *Server) RunSQLFile(ctx context.Context, caller identity.Caller, dir string, req sqltool.Request) (sqltool.Outcome, error) {
	limits, err := s.policy().Resolve(protocol.Limits{})
	if err != nil {
		return sqltool.Outcome{}, err
	}
	base, err := s.base(limits)
	if err != nil {
		return sqltool.Outcome{}, err
	}
	return sqltool.Run(ctx, managerRunner{s, caller}, dir, req, base)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// approvalRequired reports whether policy holds action for approval.
func (s *Server) approvalRequired(action string) bool {
	for _, a := range s.o.ApprovalActions {
		if a == action {
			return true
		}
	}
	return false
}

// mayConfirm reports whether policy lets p's own confirmation, asked of the person at
// its MCP client, approve p's request (approvals.elicitation names "socket" or "tcp").
func (s *Server) mayConfirm(p Peer) bool {
	kind := "socket"
	if p.Token != "" {
		kind = "tcp"
	}
	return slices.Contains(s.o.Elicitation, kind)
}

// confirmApproval takes {"decision": "approve" | "deny"} from the requester itself:
// what the person at its MCP client answered (elicitation), where policy lets that
// count (mayConfirm).
func (s *Server) confirmApproval(c echo.Context) error {
	peer, _ := PeerFrom(c.Request().Context())
	if !s.mayConfirm(peer) {
		return fail(wire.CodeForbidden, "approvals.elicitation does not let this caller confirm its own requests: an approver must decide")
	}
	return s.settle(c, true)
}

// decideApproval takes {"decision": "approve" | "deny"} from an approver.
func (s *Server) decideApproval(c echo.Context) error { return s.settle(c, false) }

// settle decides approval {id} as {"decision"} says, by an approver or (confirm)
// by its requester. The decision is recorded before it takes effect: one whose
// record cannot be written is 503 audit_unavailable, and the approval stays as it
// was.
func (s *Server) settle(c echo.Context, confirm bool) error {
	var body struct {
		Decision string `json:"decision"`
		// Grant, approving a guest's tool call, covers it and the run's next calls
		// to the same tool, Grant in all (one decision for a loop).
		Grant int `json:"grant"`
	}
	if err := s.decode(c, &body); err != nil {
		return err
	}
	if body.Decision != "approve" && body.Decision != "deny" {
		return fail(wire.CodeBadRequest, `decision: "approve" or "deny"`)
	}
	if body.Grant < 0 || body.Grant > approvals.MaxGrant {
		return failf(wire.CodeBadRequest, "grant: 1 to %d calls (0: this call alone)", approvals.MaxGrant)
	}
	ctx, id := c.Request().Context(), c.Param("id")
	peer, _ := PeerFrom(ctx)
	detail := map[string]any{"approval": id, "decision": body.Decision}
	if body.Grant > 0 {
		detail["grant"] = body.Grant
	}
	if confirm {
		detail["by"], detail["elicited"] = "requester", true
	}
	ap, err := s.o.Approvals.Decidable(id, peer.Caller(), confirm)
	if err == nil && body.Grant > 0 && ap.Action != toolbroker.Action {
		return fail(wire.CodeBadRequest, "grant: only a guest's tool call ("+toolbroker.Action+") is approved with a grant")
	}
	if err == nil {
		if rerr := s.record(ctx, store.ApprovalDecided, "", detail); rerr != nil {
			return fail(wire.CodeAuditDown, "the audit log cannot be written, so the decision is not taken: "+rerr.Error()).audited()
		}
		switch {
		case confirm:
			ap, err = s.o.Approvals.ConfirmGrant(id, peer.Caller(), body.Decision == "approve", max(body.Grant, 1))
		case body.Grant > 0 || ap.Action == toolbroker.Action:
			ap, err = s.o.Approvals.DecideGrant(id, peer.Caller(), body.Decision == "approve", max(body.Grant, 1))
		default:
			ap, err = s.o.Approvals.Decide(id, peer.Caller(), body.Decision == "approve")
		}
	}
	if err != nil {
		detail["error"] = err.Error()
		s.record(ctx, store.ApprovalDecided, "", detail)
	}
	switch {
	case errors.Is(err, approvals.ErrNotFound):
		return fail(wire.CodeNotFound, "no approval "+id)
	case errors.Is(err, approvals.ErrSelfApproval):
		return fail(wire.CodeForbidden, err.Error())
	case err != nil:
		return fail(wire.CodeApprovalInvalid, err.Error()).with(map[string]any{"approval": ap})
	}
	return c.JSON(http.StatusOK, ap)
}

// approversExist reports whether anyone can approve: an approver principal or an
// approver token. (Admins may approve too, but do not count: an operator who names
// no approver has chosen that writes are refused.)
func (s *Server) approversExist() bool {
	a := s.access()
	if len(a.Approvers.UIDs)+len(a.Approvers.GIDs) > 0 {
		return true
	}
	for _, t := range a.Tokens {
		if t.has(RoleApprover) {
			return true
		}
	}
	return false
}

func (s *Server) listApprovals(c echo.Context) error {
	state := approvals.State(c.QueryParam("state"))
	switch state {
	case "", approvals.Pending, approvals.Approved, approvals.Denied,
		approvals.Spent, approvals.Expired:
	default:
		return fail(wire.CodeBadRequest, "state: pending, approved, denied, spent or expired")
	}
	return c.JSON(http.StatusOK, map[string]any{"approvals": s.o.Approvals.List(state)})
}

// getApproval answers its requester, approvers and admins; others get 404.
func (s *Server) getApproval(c echo.Context) error {
	ap, err := s.o.Approvals.Get(c.Param("id"))
	peer, _ := PeerFrom(c.Request().Context())
	if err != nil || (ap.Requester != peer.Caller() && !s.access().Allows(peer, RoleApprover)) {
		return fail(wire.CodeNotFound, "no approval "+c.Param("id"))
	}
	return c.JSON(http.StatusOK, ap)
}
