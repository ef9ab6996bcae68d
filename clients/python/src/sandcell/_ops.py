"""The API's operations, written once for both clients: each is a generator that
yields the requests it needs (a ``Request``) and is sent each answer (an
``httpx.Response``, already read and known to be a success), and returns the typed
value. ``Client`` drives them with blocking I/O, ``AsyncClient`` with asyncio."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from typing import Any, Generator, Mapping, Optional, Sequence, Union
from urllib.parse import quote

import httpx

from ._models import Approval, CellAnswer, Run, SessionInfo, SQLResult, Workspace

#: An operation: yields requests, is sent their responses, returns its value.
Op = Generator["Request", httpx.Response, Any]


@dataclasses.dataclass(frozen=True)
class Request:
    """One HTTP request of an operation. ``timeout`` (seconds) replaces the client's
    read timeout for this request (a run's answer comes when the run ends, which a
    tool call waiting for a person may put off: the client's ``run_timeout``);
    ``retry`` says a 429 or 503 with Retry-After may be sent again (the daemon did
    not act on it)."""

    method: str
    path: str
    json: Any = None
    content: Optional[bytes] = None
    params: Optional[Mapping[str, str]] = None
    timeout: Optional[float] = None
    retry: bool = True


@dataclasses.dataclass(frozen=True)
class Limits:
    """A run's or a session's limits, each setting the daemon's default for it (and
    never above its maximum: 400 limit_exceeded). ``timeout_ms``: wall clock;
    ``cpu_ms``: CPU time; ``memory_mib``: memory; ``max_output_bytes``: stdout and
    stderr, each; ``fuel``: WebAssembly instructions (wasm backend). A cell may lower
    its session's ``timeout_ms``, ``cpu_ms`` and ``max_output_bytes`` only: memory and
    fuel are the session's, set when it opens."""

    timeout_ms: Optional[int] = None
    cpu_ms: Optional[int] = None
    memory_mib: Optional[int] = None
    max_output_bytes: Optional[int] = None
    fuel: Optional[int] = None


LimitsLike = Union[Limits, Mapping[str, int], None]


def limits_dict(limits: LimitsLike) -> dict[str, int]:
    """Limits as the API takes them (a mapping is passed as it is, so a limit this
    version does not know still reaches the daemon, which refuses what it does not)."""
    if limits is None:
        return {}
    if isinstance(limits, Limits):
        return {k: v for k, v in dataclasses.asdict(limits).items() if v is not None}
    return dict(limits)


def stdin_fields(stdin: Union[str, bytes, bytearray, memoryview, None]) -> dict[str, str]:
    """stdin as the API takes it: text, or base64 for bytes."""
    if stdin is None:
        return {}
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        return {"stdin": base64.b64encode(bytes(stdin)).decode("ascii"), "stdin_encoding": "base64"}
    return {"stdin": stdin}


def file_path(workspace: str, path: str) -> str:
    """The files route of a workspace path, each segment escaped (a name may hold
    anything but NUL and '/'). A path with an empty, "." or ".." segment is refused
    here (ValueError): HTTP clients resolve those before sending, which would reach
    another route (another workspace, a run, a session)."""
    segs = path.split("/")
    if any(p in ("", ".", "..") for p in segs):
        raise ValueError(f"workspace path {path!r}: relative, without empty, '.' or '..' segments")
    return f"/v1/workspaces/{quote(workspace, safe='')}/files/" + "/".join(quote(p, safe="") for p in segs)


def seg(s: str) -> str:
    return quote(s, safe="")


def run(code: Optional[str], *, path: Optional[str], args: Sequence[str], stdin: Union[str, bytes, None],
        env: Optional[Mapping[str, str]], workspace: Optional[str], backend: Optional[str], limits: LimitsLike,
        approval: Optional[str], wait: bool, run_timeout: float) -> Op:
    limits = limits_dict(limits)
    body: dict[str, Any] = {"wait": wait}
    for k, v in (("code", code), ("path", path), ("workspace", workspace), ("backend", backend),
                 ("approval", approval)):
        if v is not None:
            body[k] = v
    if args:
        body["args"] = list(args)
    if env:
        body["env"] = dict(env)
    if limits:
        body["limits"] = limits
    body.update(stdin_fields(stdin))
    resp = yield Request("POST", "/v1/runs", json=body, timeout=run_timeout if wait else None)
    return Run.from_json(resp.json())


def get_run(run_id: str) -> Op:
    resp = yield Request("GET", f"/v1/runs/{seg(run_id)}")
    return Run.from_json(resp.json())


def cancel_run(run_id: str) -> Op:
    resp = yield Request("DELETE", f"/v1/runs/{seg(run_id)}")
    return Run.from_json(resp.json())


def info() -> Op:
    resp = yield Request("GET", "/v1/info")
    return resp.json()


def tools() -> Op:
    resp = yield Request("GET", "/v1/tools")
    return resp.json()


def create_workspace() -> Op:
    resp = yield Request("POST", "/v1/workspaces", retry=False)
    return Workspace.from_json(resp.json())


def get_workspace(workspace: str, *, after: Optional[str], limit: Optional[int]) -> Op:
    params = {k: str(v) for k, v in (("after", after), ("limit", limit)) if v}
    resp = yield Request("GET", f"/v1/workspaces/{seg(workspace)}", params=params or None)
    return Workspace.from_json(resp.json())


def list_files(workspace: str) -> Op:
    """Every name in the workspace, page after page."""
    files, after = [], None
    while True:
        page = yield from get_workspace(workspace, after=after, limit=None)
        files.extend(page.files)
        if not page.next:
            return files
        after = page.next


def delete_workspace(workspace: str) -> Op:
    yield Request("DELETE", f"/v1/workspaces/{seg(workspace)}")


def write_file(workspace: str, path: str, data: Union[bytes, str]) -> Op:
    content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    yield Request("PUT", file_path(workspace, path), content=content)


def read_file(workspace: str, path: str) -> Op:
    resp = yield Request("GET", file_path(workspace, path))
    return resp.content


def delete_file(workspace: str, path: str) -> Op:
    yield Request("DELETE", file_path(workspace, path))


def sql(workspace: str, db: str, statement: str, *, params: Any, max_rows: Optional[int],
        approval: Optional[str], run_timeout: float) -> Op:
    body: dict[str, Any] = {"workspace": workspace, "db": db, "sql": statement}
    if params is not None:
        body["params"] = _sql_params(params)
    if max_rows is not None:
        body["max_rows"] = max_rows
    if approval is not None:
        body["approval"] = approval
    resp = yield Request("POST", "/v1/sql", json=body, timeout=run_timeout)
    return SQLResult.from_json(resp.json())


def _sql_params(params: Any) -> Any:
    """Parameters as the API binds them: bytes as {"base64": ...}."""
    def one(v: Any) -> Any:
        if isinstance(v, (bytes, bytearray, memoryview)):
            return {"base64": base64.b64encode(bytes(v)).decode("ascii")}
        return v
    if isinstance(params, Mapping):
        return {k: one(v) for k, v in params.items()}
    if isinstance(params, (str, bytes)):
        raise TypeError("params: a sequence (positional) or a mapping (named), not a string")
    return [one(v) for v in params]


def list_approvals(state: Optional[str]) -> Op:
    resp = yield Request("GET", "/v1/approvals", params={"state": state} if state else None)
    return [Approval.from_json(a) for a in resp.json().get("approvals") or []]


def get_approval(approval: str) -> Op:
    resp = yield Request("GET", f"/v1/approvals/{seg(approval)}")
    return Approval.from_json(resp.json())


def decide(approval: str, *, approve: bool, grant: int, confirm: bool) -> Op:
    body: dict[str, Any] = {"decision": "approve" if approve else "deny"}
    if grant:
        body["grant"] = grant
    path = f"/v1/approvals/{seg(approval)}" + ("/confirm" if confirm else "")
    resp = yield Request("POST", path, json=body, retry=False)
    return Approval.from_json(resp.json())


def open_session(*, workspace: Optional[str], backend: Optional[str], limits: LimitsLike,
                 env: Optional[Mapping[str, str]], run_timeout: float) -> Op:
    limits = limits_dict(limits)
    body: dict[str, Any] = {}
    if workspace is not None:
        body["workspace"] = workspace
    if backend is not None:
        body["backend"] = backend
    if limits:
        body["limits"] = limits
    if env:
        body["env"] = dict(env)
    resp = yield Request("POST", "/v1/sessions", json=body, timeout=run_timeout)
    return SessionInfo.from_json(resp.json())


def list_sessions() -> Op:
    resp = yield Request("GET", "/v1/sessions")
    return [SessionInfo.from_json(s) for s in resp.json().get("sessions") or []]


def get_session(session: str) -> Op:
    resp = yield Request("GET", f"/v1/sessions/{seg(session)}")
    return SessionInfo.from_json(resp.json())


def cell_body(code: str, *, stdin: Union[str, bytes, None], limits: LimitsLike,
              approval: Optional[str]) -> dict[str, Any]:
    """A cell's request body."""
    lim = limits_dict(limits)
    body: dict[str, Any] = {"code": code}
    body.update(stdin_fields(stdin))
    if lim:
        body["limits"] = lim
    if approval is not None:
        body["approval"] = approval
    return body


def run_cell(session: str, code: str, *, stdin: Union[str, bytes, None], limits: LimitsLike,
             approval: Optional[str], run_timeout: float) -> Op:
    body = cell_body(code, stdin=stdin, limits=limits, approval=approval)
    resp = yield Request("POST", f"/v1/sessions/{seg(session)}/cells", json=body,
                         timeout=run_timeout)
    return CellAnswer.from_json(resp.json())


def fork_session(session: str, *, run_timeout: float) -> Op:
    resp = yield Request("POST", f"/v1/sessions/{seg(session)}/fork", timeout=run_timeout, retry=False)
    return SessionInfo.from_json(resp.json())


def close_session(session: str) -> Op:
    yield Request("DELETE", f"/v1/sessions/{seg(session)}")


def problem_document(resp: httpx.Response) -> dict[str, Any]:
    """The problem+json body of an error answer, or one made from its status where
    the body is not one (a proxy's page, a plain-text error of the HTTP server)."""
    try:
        doc = json.loads(resp.content)
        if isinstance(doc, dict):
            return doc
    except ValueError:
        pass
    return {"status": resp.status_code, "title": resp.reason_phrase,
            "detail": resp.content[:500].decode("utf-8", "replace").strip()}


_DELTA_SECONDS = re.compile(r"[0-9]{1,6}")


def retry_after(resp: httpx.Response) -> Optional[float]:
    """Retry-After in seconds: delta-seconds only, as the daemon sends it (an
    HTTP-date, an empty or odd value: None, and the answer is not retried)."""
    v = (resp.headers.get("retry-after") or "").strip()
    return float(v) if _DELTA_SECONDS.fullmatch(v) else None
