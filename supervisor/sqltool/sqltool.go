// Package sqltool runs one SQL statement against a SQLite file in a workspace. The
// statement and the file are untrusted, so neither is ever parsed by the daemon: a
// hardened worker runs sqlrun.py in the sandboxed CPython, whose sqlite3 module
// classifies the statement (SQLite's own bytecode, under an authorizer, on a
// read-only connection) and runs it when allowed. Reads run at once; writes need an
// approval (the caller's business: see approvals.Queue); ATTACH, DETACH,
// VACUUM INTO, file-naming and protection-undoing PRAGMAs, extension loading,
// transaction control and more than one statement are always refused.
package sqltool

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

//go:embed sqlrun.py
var program string

// Limits of a statement.
const (
	// DefaultMaxRows is max_rows when a request gives none; MaxRows the most it may ask.
	DefaultMaxRows = 1000
	MaxRows        = 100_000
	// DefaultTimeoutMS bounds a statement's run (the progress handler interrupts it).
	DefaultTimeoutMS = 10_000
	// maxResultBytes bounds the worker's output (the JSON result).
	maxResultBytes = 32 << 20
)

// Request is one statement.
type Request struct {
	// DB is the database file, relative to the workspace (an untrusted path: only a
	// regular file beneath the workspace, reached without symbolic links; never a URI).
	DB string `json:"db"`
	// SQL is exactly one statement.
	SQL string `json:"sql"`
	// Params bind the statement's parameters: a JSON array (positional) or object
	// (named) of null, numbers (integers within 64 bits), strings, or
	// {"base64": "..."} for a blob.
	Params json.RawMessage `json:"params,omitempty"`
	// MaxRows bounds the rows returned (0: DefaultMaxRows); more are dropped and the
	// result says truncated.
	MaxRows int `json:"max_rows,omitempty"`
	// Write runs a statement that writes, read-write (only with an approval).
	Write bool `json:"-"`
	// DBSHA256, with Write, is the hex SHA-256 of the database file the write was
	// approved on: the worker hashes the file before it writes and answers "stale"
	// when it differs.
	DBSHA256 string `json:"-"`
	// TimeoutMS bounds the statement (0: DefaultTimeoutMS).
	TimeoutMS int64 `json:"-"`
	// Recover runs no statement (SQL is ignored): it removes the lock a stopped
	// worker left on DB and plays back its hot journal, read-write. Only while
	// nothing else uses the workspace: a live holder's lock would be broken.
	Recover bool `json:"-"`
}

// Recovered says what a Recover request undid: the database's lock directory
// (DB.lock, SQLite's lock between programs in the guest, which outlives a stopped
// holder) and a hot rollback journal, played back (the file returns to its last
// committed state).
type Recovered struct {
	LockRemoved       bool `json:"lock_removed"`
	JournalRolledBack bool `json:"journal_rolled_back"`
}

// Column is a result column: its name and, where SQLite knows it, declared type.
type Column struct {
	Name     string `json:"name"`
	DeclType string `json:"decl_type,omitempty"`
}

// Classification is what SQLite says the statement does.
type Classification struct {
	// Kind is "read" or "write".
	Kind string `json:"kind"`
	// Bytecode lists the writing opcodes EXPLAIN showed (OpenWrite, SetCookie, ...).
	Bytecode []string `json:"bytecode"`
	// Pragmas lists PRAGMAs given a value.
	Pragmas []string `json:"pragmas"`
}

// Error is SQLite's failure, with a stable code: sql_syntax_error, sql_error,
// sql_not_a_database, sql_busy (locked, or a stopped writer's journal waits to be
// played back), sql_interrupted, sql_cannot_open, sql_not_authorized.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	SQLite  string `json:"sqlite,omitempty"`
}

// Outcome is the worker's answer. Status is "ok", "approval_required" (a write
// without Write; DBSHA256 is then the database file's hex SHA-256, hashed in the
// worker), "refused" (Reason says why), "stale" (an approved write whose file no
// longer has the DBSHA256 it was approved on; nothing ran) or "error".
type Outcome struct {
	Status         string            `json:"status"`
	Reason         string            `json:"reason,omitempty"`
	Classification *Classification   `json:"classification"`
	Columns        []Column          `json:"columns"`
	Rows           []json.RawMessage `json:"rows"`
	Truncated      bool              `json:"truncated,omitempty"`
	Changes        int64             `json:"changes,omitempty"`
	DBSHA256       string            `json:"db_sha256,omitempty"`
	ElapsedMS      float64           `json:"elapsed_ms"`
	Error          *Error            `json:"error,omitempty"`
	Recovered      *Recovered        `json:"recovered,omitempty"`
	// Layers are the enforcement layers the worker ran under (its contract), for the
	// audit record; not part of the answer.
	Layers []string `json:"-"`
}

// ErrBadRequest wraps a request refused before a worker is spent on it.
var ErrBadRequest = errors.New("sqltool: bad request")

// Runner runs a worker (sandbox.Spawner).
type Runner interface {
	Run(ctx context.Context, req protocol.Request) (protocol.Result, error)
}

// Check validates req and fills its defaults. Errors wrap ErrBadRequest, or are
// workspace's ErrBadPath, ErrNotFound or ErrUnsafe for the database path.
func Check(dir string, req *Request) error {
	switch {
	case strings.TrimSpace(req.SQL) == "" && !req.Recover:
		return fmt.Errorf("%w: sql is required", ErrBadRequest)
	case strings.ContainsRune(req.SQL, 0):
		return fmt.Errorf("%w: sql contains a NUL byte", ErrBadRequest)
	case req.MaxRows < 0 || req.MaxRows > MaxRows:
		return fmt.Errorf("%w: max_rows must be between 0 (the default, %d) and %d", ErrBadRequest, DefaultMaxRows, MaxRows)
	case strings.Contains(req.DB, ":") || strings.ContainsAny(req.DB, "?#"):
		// A path, never a URI ("file:x?mode=rwc") or anything with a query.
		return fmt.Errorf("%w: db %q: a path in the workspace, not a URI", ErrBadRequest, req.DB)
	}
	if len(req.Params) > 0 {
		var p any
		if err := json.Unmarshal(req.Params, &p); err != nil {
			return fmt.Errorf("%w: params: %v", ErrBadRequest, err)
		}
		switch p.(type) {
		case []any, map[string]any, nil:
		default:
			return fmt.Errorf("%w: params must be an array or an object", ErrBadRequest)
		}
	}
	if req.MaxRows == 0 {
		req.MaxRows = DefaultMaxRows
	}
	if req.TimeoutMS <= 0 {
		req.TimeoutMS = DefaultTimeoutMS
	}
	return workspace.CheckFile(dir, req.DB)
}

// Run executes req in a worker with the workspace dir as /ws. base gives the worker
// its module, library, hardening and memory; its limits are adjusted for the tool.
// The error is non-nil only when the worker could not run or its answer could not be
// read; SQLite's own failures are an Outcome with Status "error".
func Run(ctx context.Context, r Runner, dir string, req Request, base protocol.Request) (Outcome, error) {
	if err := Check(dir, &req); err != nil {
		return Outcome{}, err
	}
	params := req.Params
	if len(params) == 0 {
		params = json.RawMessage("null")
	}
	in, err := json.Marshal(map[string]any{"db": "/ws/" + req.DB, "sql": req.SQL, "params": params,
		"max_rows": req.MaxRows, "write": req.Write, "timeout_ms": req.TimeoutMS, "db_sha256": req.DBSHA256,
		"recover": req.Recover})
	if err != nil {
		return Outcome{}, err
	}
	w := base
	w.Code, w.Filename, w.Stdin, w.Workspace, w.Args, w.Env = program, "<sandcell-sql>", in, dir, nil, nil
	// The program runs with the workspace as /ws: it must import nothing from there.
	w.Path, w.Isolated = "", true
	// The statement's own limit acts first; the worker's wall clock is the backstop.
	w.Limits.TimeoutMS = req.TimeoutMS + 5_000
	w.Limits.CPUMS = 0
	w.Limits.MaxStdoutBytes = maxResultBytes
	if w.Hardening.Rlimits.CPU > 0 {
		w.Hardening.Rlimits.CPU = uint64(w.Limits.TimeoutMS/1000) + 2
	}
	res, err := r.Run(ctx, w)
	if err != nil {
		return Outcome{}, err
	}
	var out Outcome
	switch {
	case res.Reason == protocol.OutputLimit:
		return Outcome{Status: "error", Error: &Error{Code: "sql_result_too_large",
			Message: fmt.Sprintf("the result is over %d bytes: ask for fewer rows (max_rows)", maxResultBytes)}}, nil
	case res.Reason == protocol.MemoryLimit:
		return Outcome{Status: "error", Error: &Error{Code: "sql_out_of_memory",
			Message: "the statement ran out of memory: ask for fewer rows (max_rows), or a smaller result"}}, nil
	case res.Reason == protocol.QuotaExceeded:
		return Outcome{Status: "error", Error: &Error{Code: "sql_quota_exceeded",
			Message: "the workspace grew past its quota during the statement: " + strings.Join(res.Diagnostics, "; ")}}, nil
	case res.Reason == protocol.Timeout || res.Reason == protocol.CPULimit:
		return Outcome{Status: "error", Error: &Error{Code: "sql_interrupted", Message: "the statement ran past its time limit"}}, nil
	case res.Reason != protocol.Exited || res.ExitCode != 0:
		return Outcome{}, fmt.Errorf("sqltool: worker ended %s (exit %d): %s %s", res.Reason, res.ExitCode,
			strings.Join(res.Diagnostics, "; "), tail(res.Stderr))
	}
	if err := json.Unmarshal(res.Stdout, &out); err != nil || out.Status == "" {
		return Outcome{}, fmt.Errorf("sqltool: unreadable answer %q: %v", tail(res.Stdout), err)
	}
	if res.Enforcement != nil {
		out.Layers = res.Enforcement.ActiveLayers()
	}
	if out.Status == "ok" {
		if out.Rows == nil {
			out.Rows = []json.RawMessage{}
		}
		if out.Columns == nil {
			out.Columns = []Column{}
		}
	}
	return out, nil
}

func tail(b []byte) string {
	if len(b) > 300 {
		b = b[len(b)-300:]
	}
	return strings.TrimSpace(string(b))
}
