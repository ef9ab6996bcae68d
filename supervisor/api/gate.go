package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/sandcell/sandcell/supervisor/approvals"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// The gate of guest code. Every request that executes a caller's code (a run, a
// session's cell, and through them MCP's run_python and run_cell, which call this
// API in process) passes admitCode, in one place: where policy holds code for
// approval (approvals.required names "run"), the request is held until an approver
// (or the person at the caller's MCP client) approves exactly it, and the approval
// is spent by exactly it. TestEveryCodePathIsGated lists the routes and MCP tools
// that execute code and those that execute none, fails on one it does not list (a
// new one cannot forget the gate), and checks that each of the first is held.
// Opening and forking a session execute no caller code (a fork's cells each pass
// the gate); they pass the same kill switch and readiness checks (accepting).
//
// What an approval binds is everything that decides what runs: the program's
// source, its arguments, stdin, environment and limits, the session a cell runs
// in (and its environment), and the workspace's whole tree, every file by its
// SHA-256 (workspace.Entries: a program's `import json` loads a planted json.py,
// since the workspace comes first on sys.path as the script's directory does in
// CPython; an earlier cell may have put any file on sys.path). A request that
// presents its approval takes its workspace alone first (no upload, run, statement
// or session may use it until the code ends), then reads the tree again: changed,
// the approval is for another request (409 approval_invalid, naming the files),
// and nothing can change it before the code ends but the approved code itself.

// codeRequest is one request to execute a caller's code, as the gate sees it.
type codeRequest struct {
	// kind is "run" or "cell"; subject is everything else that decides what runs,
	// as the approver is shown it (a cell's names its session).
	kind    string
	subject map[string]any
	// dir is the host directory the code gets as /ws ("": an empty one of its own),
	// whose tree takes part.
	dir string
	// approval is the id the caller presented ("": none).
	approval string
	// held reports whether the request already holds dir alone (a redemption must).
	held bool
}

// admitCode is the gate (see above). Where policy does not hold code it returns ""
// (and refuses an approval given anyway); where it does, without an approval it
// asks for one and refuses with approval_required (its id, the program and the
// workspace's files in the problem document); with one it spends it
// if it is this caller's, approved, and for exactly this request as it stands now,
// and returns its id.
func (s *Server) admitCode(ctx context.Context, r codeRequest) (string, error) {
	if !s.approvalRequired(ActionRun) {
		if r.approval != "" {
			return "", fail(wire.CodeBadRequest, "approval: policy does not hold code for approval")
		}
		return "", nil
	}
	if r.approval != "" && r.dir != "" && !r.held {
		// Programming error of a caller of admitCode: a redemption must hold its
		// workspace, or the files could change after they are read.
		return "", fail(wire.CodeInternal, "the workspace is not held for the approved code")
	}
	peer, _ := PeerFrom(ctx)
	caller := peer.Caller()
	// What can be refused without the workspace's files is refused first: reading
	// them costs up to workspaces.max_bytes of hashing, which a caller must not be
	// able to make the daemon repeat for requests that cannot succeed. (A caller at
	// its cap that sends a waiting request again, as far as the request without the
	// files tells (head), is answered with that approval, as below the cap.)
	head := ""
	if b, err := json.Marshal(map[string]any{"kind": r.kind, "subject": r.subject, "dir": r.dir}); err == nil {
		sum := sha256.Sum256(b)
		head = hex.EncodeToString(sum[:])
	}
	if r.approval != "" {
		if ap, err := s.o.Approvals.Usable(r.approval, caller); err != nil {
			s.record(ctx, store.ApprovalRedeemed, "", map[string]any{"approval": r.approval, "kind": r.kind, "error": err.Error()})
			if errors.Is(err, approvals.ErrNotFound) {
				return "", fail(wire.CodeNotFound, "no approval "+r.approval)
			}
			return "", fail(wire.CodeApprovalInvalid, err.Error()).with(map[string]any{"approval": ap})
		}
	} else {
		if !s.approversExist() && !s.mayConfirm(peer) {
			return "", fail(wire.CodeApprovalUnavailable, "code is held for approval, and no one can approve this caller's: nothing runs")
		}
		if err := s.o.Approvals.Room(caller, head); err != nil {
			return "", fail(wire.CodeTooManyPending, err.Error())
		}
	}
	files := []workspace.Entry{}
	if r.dir != "" {
		w, err := workspace.Directory(r.dir, workspace.Quota{Bytes: math.MaxInt64, Files: math.MaxInt})
		if err == nil {
			files, err = w.Entries()
		}
		if err != nil {
			return "", problemOf(fmt.Errorf("the workspace's files, which an approval binds: %w", err))
		}
	}
	subject := map[string]any{"kind": r.kind, "workspace_files": files}
	for k, v := range r.subject {
		subject[k] = v
	}
	canon, err := json.Marshal(subject) // a map's keys are sorted: one form
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	digest := hex.EncodeToString(sum[:])
	if r.approval != "" {
		ap, err := s.o.Approvals.Redeem(r.approval, caller, digest)
		s.record(ctx, store.ApprovalRedeemed, "", map[string]any{"approval": r.approval, "kind": r.kind,
			"code_request_sha256": digest, "error": errString(err)})
		switch {
		case errors.Is(err, approvals.ErrNotFound), ap.Requester != caller:
			return "", fail(wire.CodeNotFound, "no approval "+r.approval)
		case errors.Is(err, approvals.ErrMismatch):
			return "", fail(wire.CodeApprovalInvalid, "the approval is for another request"+filesChanged(ap, files)).
				with(map[string]any{"approval": ap})
		case err != nil:
			return "", fail(wire.CodeApprovalInvalid, err.Error()).with(map[string]any{"approval": ap})
		}
		return r.approval, nil
	}
	ap, err := s.o.Approvals.Request(ActionRun, caller, subject, digest, head)
	if err != nil {
		return "", fail(wire.CodeTooManyPending, err.Error())
	}
	s.record(ctx, store.ApprovalRequested, "", map[string]any{"approval": ap.ID, "action": ActionRun, "kind": r.kind,
		"code_request_sha256": digest, "workspace": r.subject["workspace"], "session": r.subject["session"],
		"workspace_files": len(files)})
	ext := map[string]any{"approval_id": ap.ID, "kind": r.kind, "workspace_files": files,
		"expires_at": ap.ExpiresAt, "confirmable": s.mayConfirm(peer)}
	if code, ok := r.subject["code"]; ok {
		ext["program"] = code
	}
	for _, k := range []string{"path", "args", "stdin", "session"} {
		if v, ok := r.subject[k]; ok {
			ext[k] = v
		}
	}
	return "", fail(wire.CodeApprovalRequired,
		"code is held for approval: an approver must approve it (or the person at your MCP client confirm it), then send the same request with \"approval\": \""+ap.ID+"\"").
		with(ext).audited()
}

// filesChanged says how the workspace's files differ from those the
// approval ap bound, or "" when they do not (or ap binds none).
func filesChanged(ap approvals.Approval, now []workspace.Entry) string {
	var subject struct {
		Files []workspace.Entry `json:"workspace_files"`
	}
	if json.Unmarshal(ap.Subject, &subject) != nil || subject.Files == nil {
		return ""
	}
	then := map[string]string{}
	for _, f := range subject.Files {
		then[f.Path] = f.Type + f.SHA256
	}
	var changed []string
	for _, f := range now {
		switch sum, ok := then[f.Path]; {
		case !ok:
			changed = append(changed, f.Path+" (added)")
		case sum != f.Type+f.SHA256:
			changed = append(changed, f.Path+" (changed)")
		}
		delete(then, f.Path)
	}
	for p := range then {
		changed = append(changed, p+" (removed)")
	}
	if len(changed) == 0 {
		return ""
	}
	slices.Sort(changed)
	if len(changed) > 20 {
		changed = append(changed[:20], fmt.Sprintf("and %d more", len(changed)-20))
	}
	return ": the workspace's files changed since it was asked for: " + strings.Join(changed, ", ")
}
