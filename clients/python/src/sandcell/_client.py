"""Client (blocking) and AsyncClient (asyncio) of the Sandcell daemon's API, over its
Unix socket (the caller is its uid) or over TCP with a bearer token."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import time
from typing import Any, AsyncIterator, Iterator, Mapping, Optional, Sequence, Union

import httpx

from . import _ops as ops
from ._errors import ProblemError, Timeout, TransportError, problem_error
from ._models import Approval, CellAnswer, Display, File, Output, Run, SessionInfo, SQLResult, Workspace
from ._ops import LimitsLike

#: Where the packaged daemon listens (``socket.path`` of its configuration).
DEFAULT_SOCKET = "/run/sandcell/sandcell.sock"

# An event stream's read timeout: the daemon sends a comment every 15 s on an idle
# stream, so a minute of silence means it has gone away.
STREAM_READ_TIMEOUT = 60.0

StreamEvent = Union[Output, Display, Run]


def _config(socket: Optional[str], url: Optional[str], token: Optional[str]) -> tuple[str, dict[str, Any], Optional[str]]:
    """The base URL, the transport's arguments and the Authorization header of a
    client: url (and token) where given or in SANDCELL_URL (SANDCELL_TOKEN), else the
    socket, SANDCELL_SOCKET or DEFAULT_SOCKET."""
    url = url or (os.environ.get("SANDCELL_URL") if socket is None else None)
    if url:
        token = token if token is not None else os.environ.get("SANDCELL_TOKEN")
        return url.rstrip("/"), {}, f"Bearer {token}" if token else None
    return "http://sandcell", {"uds": socket or os.environ.get("SANDCELL_SOCKET") or DEFAULT_SOCKET}, None


class _SSE:
    """An event stream's parser (the server-sent events format, as the daemon writes
    it: ``event``, ``id`` and one ``data`` line per event; comments kept alive)."""

    def __init__(self) -> None:
        self.event, self.id, self.data = "", None, []

    def line(self, line: str) -> Union[StreamEvent, CellAnswer, None]:
        # httpx before 0.24 keeps each line's ending; later versions drop it.
        line = line.rstrip("\r\n")
        if line == "":
            ev, data, eid = self.event, "\n".join(self.data), self.id
            self.event, self.data, self.id = "", [], None
            return _event(ev, data, eid) if ev else None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        elif name == "id" and value.isdigit():
            self.id = int(value)
        return None


def _event(name: str, data: str, eid: Optional[int]) -> Union[StreamEvent, CellAnswer, None]:
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise TransportError(f"the daemon sent an event that is not JSON: {data[:200]!r}") from e
    if name in ("stdout", "stderr"):
        raw = doc.get("data") or ""
        b = base64.b64decode(raw) if doc.get("encoding") == "base64" else raw.encode("utf-8")
        return Output(name, b, eid)
    if name == "display":
        return Display.from_json(doc)
    if name == "result":
        return Run.from_json(doc)
    if name == "answer":
        with _answer_shape():
            return CellAnswer.from_json(doc)
    if name == "error":
        # A cell's failure after its output began: the problem its stream ends with.
        raise problem_error(int(doc.get("status") or 500), doc, None)
    return None  # an event a later daemon sends that this version does not know


class _Base:
    def __init__(self, socket: Optional[str], url: Optional[str], token: Optional[str], timeout: float,
                 run_timeout: float, max_retries: int, max_retry_wait: float) -> None:
        self.base_url, self._transport_args, auth = _config(socket, url, token)
        self._headers = {"Authorization": auth} if auth else {}
        self.timeout = timeout
        self.run_timeout = run_timeout
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait

    def _timeout(self, req: ops.Request) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, read=req.timeout or self.timeout)

    def _build(self, http: Union[httpx.Client, httpx.AsyncClient], req: ops.Request) -> httpx.Request:
        return http.build_request(req.method, req.path, json=req.json, content=req.content, params=req.params,
                                  timeout=self._timeout(req))

    def _check(self, resp: httpx.Response, req: ops.Request, attempt: int) -> Optional[float]:
        """None for a success; the seconds to wait before sending req again; or it
        raises the answer's error."""
        if resp.status_code < 400:
            return None
        wait = ops.retry_after(resp)
        err = problem_error(resp.status_code, ops.problem_document(resp), wait)
        if (req.retry and wait is not None and resp.status_code in (429, 503) and attempt < self.max_retries
                and wait <= self.max_retry_wait):
            return wait
        raise err


def _transport_error(e: httpx.HTTPError) -> TransportError:
    """The error for a failed exchange (raise it ``from None``: httpx's exception
    holds the request, its Authorization header included)."""
    if isinstance(e, httpx.TimeoutException):
        return Timeout(f"the daemon did not answer in time: {type(e).__name__}: {e}")
    return TransportError(f"the exchange with the daemon failed: {type(e).__name__}: {e} (it may be unreachable, "
                          "or have closed the connection while the request was sent: a body it refused early)")


@contextlib.contextmanager
def _answer_shape() -> Iterator[None]:
    """Turns an answer that is not the document the API promises (not JSON, another
    shape) into a TransportError: a proxy's page, another server."""
    try:
        yield
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise TransportError(f"the daemon's answer is not the API's document: {type(e).__name__}: {e}") from None


class Client(_Base):
    """A blocking client. ``Client()`` talks to the daemon on its Unix socket
    (``socket``, else $SANDCELL_SOCKET, else /run/sandcell/sandcell.sock);
    ``Client(url="https://host:8443", token=SECRET)`` (or $SANDCELL_URL and
    $SANDCELL_TOKEN) over TCP. ``timeout`` bounds each wait for the daemon (seconds:
    connecting, and each silence while writing or reading; not an answer that keeps
    coming); ``run_timeout`` the wait for a run's, a cell's or a statement's answer. A 429 or 503 that carries Retry-After is sent again after that many
    seconds, at most ``max_retries`` times and only if the wait is at most
    ``max_retry_wait``; nothing else is retried. Errors: ``ProblemError`` subclasses
    (by the answer's code), ``TransportError``/``Timeout``. Use it as a context
    manager, or call ``close()``."""

    def __init__(self, socket: Optional[str] = None, *, url: Optional[str] = None, token: Optional[str] = None,
                 timeout: float = 30.0, run_timeout: float = 900.0, max_retries: int = 2,
                 max_retry_wait: float = 30.0) -> None:
        super().__init__(socket, url, token, timeout, run_timeout, max_retries, max_retry_wait)
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers,
                                  transport=httpx.HTTPTransport(**self._transport_args), timeout=timeout)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, req: ops.Request) -> httpx.Response:
        attempt = 0
        while True:
            try:
                resp = self._http.send(self._build(self._http, req))
            except httpx.HTTPError as e:
                raise _transport_error(e) from None
            wait = self._check(resp, req, attempt)
            if wait is None:
                return resp
            attempt += 1
            time.sleep(wait)

    def _call(self, op: ops.Op) -> Any:
        try:
            req = next(op)
            while True:
                resp = self._send(req)
                with _answer_shape():
                    req = op.send(resp)
        except StopIteration as done:
            return done.value

    # Runs.

    def run(self, code: Optional[str] = None, *, path: Optional[str] = None, args: Sequence[str] = (),
            stdin: Union[str, bytes, None] = None, env: Optional[Mapping[str, str]] = None,
            workspace: Optional[str] = None, backend: Optional[str] = None, limits: LimitsLike = None,
            approval: Optional[str] = None) -> Run:
        """Run ``code`` (or the workspace's file ``path``) and wait for its end: a Run
        whose ``result`` is set. ``backend``: ``"wasm"`` (the default) or
        ``"native"``; ``workspace``: a workspace's id, mounted as /ws (else a fresh
        one, removed after); ``approval``: an approved approval's id for exactly this
        request. Raises ApprovalRequired where policy holds the code for a person."""
        return self._call(ops.run(code, path=path, args=args, stdin=stdin, env=env, workspace=workspace,
                                  backend=backend, limits=limits, approval=approval, wait=True,
                                  run_timeout=self.run_timeout))

    def start(self, code: Optional[str] = None, *, path: Optional[str] = None, args: Sequence[str] = (),
              stdin: Union[str, bytes, None] = None, env: Optional[Mapping[str, str]] = None,
              workspace: Optional[str] = None, backend: Optional[str] = None, limits: LimitsLike = None,
              approval: Optional[str] = None) -> Run:
        """As run, but answer at once: the Run queued or running (follow it with
        ``stream``, ``get_run`` or ``cancel``)."""
        return self._call(ops.run(code, path=path, args=args, stdin=stdin, env=env, workspace=workspace,
                                  backend=backend, limits=limits, approval=approval, wait=False,
                                  run_timeout=self.run_timeout))

    def get_run(self, run_id: str) -> Run:
        """The run (this caller's; another's is NotFound)."""
        return self._call(ops.get_run(run_id))

    def cancel(self, run_id: str) -> Run:
        """Cancel the run: its worker is killed and it ends ``cancelled``."""
        return self._call(ops.cancel_run(run_id))

    def stream(self, run_id: str, *, after: Optional[int] = None) -> Iterator[StreamEvent]:
        """The run's events as they come: Output pieces (stdout, stderr) from its
        start (or after event id ``after``), then a Display per display, then the
        finished Run, which ends the iteration."""
        headers = {"Last-Event-ID": str(after)} if after is not None else {}
        timeout = httpx.Timeout(self.timeout, read=STREAM_READ_TIMEOUT)
        try:
            with self._http.stream("GET", f"/v1/runs/{ops.seg(run_id)}/events", headers=headers,
                                   timeout=timeout) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    self._check(resp, ops.Request("GET", "", retry=False), 0)
                sse = _SSE()
                for line in resp.iter_lines():
                    ev = sse.line(line)
                    if ev is not None:
                        yield ev
                        if isinstance(ev, Run):
                            return
        except httpx.HTTPError as e:
            raise _transport_error(e) from None
        raise TransportError(f"the event stream of run {run_id} ended before its result")

    def run_stream(self, code: Optional[str] = None, **kw: Any) -> Iterator[StreamEvent]:
        """Start a run (``start``'s arguments) and stream its events (``stream``)."""
        return self.stream(self.start(code, **kw).id)

    # The daemon.

    def info(self) -> dict[str, Any]:
        """Versions, the interpreter, limits and maxima, backends, the enforcement contract."""
        return self._call(ops.info())

    def tools(self) -> dict[str, Any]:
        """The agent tools' JSON Schemas and the guest tools a program may call."""
        return self._call(ops.tools())

    # Workspaces and files.

    def create_workspace(self) -> Workspace:
        """A new empty workspace owned by the caller."""
        return self._call(ops.create_workspace())

    def workspace(self, workspace: str, *, after: Optional[str] = None, limit: Optional[int] = None) -> Workspace:
        """The workspace: quota, usage and one page of its names."""
        return self._call(ops.get_workspace(workspace, after=after, limit=limit))

    def list_files(self, workspace: str) -> list[File]:
        """Every name in the workspace (page after page), depth first."""
        return self._call(ops.list_files(workspace))

    def delete_workspace(self, workspace: str) -> None:
        """Delete the workspace and everything in it (Conflict while in use)."""
        self._call(ops.delete_workspace(workspace))

    def write_file(self, workspace: str, path: str, data: Union[bytes, str]) -> None:
        """Write a file (str as UTF-8), creating missing directories."""
        self._call(ops.write_file(workspace, path, data))

    def read_file(self, workspace: str, path: str) -> bytes:
        """A regular file's bytes (Conflict unsafe_file for a link, FIFO, directory)."""
        return self._call(ops.read_file(workspace, path))

    def delete_file(self, workspace: str, path: str) -> None:
        """Remove a file, link or directory with its contents."""
        self._call(ops.delete_file(workspace, path))

    # SQL.

    def sql(self, workspace: str, db: str, statement: str, *, params: Any = None, max_rows: Optional[int] = None,
            approval: Optional[str] = None) -> SQLResult:
        """One SQL statement on the workspace's SQLite file ``db``; ``params``
        positional (a sequence) or named (a mapping), bytes bound as blobs. A write
        raises ApprovalRequired; once approved, send it again with ``approval``."""
        return self._call(ops.sql(workspace, db, statement, params=params, max_rows=max_rows, approval=approval,
                                  run_timeout=self.run_timeout))

    # Approvals.

    def approvals(self, state: Optional[str] = None) -> list[Approval]:
        """Approvals (approvers), oldest first; ``state`` filters (``pending``, ...)."""
        return self._call(ops.list_approvals(state))

    def approval(self, approval_id: str) -> Approval:
        """One approval (its requester, approvers, admins)."""
        return self._call(ops.get_approval(approval_id))

    def decide(self, approval_id: str, approve: bool, *, grant: int = 0) -> Approval:
        """Decide a pending approval (approvers; never the requester's own). On a
        guest's tool call, ``grant`` N approves the remaining calls of the run to the
        tool, at most N, at once."""
        return self._call(ops.decide(approval_id, approve=approve, grant=grant, confirm=False))

    def confirm(self, approval_id: str, approve: bool, *, grant: int = 0) -> Approval:
        """The requester's own decision, as the person at its MCP client gave it,
        where the operator allows it (the approval's ``confirmable``)."""
        return self._call(ops.decide(approval_id, approve=approve, grant=grant, confirm=True))

    # Sessions.

    def open_session(self, *, workspace: Optional[str] = None, backend: Optional[str] = None,
                     limits: LimitsLike = None, env: Optional[Mapping[str, str]] = None) -> "Session":
        """Open an interpreter session (its state kept from one cell to the next);
        use it as a context manager to close it at the end."""
        return Session(self, self._call(ops.open_session(workspace=workspace, backend=backend, limits=limits,
                                                         env=env, run_timeout=self.run_timeout)))

    def sessions(self) -> list[SessionInfo]:
        """The caller's sessions."""
        return self._call(ops.list_sessions())

    def session(self, session_id: str) -> "Session":
        """A session of the caller's, by id."""
        return Session(self, self._call(ops.get_session(session_id)))

    def run_cell(self, session_id: str, code: str, *, stdin: Union[str, bytes, None] = None,
                 limits: LimitsLike = None, approval: Optional[str] = None) -> CellAnswer:
        """Run a cell in the session (resumed first if paused)."""
        return self._call(ops.run_cell(session_id, code, stdin=stdin, limits=limits, approval=approval,
                                       run_timeout=self.run_timeout))

    def run_cell_stream(self, session_id: str, code: str, *, stdin: Union[str, bytes, None] = None,
                        limits: LimitsLike = None, approval: Optional[str] = None) -> Iterator[Union[Output, CellAnswer]]:
        """Run a cell, yielding its Output pieces as the worker produces them, then its
        CellAnswer (the last item; its result holds the whole output too). A failure
        after the output began is raised as the problem the stream ends with. The
        stream may be silent while the cell computes, up to ``run_timeout``."""
        body = ops.cell_body(code, stdin=stdin, limits=limits, approval=approval)
        timeout = httpx.Timeout(self.timeout, read=self.run_timeout)
        try:
            with self._http.stream("POST", f"/v1/sessions/{ops.seg(session_id)}/cells", json=body,
                                   headers={"Accept": "text/event-stream"}, timeout=timeout) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    self._check(resp, ops.Request("POST", "", retry=False), 0)
                if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                    resp.read()  # answered whole: no output came before the answer
                    with _answer_shape():
                        yield CellAnswer.from_json(resp.json())
                    return
                sse = _SSE()
                for line in resp.iter_lines():
                    ev = sse.line(line)
                    if isinstance(ev, (Output, CellAnswer)):
                        yield ev
                        if isinstance(ev, CellAnswer):
                            return
        except httpx.HTTPError as e:
            raise _transport_error(e) from None
        raise TransportError(f"the event stream of a cell of session {session_id} ended before its answer")

    def fork_session(self, session_id: str) -> "Session":
        """A new session from the session's state (wasm backend)."""
        return Session(self, self._call(ops.fork_session(session_id, run_timeout=self.run_timeout)))

    def close_session(self, session_id: str) -> None:
        """Close the session: its worker ends, its state with it."""
        self._call(ops.close_session(session_id))


class _SessionBase:
    """What Session and AsyncSession share: the client, and the session as last seen."""

    def __init__(self, client: Any, info: SessionInfo) -> None:
        self.client, self.info = client, info

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def workspace(self) -> str:
        """The workspace's id; empty for a session's private workspace, which no call reaches."""
        return self.info.workspace


class Session(_SessionBase):
    """An interpreter session of a Client: ``info`` as last seen, ``run`` a cell,
    ``fork``, ``close`` (also at the end of a ``with`` block)."""

    client: Client

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(self, code: str, *, stdin: Union[str, bytes, None] = None, limits: LimitsLike = None,
            approval: Optional[str] = None) -> CellAnswer:
        """Run a cell; the answer's ``value`` is its last expression's repr."""
        answer = self.client.run_cell(self.id, code, stdin=stdin, limits=limits, approval=approval)
        self.info = answer.session
        return answer

    def run_stream(self, code: str, **kw: Any) -> Iterator[Union[Output, CellAnswer]]:
        """Run a cell, yielding its output as it comes, then its answer (see
        Client.run_cell_stream)."""
        for ev in self.client.run_cell_stream(self.id, code, **kw):
            if isinstance(ev, CellAnswer):
                self.info = ev.session
            yield ev

    def fork(self) -> "Session":
        return self.client.fork_session(self.id)

    def refresh(self) -> SessionInfo:
        self.info = self.client.session(self.id).info
        return self.info

    def close(self) -> None:
        """Close it; a session already gone (closed, lost, expired) is not an error."""
        try:
            self.client.close_session(self.id)
        except ProblemError as e:
            if e.status not in (404, 410):
                raise


class AsyncClient(_Base):
    """The asyncio client: Client's methods, as coroutines (``stream`` and
    ``run_stream`` as async iterators), with the same arguments, timeouts, retries
    and errors. Use it as an async context manager, or ``await aclose()``."""

    def __init__(self, socket: Optional[str] = None, *, url: Optional[str] = None, token: Optional[str] = None,
                 timeout: float = 30.0, run_timeout: float = 900.0, max_retries: int = 2,
                 max_retry_wait: float = 30.0) -> None:
        super().__init__(socket, url, token, timeout, run_timeout, max_retries, max_retry_wait)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self._headers,
                                       transport=httpx.AsyncHTTPTransport(**self._transport_args), timeout=timeout)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, req: ops.Request) -> httpx.Response:
        attempt = 0
        while True:
            try:
                resp = await self._http.send(self._build(self._http, req))
            except httpx.HTTPError as e:
                raise _transport_error(e) from None
            wait = self._check(resp, req, attempt)
            if wait is None:
                return resp
            attempt += 1
            await asyncio.sleep(wait)

    async def _call(self, op: ops.Op) -> Any:
        try:
            req = next(op)
            while True:
                resp = await self._send(req)
                with _answer_shape():
                    req = op.send(resp)
        except StopIteration as done:
            return done.value

    async def run(self, code: Optional[str] = None, *, path: Optional[str] = None, args: Sequence[str] = (),
                  stdin: Union[str, bytes, None] = None, env: Optional[Mapping[str, str]] = None,
                  workspace: Optional[str] = None, backend: Optional[str] = None, limits: LimitsLike = None,
                  approval: Optional[str] = None) -> Run:
        """See Client.run."""
        return await self._call(ops.run(code, path=path, args=args, stdin=stdin, env=env, workspace=workspace,
                                        backend=backend, limits=limits, approval=approval, wait=True,
                                        run_timeout=self.run_timeout))

    async def start(self, code: Optional[str] = None, *, path: Optional[str] = None, args: Sequence[str] = (),
                    stdin: Union[str, bytes, None] = None, env: Optional[Mapping[str, str]] = None,
                    workspace: Optional[str] = None, backend: Optional[str] = None, limits: LimitsLike = None,
                    approval: Optional[str] = None) -> Run:
        """See Client.start."""
        return await self._call(ops.run(code, path=path, args=args, stdin=stdin, env=env, workspace=workspace,
                                        backend=backend, limits=limits, approval=approval, wait=False,
                                        run_timeout=self.run_timeout))

    async def get_run(self, run_id: str) -> Run:
        return await self._call(ops.get_run(run_id))

    async def cancel(self, run_id: str) -> Run:
        return await self._call(ops.cancel_run(run_id))

    async def stream(self, run_id: str, *, after: Optional[int] = None) -> AsyncIterator[StreamEvent]:
        """See Client.stream."""
        headers = {"Last-Event-ID": str(after)} if after is not None else {}
        timeout = httpx.Timeout(self.timeout, read=STREAM_READ_TIMEOUT)
        try:
            async with self._http.stream("GET", f"/v1/runs/{ops.seg(run_id)}/events", headers=headers,
                                         timeout=timeout) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    self._check(resp, ops.Request("GET", "", retry=False), 0)
                sse = _SSE()
                async for line in resp.aiter_lines():
                    ev = sse.line(line)
                    if ev is not None:
                        yield ev
                        if isinstance(ev, Run):
                            return
        except httpx.HTTPError as e:
            raise _transport_error(e) from None
        raise TransportError(f"the event stream of run {run_id} ended before its result")

    async def run_stream(self, code: Optional[str] = None, **kw: Any) -> AsyncIterator[StreamEvent]:
        """See Client.run_stream."""
        run = await self.start(code, **kw)
        async for ev in self.stream(run.id):
            yield ev

    async def info(self) -> dict[str, Any]:
        return await self._call(ops.info())

    async def tools(self) -> dict[str, Any]:
        return await self._call(ops.tools())

    async def create_workspace(self) -> Workspace:
        return await self._call(ops.create_workspace())

    async def workspace(self, workspace: str, *, after: Optional[str] = None,
                        limit: Optional[int] = None) -> Workspace:
        return await self._call(ops.get_workspace(workspace, after=after, limit=limit))

    async def list_files(self, workspace: str) -> list[File]:
        return await self._call(ops.list_files(workspace))

    async def delete_workspace(self, workspace: str) -> None:
        await self._call(ops.delete_workspace(workspace))

    async def write_file(self, workspace: str, path: str, data: Union[bytes, str]) -> None:
        await self._call(ops.write_file(workspace, path, data))

    async def read_file(self, workspace: str, path: str) -> bytes:
        return await self._call(ops.read_file(workspace, path))

    async def delete_file(self, workspace: str, path: str) -> None:
        await self._call(ops.delete_file(workspace, path))

    async def sql(self, workspace: str, db: str, statement: str, *, params: Any = None,
                  max_rows: Optional[int] = None, approval: Optional[str] = None) -> SQLResult:
        return await self._call(ops.sql(workspace, db, statement, params=params, max_rows=max_rows,
                                        approval=approval, run_timeout=self.run_timeout))

    async def approvals(self, state: Optional[str] = None) -> list[Approval]:
        return await self._call(ops.list_approvals(state))

    async def approval(self, approval_id: str) -> Approval:
        return await self._call(ops.get_approval(approval_id))

    async def decide(self, approval_id: str, approve: bool, *, grant: int = 0) -> Approval:
        return await self._call(ops.decide(approval_id, approve=approve, grant=grant, confirm=False))

    async def confirm(self, approval_id: str, approve: bool, *, grant: int = 0) -> Approval:
        return await self._call(ops.decide(approval_id, approve=approve, grant=grant, confirm=True))

    async def open_session(self, *, workspace: Optional[str] = None, backend: Optional[str] = None,
                           limits: LimitsLike = None, env: Optional[Mapping[str, str]] = None) -> "AsyncSession":
        return AsyncSession(self, await self._call(ops.open_session(
            workspace=workspace, backend=backend, limits=limits, env=env, run_timeout=self.run_timeout)))

    async def sessions(self) -> list[SessionInfo]:
        return await self._call(ops.list_sessions())

    async def session(self, session_id: str) -> "AsyncSession":
        return AsyncSession(self, await self._call(ops.get_session(session_id)))

    async def run_cell(self, session_id: str, code: str, *, stdin: Union[str, bytes, None] = None,
                       limits: LimitsLike = None, approval: Optional[str] = None) -> CellAnswer:
        return await self._call(ops.run_cell(session_id, code, stdin=stdin, limits=limits, approval=approval,
                                             run_timeout=self.run_timeout))

    async def run_cell_stream(self, session_id: str, code: str, *, stdin: Union[str, bytes, None] = None,
                              limits: LimitsLike = None,
                              approval: Optional[str] = None) -> AsyncIterator[Union[Output, CellAnswer]]:
        """See Client.run_cell_stream."""
        body = ops.cell_body(code, stdin=stdin, limits=limits, approval=approval)
        timeout = httpx.Timeout(self.timeout, read=self.run_timeout)
        try:
            async with self._http.stream("POST", f"/v1/sessions/{ops.seg(session_id)}/cells", json=body,
                                         headers={"Accept": "text/event-stream"}, timeout=timeout) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    self._check(resp, ops.Request("POST", "", retry=False), 0)
                if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                    await resp.aread()
                    with _answer_shape():
                        yield CellAnswer.from_json(resp.json())
                    return
                sse = _SSE()
                async for line in resp.aiter_lines():
                    ev = sse.line(line)
                    if isinstance(ev, (Output, CellAnswer)):
                        yield ev
                        if isinstance(ev, CellAnswer):
                            return
        except httpx.HTTPError as e:
            raise _transport_error(e) from None
        raise TransportError(f"the event stream of a cell of session {session_id} ended before its answer")

    async def fork_session(self, session_id: str) -> "AsyncSession":
        return AsyncSession(self, await self._call(ops.fork_session(session_id, run_timeout=self.run_timeout)))

    async def close_session(self, session_id: str) -> None:
        await self._call(ops.close_session(session_id))


class AsyncSession(_SessionBase):
    """Session, for AsyncClient: ``await s.run(code)``; ``async with``."""

    client: AsyncClient

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def run(self, code: str, *, stdin: Union[str, bytes, None] = None, limits: LimitsLike = None,
                  approval: Optional[str] = None) -> CellAnswer:
        answer = await self.client.run_cell(self.id, code, stdin=stdin, limits=limits, approval=approval)
        self.info = answer.session
        return answer

    async def run_stream(self, code: str, **kw: Any) -> AsyncIterator[Union[Output, CellAnswer]]:
        """See Session.run_stream."""
        async for ev in self.client.run_cell_stream(self.id, code, **kw):
            if isinstance(ev, CellAnswer):
                self.info = ev.session
            yield ev

    async def fork(self) -> "AsyncSession":
        return await self.client.fork_session(self.id)

    async def refresh(self) -> SessionInfo:
        self.info = (await self.client.session(self.id)).info
        return self.info

    async def close(self) -> None:
        try:
            await self.client.close_session(self.id)
        except ProblemError as e:
            if e.status not in (404, 410):
                raise
