// Package wire holds the bodies of the daemon's HTTP API, shared by the server
// (supervisor/api) and its clients (client): the run request and the run as the API
// shows it, and RFC 9457 problem documents with their stable codes. It is a leaf: a
// client links none of the daemon (no engine, no database, no HTTP framework).
package wire

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// The problem codes. They are stable: clients may switch on them.
const (
	CodeInvalidJSON    = "invalid_json"   // 400: the body is not JSON of the expected shape
	CodeUnknownField   = "unknown_field"  // 400: the body has a member the API does not know
	CodeBadRequest     = "bad_request"    // 400: a value is not acceptable (code and path, NUL bytes, ...)
	CodeLimitExceeded  = "limit_exceeded" // 400: a limit above policy's maximum, or nonsensical
	CodeForbidden      = "forbidden"      // 403: the caller has no role for this
	CodeUnauthorized   = "unauthorized"   // 401: a TCP caller without a valid bearer token
	CodeNotFound       = "not_found"      // 404: no such run or route
	CodeMethod         = "method_not_allowed"
	CodeBodyTooLarge   = "body_too_large"         // 413: the body is over runs.max_request_bytes
	CodeQueueFull      = "queue_full"             // 429: every worker busy and the queue full (Retry-After)
	CodeCallerLimit    = "caller_limit"           // 429: this caller has runs.max_per_caller runs running or queued (Retry-After)
	CodeDisabled       = "disabled"               // 503: the kill switch is on
	CodeNotReady       = "not_ready"              // 503: the sandbox has not been verified (or a check fails)
	CodeNotAlive       = "not_alive"              // 503 on /livez: a liveness check fails (restart the daemon)
	CodeStopping       = "stopping"               // 503: the daemon is shutting down
	CodeInternal       = "internal_error"         // 500
	CodeUnsupportedMed = "unsupported_media_type" // 415: the body is not application/json
	CodeAuditDown      = "audit_unavailable"      // 503: the audit log cannot be written, so no run starts
	CodeConnLimit      = "connection_limit"       // 429: this uid has runs.max_connections_per_uid connections open
	CodeTimeout        = "request_timeout"        // 408: the body did not arrive in time
	CodeUnsafeFile     = "unsafe_file"            // 409: the name is a link, FIFO, directory or file with other hard links
	CodeQuota          = "quota_exceeded"         // 507: the workspace's byte or file quota would be or is exceeded

	CodeStatementRefused    = "statement_refused"    // 403: a SQL statement refused with or without approval
	CodeApprovalRequired    = "approval_required"    // 403: the statement writes; approval_id names the request
	CodeApprovalUnavailable = "approval_unavailable" // 403: the statement writes and no approver is configured
	CodeApprovalInvalid     = "approval_invalid"     // 409: the approval is pending, denied, spent, expired or for another request
	CodeSQLError            = "sql_error"            // 400/404/409/422: SQLite failed; sql_code says how
	CodeTooManyPending      = "too_many_pending"     // 429: the caller has approvals.MaxPending approvals waiting
	CodeWorkspaceBusy       = "workspace_busy"       // 409: a run or statement is using the workspace (or approved code or an approved SQL write holds it alone)
	CodeSessionLimit        = "session_limit"        // 429: this caller (or the daemon) has as many MCP sessions, or interpreter sessions, open as may be
	CodeSessionBusy         = "session_busy"         // 409: a cell of the session is running
	CodeSessionLost         = "session_lost"         // 410: the session's interpreter state was lost (a cell past its limits ended it)
	CodeBackendUnavailable  = "backend_unavailable"  // 503: the backend asked for is not installed here, or its files failed verification
)

// Codes lists every problem code (TestOpenAPI keeps the document's list equal).
func Codes() []string {
	return []string{CodeInvalidJSON, CodeUnknownField, CodeBadRequest, CodeLimitExceeded, CodeForbidden,
		CodeNotFound, CodeMethod, CodeBodyTooLarge, CodeQueueFull, CodeCallerLimit, CodeDisabled, CodeNotReady, CodeNotAlive, CodeStopping,
		CodeInternal, CodeUnsupportedMed, CodeUnauthorized, CodeAuditDown, CodeConnLimit, CodeTimeout, CodeUnsafeFile, CodeQuota,
		CodeStatementRefused, CodeApprovalRequired, CodeApprovalUnavailable, CodeApprovalInvalid, CodeSQLError,
		CodeTooManyPending, CodeWorkspaceBusy, CodeSessionLimit, CodeSessionBusy, CodeSessionLost, CodeBackendUnavailable}
}

// Problem is an RFC 9457 problem document.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
	// Extensions are the document's other members (approval_id, sql_code, ...), as
	// a client read them; the daemon writes its own through JSON's ext.
	Extensions map[string]json.RawMessage `json:"-"`
}

// ProblemType is the prefix of every problem's type URI; the code follows it.
const ProblemType = "urn:sandcell:problem:"

// NewProblem is the problem document of status and code, the one way the daemon
// builds one: its type is ProblemType+code, its title the status's text.
func NewProblem(status int, code, detail string) Problem {
	return Problem{Type: ProblemType + code, Title: http.StatusText(status), Status: status, Detail: detail, Code: code}
}

// ContentType is the media type of a problem document (RFC 9457 section 3).
const ContentType = "application/problem+json"

// JSON encodes p, with ext as extension members beside its own (RFC 9457 section
// 3.2; a member of p's own is never replaced).
func (p Problem) JSON(ext map[string]any) []byte {
	b, _ := json.Marshal(p)
	if len(ext) == 0 {
		return b
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	for k, v := range ext {
		if _, own := m[k]; !own {
			m[k] = v
		}
	}
	b, _ = json.Marshal(m)
	return b
}

// WriteProblem answers p, with ext as extension members (see JSON): its status, the
// problem media type, the document and a newline. It is the one way the daemon
// writes a problem: the API's handlers, its health probes and its connection limiter.
func WriteProblem(w http.ResponseWriter, p Problem, ext map[string]any) {
	w.Header().Set("Content-Type", ContentType)
	w.WriteHeader(p.Status)
	w.Write(append(p.JSON(ext), '\n'))
}

// Error makes a Problem an error (what the client package returns).
func (p *Problem) Error() string {
	if p.Detail != "" {
		return fmt.Sprintf("%s (%d %s): %s", p.Code, p.Status, p.Title, p.Detail)
	}
	return fmt.Sprintf("%s (%d %s)", p.Code, p.Status, p.Title)
}

// SQLRequest is the body of POST /v1/sql.
type SQLRequest struct {
	// Workspace is the id of a workspace the caller owns.
	Workspace string `json:"workspace"`
	// DB is the database file's path in the workspace.
	DB string `json:"db"`
	// SQL is one statement.
	SQL string `json:"sql"`
	// Params bind its parameters: an array or an object; {"base64": ...} is a blob.
	Params json.RawMessage `json:"params,omitempty"`
	// MaxRows bounds the rows returned (default 1000, at most 100000).
	MaxRows int `json:"max_rows,omitempty"`
	// Approval is the id of an approved approval for exactly this request: the
	// statement then runs read-write, once.
	Approval string `json:"approval,omitempty"`
}

// WorkspaceFile is one name in a workspace (GET /v1/workspaces/{id} lists them).
type WorkspaceFile struct {
	// Path is relative to the workspace, slash-separated.
	Path string `json:"path"`
	// Type is "file", "dir", "symlink", "fifo", "socket", "device" or "other".
	Type string `json:"type"`
	// Size is the apparent size in bytes (regular files only).
	Size int64 `json:"size"`
}

// Workspace is the body of POST /v1/workspaces and GET /v1/workspaces/{id} (the
// members a client reads).
type Workspace struct {
	ID        string          `json:"id"`
	Files     []WorkspaceFile `json:"files,omitempty"`
	OverQuota bool            `json:"over_quota"`
	// Next, when more names follow, is the after= of the next page.
	Next string `json:"next,omitempty"`
}

// RunRequest is the body of POST /v1/runs.
type RunRequest struct {
	// Backend is where the code runs: "wasm" (the default: CPython compiled to
	// WebAssembly, the standard library and a pure-Python site layer) or "native"
	// (Debian's CPython with numpy, pandas, matplotlib, scipy, scikit-learn, seaborn
	// and statsmodels, as a hardened process), where policy lets the caller
	// ([native] runners; 403 forbidden otherwise, 503 backend_unavailable where it
	// is not installed). The result's enforcement contract names it.
	Backend string `json:"backend,omitempty"`
	// Code is the Python source to run. Exactly one of Code and Path is set.
	Code string `json:"code,omitempty"`
	// Path is a .py file of the workspace (relative to it; Workspace must be set)
	// to run instead, as /ws/Path.
	Path string `json:"path,omitempty"`
	// Args are the program's arguments (sys.argv[1:]).
	Args []string `json:"args,omitempty"`
	// Stdin is the program's whole standard input.
	Stdin string `json:"stdin,omitempty"`
	// StdinEncoding "base64" says Stdin is base64 (for bytes that are not UTF-8);
	// empty means Stdin is the text itself.
	StdinEncoding string `json:"stdin_encoding,omitempty"`
	// Env is the guest's environment; names must be in policy's allowlist.
	Env map[string]string `json:"env,omitempty"`
	// Limits lower the defaults; none may exceed policy's maximum.
	Limits RunLimits `json:"limits,omitempty"`
	// Wait false answers 202 at once with a Location; the default waits for the end.
	Wait *bool `json:"wait,omitempty"`
	// Workspace is the id of a workspace (POST /v1/workspaces) the run gets as /ws;
	// empty gives the run a fresh private one, removed when it ends.
	Workspace string `json:"workspace,omitempty"`
	// Approval is the id of an approved approval for exactly this request, where
	// policy holds runs for approval (approvals.required has "run"): the run then
	// starts, once.
	Approval string `json:"approval,omitempty"`
}

// SessionRequest is the body of POST /v1/sessions.
type SessionRequest struct {
	// Workspace is the id of a workspace the session gets as /ws; empty gives it a
	// fresh private one, removed when it ends.
	Workspace string `json:"workspace,omitempty"`
	// Limits: MemoryMiB bounds the session's interpreter for its whole life; the
	// others are each cell's defaults (a cell may lower them). None may exceed
	// policy's maximum.
	Limits RunLimits `json:"limits,omitempty"`
	// Env is the session's environment (names in policy's allowlist).
	Env map[string]string `json:"env,omitempty"`
	// Backend is the session's backend, as a run's (RunRequest.Backend). A native
	// session's checkpoint is a process forked before each cell: a cell that does
	// not end by itself (its wall clock, its CPU limit, a cancel) is rolled back to
	// it; it is never paused (it lives until idle_timeout or close; the daemon's
	// stop ends it, lost), and it cannot be forked (400).
	Backend string `json:"backend,omitempty"`
}

// CellRequest is the body of POST /v1/sessions/{id}/cells.
type CellRequest struct {
	// Code is the cell's Python source; a last expression's value is the
	// answer's Value, as the interactive interpreter shows it.
	Code string `json:"code"`
	// Stdin is the cell's whole standard input, and StdinEncoding as a run's.
	Stdin         string `json:"stdin,omitempty"`
	StdinEncoding string `json:"stdin_encoding,omitempty"`
	// Limits lower the session's for this cell: TimeoutMS, CPUMS, MaxOutputBytes
	// (MemoryMiB and Fuel are the session's).
	Limits RunLimits `json:"limits,omitempty"`
	// Approval is the id of an approved approval for exactly this cell, where
	// policy holds code for approval (approvals.required names "run"): the cell's
	// code, stdin and limits, its session, and its workspace's files.
	Approval string `json:"approval,omitempty"`
}

// SessionState says what became of a session's interpreter state after a cell:
// SessionPreserved (the cell ended by itself, an exception included; what it did is
// kept), SessionRestored (as preserved, and the session had been paused: its state
// came back from its checkpoint on disk, after an idle pause, the memory budget or
// a daemon restart, without the files it held open), SessionRolledBack (it did not
// end by itself: its time or CPU limit, a trap, an uncaught MemoryError, a cancel,
// the quota; the interpreter is back to its state before the cell, files it wrote
// excepted) or SessionLost (not even that: the worker is gone, with the state; the
// cell's result says why).
type SessionState string

// The session states.
const (
	SessionPreserved  SessionState = "preserved"
	SessionRestored   SessionState = "restored"
	SessionRolledBack SessionState = "rolled_back"
	SessionLost       SessionState = "lost"
)

// SessionView is an interpreter session as the API shows it.
type SessionView struct {
	ID        string    `json:"id"`
	Workspace string    `json:"workspace,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	LastUsed  time.Time `json:"last_used_at"`
	Cells     int       `json:"cells"`
	// State is "ready", "busy" (a cell is running), "paused" (its state is on disk,
	// CheckpointBytes of it, and its next cell resumes it) or "lost" (with Lost
	// saying why).
	State           string `json:"state"`
	Lost            string `json:"lost,omitempty"`
	CheckpointBytes int64  `json:"checkpoint_bytes,omitempty"`
	// RestoredAt is when the session last came back from its checkpoint.
	RestoredAt *time.Time `json:"restored_at,omitempty"`
	// ForkedFrom is the session this one was forked from.
	ForkedFrom string `json:"forked_from,omitempty"`
	// MemoryBytes is the interpreter's memory as its cells have grown it.
	MemoryBytes int64 `json:"memory_bytes"`
	// Enforcement is the contract the session's worker verified; every cell runs
	// under it. Empty while the session is paused (a resumed worker verifies it
	// again).
	Enforcement protocol.Enforcement `json:"enforcement"`
	// PauseFailed says why a live session is not paused although it was to be
	// (idle past sessions.pause_after, or chosen to free memory): its last pause
	// failed. Absent when no pause has failed since the session was last paused
	// (nor, for PauseOverBound, since its last cell).
	PauseFailed *PauseFailure `json:"pause_failed,omitempty"`
}

// The reasons of a PauseFailure.
const (
	// PauseOverBound: the checkpoint would pass its caller's
	// sessions.max_paused_bytes_per_caller (beside its other paused sessions).
	PauseOverBound = "bound"
	// PauseWriteFailed: the checkpoint could not be written (the state file system
	// full, or failing).
	PauseWriteFailed = "write"
)

// PauseFailure is why a session's last pause failed, and when it is tried again.
type PauseFailure struct {
	// Reason is PauseOverBound or PauseWriteFailed; Error says more.
	Reason string    `json:"reason"`
	Error  string    `json:"error"`
	At     time.Time `json:"at"`
	// Failures counts the session's pauses that failed in a row for Reason.
	Failures int `json:"failures"`
	// NeedBytes is, for PauseOverBound, what the checkpoint needs at least.
	NeedBytes int64 `json:"need_bytes,omitempty"`
	// NextTryAt is when the session, if it is still idle, is tried again (after a
	// PauseWriteFailed: 1 minute after the first failure, doubling up to 1 hour).
	// Absent after a PauseOverBound: it is not tried again before it runs another
	// cell (its state changes) or its caller's paused sessions leave it the room.
	NextTryAt *time.Time `json:"next_try_at,omitempty"`
}

// CellAnswer is the answer to a cell: how it ended (a run's Result, with the
// session's contract), what became of the session's state, and the session as it
// is now.
type CellAnswer struct {
	State SessionState `json:"state"`
	// Value is the value of the cell's last expression as the interactive
	// interpreter shows it (sys.displayhook: its repr, without the line end),
	// apart from the output; absent when the cell does not end with an
	// expression, when its value is None, or when the cell did not end normally.
	// ValueTruncated says it was cut at the stdout cap.
	Value          string          `json:"value,omitempty"`
	ValueTruncated bool            `json:"value_truncated,omitempty"`
	Result         protocol.Result `json:"result"`
	Session        SessionView     `json:"session"`
}

// WriteJSON writes a as JSON to w, streaming the result's output (see
// protocol.Result.WriteJSON): no copy of the output is made to answer.
func (a CellAnswer) WriteJSON(w io.Writer) error {
	head, err := json.Marshal(struct {
		State          SessionState `json:"state"`
		Value          string       `json:"value,omitempty"`
		ValueTruncated bool         `json:"value_truncated,omitempty"`
		Session        SessionView  `json:"session"`
	}{a.State, a.Value, a.ValueTruncated, a.Session})
	if err != nil {
		return err
	}
	w.Write(head[:len(head)-1]) // without the closing brace
	io.WriteString(w, `,"result":`)
	if err := a.Result.WriteJSON(w); err != nil {
		return err
	}
	_, err = io.WriteString(w, "}")
	return err
}

// RunLimits are a request's limits; zero fields take policy's defaults.
type RunLimits struct {
	TimeoutMS      int64  `json:"timeout_ms,omitempty"`
	CPUMS          int64  `json:"cpu_ms,omitempty"`
	MemoryMiB      int64  `json:"memory_mib,omitempty"`
	Fuel           uint64 `json:"fuel,omitempty"`
	MaxOutputBytes int64  `json:"max_output_bytes,omitempty"`
}

// State is where a run is in its life.
type State string

// The run states.
const (
	Queued  State = "queued"
	Running State = "running"
	Done    State = "done"
)

// View is a run as the API shows it.
type View struct {
	ID         string           `json:"id"`
	State      State            `json:"state"`
	CreatedAt  time.Time        `json:"created_at"`
	FinishedAt *time.Time       `json:"finished_at,omitempty"`
	Result     *protocol.Result `json:"result,omitempty"`
	// Waiting says that one of the running program's tool calls waits for a
	// person's decision (code mode): the approval, and the tool.
	Waiting *Waiting `json:"waiting,omitempty"`
}

// Waiting is a run's tool call waiting for approval Approval (of Tool, SOURCE.TOOL).
type Waiting struct {
	Approval string `json:"approval"`
	Tool     string `json:"tool"`
	// Confirmable: the caller's own confirmation (asked of the person at its MCP
	// client) would decide it (approvals.elicitation).
	Confirmable bool `json:"confirmable,omitempty"`
}

// WriteJSON writes v as JSON to w, streaming the result's output (see
// protocol.Result.WriteJSON): answering many readers of a large result costs a small
// buffer each, not a copy of the output each.
func (v View) WriteJSON(w io.Writer) error {
	res := v.Result
	v.Result = nil
	head, err := json.Marshal(v)
	if err != nil || res == nil {
		w.Write(head)
		return err
	}
	w.Write(head[:len(head)-1]) // without the closing brace
	io.WriteString(w, `,"result":`)
	if err := res.WriteJSON(w); err != nil {
		return err
	}
	_, err = io.WriteString(w, "}")
	return err
}
