/**
 * Errors: one class per kind of problem the daemon answers, chosen by its stable
 * problem+json `code` (docs/api.md), and two for a daemon that cannot be reached.
 */

/** Base of every error this package throws. */
export class SandcellError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * The exchange with the daemon failed: it could not be reached or stopped answering
 * (no socket, connection refused or reset), or answered something that is not the
 * API's document. The request may or may not have been carried out: read the run or
 * session back before sending it again.
 */
export class TransportError extends SandcellError {}

/** No answer within the timeout (the request's, or the run's for a run's answer). */
export class TimeoutError extends TransportError {}

/** A file over the size the caller would read (readFile's maxBytes); `size` is at least what was seen. */
export class FileTooLarge extends SandcellError {
  constructor(readonly size: number, readonly maxBytes: number) {
    super(`the file has ${size} bytes or more, over the ${maxBytes} this read takes`);
  }
}

/** A problem+json document, as the daemon sends it. */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  code?: string;
  [extension: string]: unknown;
}

/**
 * The daemon answered with a problem: `status` (HTTP), `code` (stable, e.g.
 * "queue_full"), `detail`, `retryAfter` (seconds, or undefined) and the whole
 * `problem` with its extension members.
 */
export class ProblemError extends SandcellError {
  readonly status: number;
  readonly code: string;
  readonly title: string;
  readonly detail: string;
  readonly retryAfter: number | undefined;
  readonly problem: Problem;

  constructor(status: number, problem: Problem, retryAfter?: number) {
    const code = String(problem.code ?? "");
    super(`${status} ${code}: ${problem.detail || problem.title || ""}`);
    this.status = status;
    this.code = code;
    this.title = String(problem.title ?? "");
    this.detail = String(problem.detail ?? "");
    this.retryAfter = retryAfter;
    this.problem = problem;
  }
}

/**
 * 400 (invalid_json, unknown_field, bad_request, limit_exceeded), 405, 413, 415: the
 * request is wrong; and 408 request_timeout: its body stopped arriving.
 */
export class BadRequest extends ProblemError {}
/** 401 unauthorized: over TCP, no valid bearer token. */
export class Unauthorized extends ProblemError {}
/**
 * 403 forbidden: the caller has no role for this; statement_refused; approval_unavailable
 * (it would need a person's approval, and no approver is configured).
 */
export class Forbidden extends ProblemError {}
/**
 * 403 approval_required: the request waits for a person; once `approvalId` is
 * approved, send the same request again with it.
 */
export class ApprovalRequired extends ProblemError {
  get approvalId(): string {
    return String(this.problem.approval_id ?? "");
  }
}
/** 404 not_found (another caller's run, session or workspace does not exist either). */
export class NotFound extends ProblemError {}
/** 409: unsafe_file, workspace_busy, session_busy, approval_invalid. */
export class Conflict extends ProblemError {}
/** 410 session_lost: the session's interpreter state is gone. */
export class SessionLost extends ProblemError {}
/** 507 quota_exceeded. */
export class QuotaExceeded extends ProblemError {}
/** 429: queue_full, caller_limit, connection_limit, session_limit, too_many_pending. */
export class RateLimited extends ProblemError {}
/** 503: not_ready, stopping, disabled, audit_unavailable, backend_unavailable. */
export class Unavailable extends ProblemError {}
/** sql_error: SQLite refused or failed the statement; `sqlCode` says how. */
export class SQLError extends ProblemError {
  get sqlCode(): string {
    return String(this.problem.sql_code ?? "");
  }
}
/** 500 internal_error, or a status this package does not know. */
export class InternalError extends ProblemError {}

type ProblemClass = new (status: number, problem: Problem, retryAfter?: number) => ProblemError;

const byCode: Record<string, ProblemClass> = {
  invalid_json: BadRequest,
  unknown_field: BadRequest,
  bad_request: BadRequest,
  limit_exceeded: BadRequest,
  request_timeout: BadRequest,
  body_too_large: BadRequest,
  unsupported_media_type: BadRequest,
  method_not_allowed: BadRequest,
  unauthorized: Unauthorized,
  forbidden: Forbidden,
  statement_refused: Forbidden,
  approval_required: ApprovalRequired,
  approval_unavailable: Forbidden,
  not_found: NotFound,
  unsafe_file: Conflict,
  workspace_busy: Conflict,
  session_busy: Conflict,
  approval_invalid: Conflict,
  session_lost: SessionLost,
  quota_exceeded: QuotaExceeded,
  queue_full: RateLimited,
  caller_limit: RateLimited,
  connection_limit: RateLimited,
  session_limit: RateLimited,
  too_many_pending: RateLimited,
  disabled: Unavailable,
  not_ready: Unavailable,
  not_alive: Unavailable,
  stopping: Unavailable,
  audit_unavailable: Unavailable,
  backend_unavailable: Unavailable,
  sql_error: SQLError,
  internal_error: InternalError,
};

const byStatus: Record<number, ProblemClass> = {
  400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: BadRequest, 408: BadRequest,
  409: Conflict, 410: SessionLost, 413: BadRequest, 415: BadRequest, 429: RateLimited, 503: Unavailable,
  507: QuotaExceeded,
};

/** The error for a problem document: by its code, else by its status. */
export function problemError(status: number, problem: Problem, retryAfter?: number): ProblemError {
  const cls = byCode[String(problem.code ?? "")] ?? byStatus[status] ?? InternalError;
  return new cls(status, problem, retryAfter);
}
