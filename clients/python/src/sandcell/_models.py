"""Typed results: each a dataclass read from the daemon's JSON (supervisor/wire and
docs/api.md), keeping the whole document in ``raw`` so members this version does
not know are not lost."""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import re
from typing import Any, Optional, TypeVar

T = TypeVar("T")

_FRACTION = re.compile(r"\.(\d+)")


def _time(v: Any) -> Optional[_dt.datetime]:
    """An RFC 3339 time as the daemon writes it (nanoseconds, Z) as an aware datetime."""
    if not isinstance(v, str) or not v:
        return None
    # Go writes 0 to 9 digits of fraction; Python 3.10 reads 3 or 6 only.
    s = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], v.replace("Z", "+00:00"), count=1)
    try:
        return _dt.datetime.fromisoformat(s)
    except ValueError:
        return None


def _stream(doc: dict[str, Any], name: str) -> bytes:
    """A result's stdout or stderr as bytes: text, or base64 where the output was not UTF-8."""
    v = doc.get(name) or ""
    if doc.get(name + "_encoding") == "base64":
        return base64.b64decode(v)
    return v.encode("utf-8")


@dataclasses.dataclass(frozen=True)
class Display:
    """One item a program displayed (a figure, an object's richest representation).

    ``type`` is a MIME type (image/png, image/svg+xml, text/html, application/json,
    text/plain); ``path`` the file in the workspace holding it (read it with
    ``read_file``); ``bytes`` its size; ``width``/``height`` a PNG's pixels;
    ``text`` a text type's content up to 64 KiB (else empty: read the file).
    """

    type: str
    path: str
    bytes: int
    width: int = 0
    height: int = 0
    text: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Display":
        return cls(type=str(d.get("type", "")), path=str(d.get("path", "")), bytes=int(d.get("bytes") or 0),
                   width=int(d.get("width") or 0), height=int(d.get("height") or 0), text=str(d.get("text") or ""))


@dataclasses.dataclass(frozen=True)
class Result:
    """A finished run's or cell's outcome.

    ``reason`` says how it ended (``exited``, ``timeout``, ``cpu_limit``,
    ``memory_limit``, ``output_limit``, ``cancelled``, ``quota_exceeded``, ``trap``,
    ``rejected``, ``internal_error``);
    ``exit_code`` is the program's status. ``stdout``/``stderr`` are the output as
    text (undecodable bytes replaced); ``stdout_bytes``/``stderr_bytes`` exactly.
    ``elapsed_ms`` is wall-clock milliseconds; ``enforcement`` the contract the
    worker verified (layers, backend, rlimits) as the daemon reports it.
    """

    exit_code: int
    reason: str
    stdout_bytes: bytes
    stderr_bytes: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    elapsed_ms: float
    peak_memory_bytes: int
    worker_max_rss_bytes: int
    fuel_consumed: int
    displays: list[Display]
    diagnostics: list[str]
    enforcement: dict[str, Any]
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """The program ended by itself with status 0."""
        return self.reason == "exited" and self.exit_code == 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Result":
        return cls(exit_code=int(d.get("exit_code") or 0), reason=str(d.get("reason", "")),
                   stdout_bytes=_stream(d, "stdout"), stderr_bytes=_stream(d, "stderr"),
                   stdout_truncated=bool(d.get("stdout_truncated")), stderr_truncated=bool(d.get("stderr_truncated")),
                   elapsed_ms=float(d.get("elapsed_ms") or 0), peak_memory_bytes=int(d.get("peak_memory_bytes") or 0),
                   worker_max_rss_bytes=int(d.get("worker_max_rss_bytes") or 0),
                   fuel_consumed=int(d.get("fuel_consumed") or 0),
                   displays=[Display.from_json(x) for x in d.get("displays") or []],
                   diagnostics=[str(x) for x in d.get("diagnostics") or []],
                   enforcement=dict(d.get("enforcement") or {}), raw=d)


@dataclasses.dataclass(frozen=True)
class Waiting:
    """A running program's tool call that waits for a person: the approval's id, the
    tool, and whether the caller itself may confirm it (``confirm_approval``)."""

    approval: str
    tool: str
    confirmable: bool


@dataclasses.dataclass(frozen=True)
class Run:
    """A run: ``state`` is ``queued``, ``running`` or ``done`` (then ``result`` is set)."""

    id: str
    state: str
    created_at: Optional[_dt.datetime]
    finished_at: Optional[_dt.datetime]
    result: Optional[Result]
    waiting: Optional[Waiting]
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Run":
        w = d.get("waiting")
        return cls(id=str(d.get("id", "")), state=str(d.get("state", "")), created_at=_time(d.get("created_at")),
                   finished_at=_time(d.get("finished_at")),
                   result=Result.from_json(d["result"]) if d.get("result") else None,
                   waiting=Waiting(str(w.get("approval", "")), str(w.get("tool", "")), bool(w.get("confirmable")))
                   if isinstance(w, dict) else None, raw=d)


@dataclasses.dataclass(frozen=True)
class Output:
    """A piece of a run's output as it streams: ``stream`` is ``stdout`` or
    ``stderr``, ``data`` the bytes (a piece may end inside a UTF-8 character), ``id``
    the event's id where it has one (resume after it with ``after``)."""

    stream: str
    data: bytes
    id: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """An interpreter session as the daemon describes it: ``state`` is ``ready``,
    ``busy`` (a cell is running), ``paused`` (its state on disk) or ``lost``; ``cells`` the cells it has run; ``workspace`` the
    workspace mounted as /ws; ``enforcement`` the contract its worker verified."""

    id: str
    state: str
    workspace: str
    cells: int
    created_at: Optional[_dt.datetime]
    last_used_at: Optional[_dt.datetime]
    lost: str
    forked_from: str
    memory_bytes: int
    checkpoint_bytes: int
    restored_at: Optional[_dt.datetime]
    enforcement: dict[str, Any]
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "SessionInfo":
        return cls(id=str(d.get("id", "")), state=str(d.get("state", "")), workspace=str(d.get("workspace") or ""),
                   cells=int(d.get("cells") or 0), created_at=_time(d.get("created_at")),
                   last_used_at=_time(d.get("last_used_at")), lost=str(d.get("lost") or ""),
                   forked_from=str(d.get("forked_from") or ""), memory_bytes=int(d.get("memory_bytes") or 0),
                   checkpoint_bytes=int(d.get("checkpoint_bytes") or 0), restored_at=_time(d.get("restored_at")),
                   enforcement=dict(d.get("enforcement") or {}), raw=d)


@dataclasses.dataclass(frozen=True)
class CellAnswer:
    """A cell's answer: ``state`` says what became of the session's interpreter state
    (``preserved``, ``restored``, ``rolled_back``, ``lost``); ``value`` is the last
    expression's repr (as the interactive interpreter shows it), ``result`` the
    output and how the cell ended, ``session`` the session after it."""

    state: str
    value: str
    value_truncated: bool
    result: Result
    session: SessionInfo
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CellAnswer":
        return cls(state=str(d.get("state", "")), value=str(d.get("value") or ""),
                   value_truncated=bool(d.get("value_truncated")), result=Result.from_json(d.get("result") or {}),
                   session=SessionInfo.from_json(d.get("session") or {}), raw=d)


@dataclasses.dataclass(frozen=True)
class File:
    """A name in a workspace: ``type`` is ``file``, ``dir``, ``symlink``,
    ``fifo``, ``socket``, ``device`` or ``other``; ``size`` in bytes."""

    path: str
    type: str
    size: int


@dataclasses.dataclass(frozen=True)
class Workspace:
    """A workspace: its quota and usage (dicts of bytes and files), whether guest code
    wrote past the quota, and one page of its names (``next``: more follow)."""

    id: str
    owner_uid: int
    created_at: Optional[_dt.datetime]
    quota: dict[str, Any]
    usage: dict[str, Any]
    over_quota: bool
    files: list[File]
    next: str
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Workspace":
        return cls(id=str(d.get("id", "")), owner_uid=int(d.get("owner_uid") or 0), created_at=_time(d.get("created_at")),
                   quota=dict(d.get("quota") or {}), usage=dict(d.get("usage") or {}),
                   over_quota=bool(d.get("over_quota")),
                   files=[File(str(f.get("path", "")), str(f.get("type", "")), int(f.get("size") or 0))
                          for f in d.get("files") or []], next=str(d.get("next") or ""), raw=d)


def _sql_value(v: Any) -> Any:
    """A result's value as Python's sqlite3 gives it: a blob ({"base64": ...}) as bytes,
    an integer beyond 2**53 (sent as its digits, a string) left as the string."""
    if isinstance(v, dict) and list(v) == ["base64"]:
        return base64.b64decode(v["base64"])
    return v


@dataclasses.dataclass(frozen=True)
class SQLResult:
    """One SQL statement's answer: ``columns`` (their names; ``raw["columns"]`` has
    their declared types too) and ``rows`` (a read; blobs as bytes), ``changes`` (a
    write), how the engine classified it, and the approval it used."""

    status: str
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool
    changes: int
    elapsed_ms: float
    classification: dict[str, Any]
    approval: str
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "SQLResult":
        return cls(status=str(d.get("status", "")), columns=[str(c.get("name", "")) if isinstance(c, dict) else str(c)
                                                          for c in d.get("columns") or []],
                   rows=[[_sql_value(v) for v in r] for r in d.get("rows") or []], truncated=bool(d.get("truncated")),
                   changes=int(d.get("changes") or 0), elapsed_ms=float(d.get("elapsed_ms") or 0),
                   classification=dict(d.get("classification") or {}),
                   approval=str(d.get("approval") or ""), raw=d)


@dataclasses.dataclass(frozen=True)
class Approval:
    """A request waiting for (or given) a person's decision: ``action`` (``run``,
    ``sql.write``, ``tool.call``, ...), ``state`` (``pending``, ``approved``,
    ``denied``, ``spent``, ``expired``), who asked, what (``subject``), and, on an
    approved tool call, ``grant``: the calls of the run it covers."""

    id: str
    action: str
    state: str
    requester: dict[str, Any]
    subject: Any
    digest: str
    created_at: Optional[_dt.datetime]
    expires_at: Optional[_dt.datetime]
    decided_by: dict[str, Any]
    decided_at: Optional[_dt.datetime]
    grant: int
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Approval":
        return cls(id=str(d.get("id", "")), action=str(d.get("action", "")), state=str(d.get("state", "")),
                   requester=dict(d.get("requester") or {}), subject=d.get("subject"), digest=str(d.get("digest") or ""),
                   created_at=_time(d.get("created_at")), expires_at=_time(d.get("expires_at")),
                   decided_by=dict(d.get("decided_by") or {}), decided_at=_time(d.get("decided_at")), grant=int(d.get("grant") or 0), raw=d)
