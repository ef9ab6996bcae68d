package toolbroker

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/sqltool"
)

// SQL runs one statement of a database source in a SQL worker (the daemon's, as
// POST /v1/sql runs one), with the database's directory as the worker's workspace,
// for caller.
type SQL func(ctx context.Context, caller identity.Caller, dir string, req sqltool.Request) (sqltool.Outcome, error)

// databaseTools is what a database source offers: one tool, query.
func databaseTools(name string, writable bool) []tool {
	desc := "Run one SQL statement (SQLite) on the operator's database " + name + " and return its columns and rows. " +
		"Reads run at once; "
	if writable {
		desc += "a statement that writes waits for a person's approval."
	} else {
		desc += "the database is read-only: a statement that writes is refused."
	}
	schema := `{"type":"object","properties":{` +
		`"sql":{"type":"string","description":"exactly one statement"},` +
		`"params":{"type":["array","object"],"description":"its parameters: a list (?) or an object (:name)"},` +
		`"max_rows":{"type":"integer","description":"the most rows returned (default 1000)"}},"required":["sql"]}`
	return []tool{{server: "query", spec: protocol.ToolSpec{Name: name + ".query", Description: desc,
		InputSchema: json.RawMessage(schema), Writes: writable}}}
}

// query answers a call of a database source's query: the statement runs read-only
// and is classified by SQLite; a read's rows are the answer; a write is refused
// (a read-only database), or held for a person's approval (approve, as any tool
// that writes) and then run read-write on the file as it was when classified (a
// file changed since is refused: stale).
func (c *calls) query(ctx context.Context, s *source, call protocol.ToolCall, clock sandbox.Clock, rec map[string]any) protocol.ToolAnswer {
	if c.b.o.SQL == nil {
		rec["decision"] = "failed"
		return failure(protocol.ToolErrorFailed, "the daemon runs no SQL worker here")
	}
	var args struct {
		SQL     string          `json:"sql"`
		Params  json.RawMessage `json:"params"`
		MaxRows int             `json:"max_rows"`
	}
	if err := json.Unmarshal(call.Arguments, &args); err != nil || args.SQL == "" {
		rec["decision"] = "failed"
		return failure(protocol.ToolErrorFailed, "give sql: one statement (and params, max_rows)")
	}
	if string(args.Params) == "null" {
		args.Params = nil
	}
	dir, db := filepath.Dir(s.cfg.Path), filepath.Base(s.cfg.Path)
	req := sqltool.Request{DB: db, SQL: args.SQL, Params: args.Params, MaxRows: args.MaxRows}
	out, err := c.b.o.SQL(ctx, c.scope.Caller, dir, req)
	if err == nil && out.Status == "approval_required" {
		rec["classification"] = "write"
		if !s.cfg.Writable {
			rec["decision"] = "denied"
			return failure(protocol.ToolErrorDenied, fmt.Sprintf("%s is read-only, and this statement writes", s.name))
		}
		if *s.cfg.Approval {
			if answer, ok := c.approveOrGrant(ctx, call, clock, rec); !ok {
				return answer
			}
		}
		req.Write, req.DBSHA256 = true, out.DBSHA256
		out, err = c.b.o.SQL(ctx, c.scope.Caller, dir, req)
	}
	switch {
	case err != nil:
		return failure(protocol.ToolErrorFailed, "the statement could not run: "+err.Error())
	case out.Status == "ok":
		names := make([]string, len(out.Columns))
		for i, col := range out.Columns {
			names[i] = col.Name
		}
		res, _ := json.Marshal(map[string]any{"columns": names, "rows": out.Rows, "truncated": out.Truncated, "changes": out.Changes})
		return protocol.ToolAnswer{Result: res}
	case out.Status == "refused":
		return failure(protocol.ToolErrorDenied, "the statement is refused: "+out.Reason)
	case out.Status == "stale":
		return failure(protocol.ToolErrorFailed, "the database changed after the write was approved: nothing ran")
	case out.Error != nil:
		return failure(protocol.ToolErrorFailed, out.Error.Code+": "+out.Error.Message)
	}
	return failure(protocol.ToolErrorFailed, "the statement ended "+out.Status)
}
