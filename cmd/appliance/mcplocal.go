package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/approvals"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/mcpserver"
	"github.com/sandcell/sandcell/supervisor/sessions"
	"github.com/sandcell/sandcell/supervisor/sqltool"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// localTools is the backend of `sandcell mcp --workspace DIR`, with no daemon: runs
// and statements in workers of this process's own, hardened as `sandcell run` and
// `sandcell sql` harden theirs (the default policy: every layer required), and the
// files of DIR, reached as a daemon reaches a workspace's (beneath DIR, no link
// followed). A statement that writes is held until the person at the client
// confirms it (elicitation); nothing here is audited, as with `sandcell run`.
type localTools struct {
	ws                  *workspace.Workspace
	sp                  *sandbox.Spawner
	pol                 policy.Policy
	bundleDir, cacheDir string
	approvals           *approvals.Queue
	me                  identity.Caller
	runs                atomic.Int64
	sessions            *sessions.Manager // run_cell's interpreters, which live as long as this process
}

var _ mcpserver.Backend = (*localTools)(nil)

// localQuota bounds what the tools may write into DIR: a directory of the user's own,
// which may hold much already.
var localQuota = workspace.Quota{Bytes: 16 << 30, Files: 100_000}

func newLocalTools(dir, bundleDir, cacheDir string) (*localTools, error) {
	ws, err := workspace.Directory(dir, localQuota)
	if err != nil {
		return nil, err
	}
	sp := newSpawner(bundleDir, cacheDir)
	sess, err := sessions.New(sp, sessions.Options{Max: 2, MaxPerCaller: 2,
		IdleTimeout: 30 * time.Minute, Quota: localQuota})
	if err != nil {
		return nil, err
	}
	sess.Start(sessions.Hooks{}) // nothing kept on disk: they end with this process
	return &localTools{ws: ws, sp: sp, pol: policy.Default(),
		bundleDir: bundleDir, cacheDir: cacheDir, approvals: approvals.New(15*time.Minute, 10*time.Minute),
		me: identity.Caller{UID: os.Getuid()}, sessions: sess}, nil
}

// OpenSession opens an interpreter session in DIR, in a worker of this process's.
func (l *localTools) OpenSession(ctx context.Context, r wire.SessionRequest) (wire.SessionView, error) {
	if err := l.check(r.Workspace); err != nil {
		return wire.SessionView{}, err
	}
	limits, err := l.pol.Resolve(protocol.Limits{})
	if err != nil {
		return wire.SessionView{}, err
	}
	req, err := l.baseOn(r.Backend, limits)
	if err != nil {
		return wire.SessionView{}, err
	}
	s, err := l.sessions.Open(ctx, req, l.me, "")
	if err != nil {
		return wire.SessionView{}, refusal(err)
	}
	return s.View(), nil
}

// Cell runs a cell in session id with the policy's default limits (a lower
// timeout if asked).
func (l *localTools) Cell(ctx context.Context, id string, r wire.CellRequest) (wire.CellAnswer, error) {
	s, err := l.sessions.Get(id, l.me)
	if err != nil {
		return wire.CellAnswer{}, refusal(err)
	}
	limits := s.Limits
	if r.Limits.TimeoutMS > 0 {
		limits.TimeoutMS = min(limits.TimeoutMS, r.Limits.TimeoutMS)
	}
	out, state, err := l.sessions.Cell(ctx, id, l.me, protocol.Request{Code: r.Code, Stdin: []byte(r.Stdin), Limits: limits}, nil,
		func() error { return nil })
	if err != nil {
		return wire.CellAnswer{}, refusal(err)
	}
	return wire.CellAnswer{State: state, Value: out.Value, ValueTruncated: out.ValueTruncated, Result: out.Result,
		Session: s.View()}, nil
}

// CloseSession ends session id.
func (l *localTools) CloseSession(_ context.Context, id string) error {
	if err := l.sessions.Close(id, l.me); err != nil {
		return refusal(err)
	}
	return nil
}

// refusal is err as the daemon would have answered it.
func refusal(err error) error { return api.AsProblem(err) }

func refuse(code, detail string) error { return api.Refusal(code, detail) }

// base is the worker request of limits, as the daemon builds it (api's base).
func (l *localTools) base(limits protocol.Limits) (protocol.Request, error) {
	module, lib, err := precompiled(l.bundleDir, l.cacheDir, limits.Fuel > 0)
	if err != nil {
		return protocol.Request{}, err
	}
	return protocol.Request{Limits: limits, Hardening: l.pol.Hardening(limits), ModulePath: module, LibDir: lib,
		Workspace: l.ws.Dir()}, nil
}

// baseOn is base on backend: the native one's verified root and hardening.
func (l *localTools) baseOn(backend string, limits protocol.Limits) (protocol.Request, error) {
	switch backend {
	case "", protocol.BackendWasm:
		return l.base(limits)
	case protocol.BackendNative:
		root, err := bundle.OpenNativeStamped(l.bundleDir)
		if err != nil {
			return protocol.Request{}, refuse(wire.CodeBackendUnavailable, "the native backend is unavailable: "+err.Error())
		}
		return protocol.Request{Backend: protocol.BackendNative, RootDir: root.Dir, Limits: limits,
			Hardening: l.pol.NativeHardening(limits), Workspace: l.ws.Dir()}, nil
	}
	return protocol.Request{}, refuse(wire.CodeBadRequest, fmt.Sprintf("backend %q: one of %s", backend, strings.Join(protocol.Backends(), ", ")))
}

func (l *localTools) check(id string) error {
	if id != workspace.DirectoryID {
		return refuse(wire.CodeNotFound, "no workspace "+id+": this server has one, "+workspace.DirectoryID)
	}
	return nil
}

func (l *localTools) Run(ctx context.Context, r wire.RunRequest) (wire.View, error) {
	if err := l.check(r.Workspace); err != nil {
		return wire.View{}, err
	}
	if r.Path != "" && !fs.ValidPath(r.Path) {
		return wire.View{}, refuse(wire.CodeBadRequest, fmt.Sprintf("path %q: a slash-separated path inside the workspace", r.Path))
	}
	limits, err := l.pol.Resolve(protocol.Limits{TimeoutMS: r.Limits.TimeoutMS})
	if err != nil {
		return wire.View{}, refuse(wire.CodeLimitExceeded, strings.Join(policy.Describe(err,
			func(e *policy.LimitError, v int64) (string, string) { return e.Field, strconv.FormatInt(v, 10) }), "; "))
	}
	req, err := l.baseOn(r.Backend, limits)
	if err != nil {
		return wire.View{}, err
	}
	req.Code, req.Path, req.Args, req.Stdin = r.Code, r.Path, r.Args, []byte(r.Stdin)
	res, err := l.sp.Run(ctx, req)
	if errors.Is(err, sandbox.ErrBadRequest) {
		return wire.View{}, refuse(wire.CodeBadRequest, err.Error())
	}
	if err != nil {
		return wire.View{}, err
	}
	return wire.View{ID: "local-" + strconv.FormatInt(l.runs.Add(1), 10), State: wire.Done, Result: &res}, nil
}

func (l *localTools) SQL(ctx context.Context, r wire.SQLRequest) (json.RawMessage, error) {
	if err := l.check(r.Workspace); err != nil {
		return nil, err
	}
	canon, _ := json.Marshal([]any{r.DB, r.SQL, r.Params})
	sum := sha256.Sum256(canon)
	digest := hex.EncodeToString(sum[:])
	req := sqltool.Request{DB: r.DB, SQL: r.SQL, Params: r.Params, MaxRows: r.MaxRows}
	if r.Approval != "" {
		ap, err := l.approvals.Redeem(r.Approval, l.me, digest)
		if err != nil {
			return nil, refuse(wire.CodeApprovalInvalid, err.Error())
		}
		var subject struct {
			DBSHA256 string `json:"db_sha256"`
		}
		json.Unmarshal(ap.Subject, &subject)
		req.Write, req.DBSHA256 = true, subject.DBSHA256
	}
	limits, err := l.pol.Resolve(protocol.Limits{})
	if err != nil {
		return nil, err
	}
	base, err := l.base(limits)
	if err != nil {
		return nil, err
	}
	out, err := sqltool.Run(ctx, l.sp, l.ws.Dir(), req, base)
	if err != nil {
		return nil, refusal(err)
	}
	switch out.Status {
	case "ok":
		return json.Marshal(out)
	case "approval_required":
		ap, err := l.approvals.Request(api.ActionSQLWrite, l.me, map[string]any{"db": r.DB, "sql": r.SQL, "params": r.Params,
			"db_sha256": out.DBSHA256}, digest, "")
		if err != nil {
			return nil, refuse(wire.CodeTooManyPending, err.Error())
		}
		p := api.Refusal(wire.CodeApprovalRequired, "the statement writes: the person at the client must confirm it")
		id, _ := json.Marshal(ap.ID)
		p.Extensions = map[string]json.RawMessage{"approval_id": id, "confirmable": json.RawMessage("true")}
		return nil, p
	case "refused", "stale":
		return nil, refuse(wire.CodeStatementRefused, out.Reason)
	}
	msg := "the statement failed"
	if out.Error != nil {
		msg = out.Error.Code + ": " + out.Error.Message
	}
	return nil, refuse(wire.CodeSQLError, msg)
}

func (l *localTools) CreateWorkspace(context.Context) (wire.Workspace, error) {
	return wire.Workspace{ID: workspace.DirectoryID}, nil
}

func (l *localTools) Workspace(_ context.Context, id, after string, limit int) (wire.Workspace, error) {
	if err := l.check(id); err != nil {
		return wire.Workspace{}, err
	}
	files, next, err := l.ws.List(after, limit)
	if err != nil {
		return wire.Workspace{}, refusal(err)
	}
	out := wire.Workspace{ID: id, Next: next}
	for _, f := range files {
		out.Files = append(out.Files, wire.WorkspaceFile{Path: f.Path, Type: f.Type, Size: f.Size})
	}
	return out, nil
}

func (l *localTools) ReadFile(_ context.Context, id, path string, max int64) ([]byte, int64, error) {
	if err := l.check(id); err != nil {
		return nil, 0, err
	}
	f, size, err := l.ws.Open(path)
	if err != nil {
		return nil, 0, refusal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, min(max, size)))
	return b, size, err
}

func (l *localTools) WriteFile(_ context.Context, id, path string, data []byte) error {
	if err := l.check(id); err != nil {
		return err
	}
	if _, err := l.ws.Write(path, bytes.NewReader(data)); err != nil {
		return refusal(err)
	}
	return nil
}

func (l *localTools) ConfirmApproval(_ context.Context, id string, approve bool) error {
	if _, err := l.approvals.Confirm(id, l.me, approve); err != nil {
		return refuse(wire.CodeApprovalInvalid, err.Error())
	}
	return nil
}
