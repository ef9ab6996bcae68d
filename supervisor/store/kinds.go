package store

// Kind is what an audit record records. The catalog, with what each record's detail
// holds besides a TCP caller's "token" (every record of a caller's request names it):
//
//	kind                    written when                                   detail
//	daemon.start            the daemon has opened its log                  version, revision, config, tcp
//	daemon.reload           a SIGHUP reload applied or failed              what changed, or error
//	daemon.stop             the daemon stops                               -
//	audit.pruned            records past audit.retention were removed     records, through_seq, retention
//	access.denied           a caller lacks the role, or a TCP caller a     method, path, role, pid or remote,
//	                        valid token (at most 10 a second)              reason
//	run.requested           a run request passed its checks                code_sha256 (and code), limits, args,
//	                                                                       stdin_bytes, env names, workspace,
//	                                                                       path, approval
//	run.refused             a run request was refused                      status, code, detail, method, path
//	run.admitted            a run was given to the manager                 code_sha256
//	run.cancel              a caller cancelled a run                       -
//	run.finished            a run ended (RunFinished)                      reason, exit_code, elapsed_ms, output
//	                                                                       sizes, diagnostics, layers
//	run.aborted             a run in flight when the daemon died           -
//	sql.requested           a statement passed its checks                  workspace, db, sql_sha256 (and sql)
//	sql.finished            a statement ran                                status, classification, changes, ...
//	sql.refused             a statement was refused                        status, code, detail, method, path,
//	                                                                       and what is known: workspace, db, ...
//	sql.failed              a statement could not run, or SQLite failed    error
//	sql.recovered           a stopped worker's lock and journal undone     lock_removed, journal_rolled_back
//	approval.requested      a write or a run was held for approval         approval, db_sha256 or run_sha256, ...
//	approval.decided        an approver approved or denied, or the         approval, decision, error (and by,
//	                        requester confirmed at its MCP client          elicited)
//	approval.redeemed       an approval was presented with its request     approval, sql_sha256 or run_sha256, error
//	workspace.created       POST /v1/workspaces                            workspace, error
//	workspace.deleted       DELETE /v1/workspaces/{id}                     workspace, error
//	workspace.file_written  a file was uploaded                            workspace, path, bytes, error
//	workspace.file_read     a file was downloaded                          workspace, path, bytes, error
//	workspace.file_removed  a file was deleted                             workspace, path, error
//	workspace.refused       a workspace request was refused before it     status, code, detail, method, path
//	                        reached one (unknown or another's, a bad path)
//	mcp.refused             an MCP request was refused by the daemon (its  status, code, detail, method, path
//	                        bounds, another's session, session_limit)
//	session.opened          an interpreter session opened                  session, workspace, limits, env names,
//	                                                                       layers
//	session.refused         a session request was refused                  status, code, detail, method, path
//	session.cell            a cell passed its checks (before it runs)      session, code_sha256 (and code), limits,
//	                                                                       stdin_bytes
//	session.cell_finished   a cell ended                                   session, code_sha256, state, reason,
//	                                                                       exit_code, elapsed_ms, output sizes,
//	                                                                       diagnostics
//	session.closed          a session ended: DELETE, its idle timeout      session, why
//	session.paused          a session's state went to its checkpoint on    session, why, bytes, ms
//	                        disk and its worker ended (idle, the memory
//	                        budget, the daemon's stop)
//	session.resumed         a paused session's next cell gave it a         session, ms
//	                        worker again, from its checkpoint
//	session.lost            a session's state was lost outside a cell (a   session, why
//	                        checkpoint that cannot be resumed, a daemon
//	                        killed before it paused it)
//	tool.called             a guest's tool call was decided (and, allowed, tool, arguments_sha256, decision, and
//	                        made): one record per call                    as known: run or session and cell,
//	                                                                       result_sha256, approval, ms, error
//
// Every accepted run has run.requested, run.admitted and then exactly one of
// run.finished and run.aborted; every accepted statement has sql.requested and then
// exactly one of sql.finished, sql.refused, sql.failed and approval.requested (a write
// held for approval: the same request with the approval is a statement of its own). A
// statement's worker is not a run: it has no run.* record.
type Kind string

// The kinds of the catalog above.
const (
	DaemonStart          Kind = "daemon.start"
	DaemonReload         Kind = "daemon.reload"
	DaemonStop           Kind = "daemon.stop"
	AuditPruned          Kind = "audit.pruned"
	AccessDenied         Kind = "access.denied"
	RunRequested         Kind = "run.requested"
	RunRefused           Kind = "run.refused"
	RunAdmitted          Kind = "run.admitted"
	RunCancel            Kind = "run.cancel"
	RunFinished          Kind = "run.finished"
	RunAborted           Kind = "run.aborted"
	SQLRequested         Kind = "sql.requested"
	SQLFinished          Kind = "sql.finished"
	SQLRefused           Kind = "sql.refused"
	SQLFailed            Kind = "sql.failed"
	SQLRecovered         Kind = "sql.recovered"
	ApprovalRequested    Kind = "approval.requested"
	ApprovalDecided      Kind = "approval.decided"
	ApprovalRedeemed     Kind = "approval.redeemed"
	WorkspaceCreated     Kind = "workspace.created"
	WorkspaceDeleted     Kind = "workspace.deleted"
	WorkspaceFileWritten Kind = "workspace.file_written"
	WorkspaceFileRead    Kind = "workspace.file_read"
	WorkspaceFileRemoved Kind = "workspace.file_removed"
	WorkspaceRefused     Kind = "workspace.refused"
	MCPRefused           Kind = "mcp.refused"
	SessionOpened        Kind = "session.opened"
	SessionRefused       Kind = "session.refused"
	SessionCell          Kind = "session.cell"
	SessionCellFinished  Kind = "session.cell_finished"
	SessionClosed        Kind = "session.closed"
	SessionPaused        Kind = "session.paused"
	SessionResumed       Kind = "session.resumed"
	SessionLost          Kind = "session.lost"
	ToolCalled           Kind = "tool.called"
)

// Kinds returns every kind of the catalog, in its order.
func Kinds() []Kind {
	return []Kind{DaemonStart, DaemonReload, DaemonStop, AuditPruned, AccessDenied, RunRequested, RunRefused,
		RunAdmitted, RunCancel, RunFinished, RunAborted, SQLRequested, SQLFinished, SQLRefused, SQLFailed,
		SQLRecovered, ApprovalRequested, ApprovalDecided, ApprovalRedeemed, WorkspaceCreated, WorkspaceDeleted,
		WorkspaceFileWritten, WorkspaceFileRead, WorkspaceFileRemoved, WorkspaceRefused, MCPRefused,
		SessionOpened, SessionRefused, SessionCell, SessionCellFinished, SessionClosed, SessionPaused, SessionResumed,
		SessionLost, ToolCalled}
}
