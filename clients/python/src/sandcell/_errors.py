"""Errors: one class per kind of problem the daemon answers, chosen by its stable
problem+json ``code`` (docs/api.md), and two for a daemon that cannot be reached."""

from __future__ import annotations

from typing import Any


class SandcellError(Exception):
    """Base of every error this package raises."""


class TransportError(SandcellError):
    """The exchange with the daemon failed: it could not be reached, stopped
    answering (connection refused or reset, a missing socket, a timeout), closed the
    connection while the request was being sent (httpx before 0.24 cannot read the
    answer then: an upload over a quota is one), or answered something that is not
    the API's document. The request may or may not have been carried out: read the
    run or session back before trying it again."""


class Timeout(TransportError):
    """No answer within the timeout (connect, read or write)."""


class ProblemError(SandcellError):
    """The daemon answered with an application/problem+json document.

    Attributes: ``status`` (the HTTP status), ``code`` (the stable code, e.g.
    ``"queue_full"``), ``title``, ``detail``, ``retry_after`` (seconds, or None) and
    ``problem`` (the whole document as a dict, its extension members included).
    """

    def __init__(self, status: int, problem: dict[str, Any], retry_after: float | None = None):
        self.status = status
        self.problem = problem
        self.code: str = str(problem.get("code") or "")
        self.title: str = str(problem.get("title") or "")
        self.detail: str = str(problem.get("detail") or "")
        self.retry_after = retry_after
        super().__init__(f"{status} {self.code}: {self.detail or self.title}")


class BadRequest(ProblemError):
    """400 (invalid_json, unknown_field, bad_request, limit_exceeded), 405, 413, 415:
    the request itself is wrong, and sending it again changes nothing; and 408
    request_timeout: its body stopped arriving."""


class Unauthorized(ProblemError):
    """401 unauthorized: over TCP, no valid bearer token."""


class Forbidden(ProblemError):
    """403 forbidden: the caller has no role for this; statement_refused; and
    approval_unavailable (it would need a person's approval, and no approver is
    configured)."""


class ApprovalRequired(ProblemError):
    """403 approval_required: the request waits for a person. ``approval_id`` names
    the approval; once it is approved, send the same request again with
    ``approval=approval_id``."""

    @property
    def approval_id(self) -> str:
        return str(self.problem.get("approval_id") or "")


class NotFound(ProblemError):
    """404 not_found: no such run, session, workspace, file or approval (for this
    caller: another caller's do not exist)."""


class Conflict(ProblemError):
    """409: unsafe_file, workspace_busy, session_busy, approval_invalid."""


class SessionLost(ProblemError):
    """410 session_lost: the session's interpreter state is gone."""


class QuotaExceeded(ProblemError):
    """507 quota_exceeded: the workspace's bytes or files (or the caller's
    workspaces) are at their quota."""


class RateLimited(ProblemError):
    """429: queue_full, caller_limit, connection_limit, session_limit,
    too_many_pending. ``retry_after`` says when to try again, where the daemon said."""


class Unavailable(ProblemError):
    """503: not_ready, stopping, disabled, audit_unavailable, backend_unavailable."""


class SQLError(ProblemError):
    """sql_error: SQLite refused or failed the statement; ``sql_code`` says how."""

    @property
    def sql_code(self) -> str:
        return str(self.problem.get("sql_code") or "")


class InternalError(ProblemError):
    """500 internal_error, or any status this package does not know."""


_BY_CODE: dict[str, type[ProblemError]] = {
    "invalid_json": BadRequest,
    "unknown_field": BadRequest,
    "bad_request": BadRequest,
    "limit_exceeded": BadRequest,
    "request_timeout": BadRequest,
    "body_too_large": BadRequest,
    "unsupported_media_type": BadRequest,
    "method_not_allowed": BadRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "statement_refused": Forbidden,
    "approval_required": ApprovalRequired,
    "approval_unavailable": Forbidden,
    "not_found": NotFound,
    "unsafe_file": Conflict,
    "workspace_busy": Conflict,
    "session_busy": Conflict,
    "approval_invalid": Conflict,
    "session_lost": SessionLost,
    "quota_exceeded": QuotaExceeded,
    "queue_full": RateLimited,
    "caller_limit": RateLimited,
    "connection_limit": RateLimited,
    "session_limit": RateLimited,
    "too_many_pending": RateLimited,
    "disabled": Unavailable,
    "not_ready": Unavailable,
    "not_alive": Unavailable,
    "stopping": Unavailable,
    "audit_unavailable": Unavailable,
    "backend_unavailable": Unavailable,
    "sql_error": SQLError,
    "internal_error": InternalError,
}

_BY_STATUS: dict[int, type[ProblemError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: BadRequest,
    408: BadRequest, 409: Conflict, 410: SessionLost, 413: BadRequest, 415: BadRequest,
    429: RateLimited, 503: Unavailable, 507: QuotaExceeded,
}


def problem_error(status: int, problem: dict[str, Any], retry_after: float | None) -> ProblemError:
    """The error for a problem document: by its code, else by its status."""
    cls = _BY_CODE.get(str(problem.get("code") or "")) or _BY_STATUS.get(status, InternalError)
    return cls(status, problem, retry_after)
