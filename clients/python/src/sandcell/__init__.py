"""Sandcell's Python client: runs, interpreter sessions, workspaces and files, SQL,
approvals and tools of a Sandcell daemon, over its Unix socket or over TCP with a
bearer token, blocking (``Client``) or with asyncio (``AsyncClient``).

    from sandcell import Client
    with Client() as sc:                     # $SANDCELL_SOCKET or /run/sandcell/sandcell.sock
        print(sc.run("print(6 * 7)").result.stdout)
        with sc.open_session(backend="native") as s:
            s.run("import pandas as pd; df = pd.DataFrame({'x': [1, 2]})")
            print(s.run("int(df.x.sum())").value)  # 3
"""

from ._client import DEFAULT_SOCKET, AsyncClient, AsyncSession, Client, Session, StreamEvent
from ._errors import (ApprovalRequired, BadRequest, Conflict, Forbidden, InternalError, NotFound, ProblemError,
                      QuotaExceeded, RateLimited, SandcellError, SessionLost, SQLError, Timeout, TransportError,
                      Unauthorized, Unavailable)
from ._models import Approval, CellAnswer, Display, File, Output, Result, Run, SessionInfo, SQLResult, Waiting, Workspace
from ._ops import Limits

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SOCKET", "AsyncClient", "AsyncSession", "Client", "Session", "StreamEvent", "Limits",
    "Approval", "CellAnswer", "Display", "File", "Output", "Result", "Run", "SessionInfo", "SQLResult", "Waiting",
    "Workspace", "SandcellError", "TransportError", "Timeout", "ProblemError", "BadRequest", "Unauthorized",
    "Forbidden", "ApprovalRequired", "NotFound", "Conflict", "SessionLost", "QuotaExceeded", "RateLimited",
    "Unavailable", "SQLError", "InternalError",
]
