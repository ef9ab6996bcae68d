"""The blocking client against a real daemon: every call's happy path, and each kind
of failure a caller meets, as the error class of its problem code."""

import socket
import threading
import time

import pytest

import sandcell
from sandcell import Limits


def test_run(client):
    run = client.run("import sys\nprint(6 * 7)\nprint('é', file=sys.stderr)")
    assert run.state == "done" and run.id
    r = run.result
    assert r.ok and r.reason == "exited" and r.exit_code == 0
    assert r.stdout == "42\n" and r.stderr == "é\n" and r.stderr_bytes == "é\n".encode()
    assert r.enforcement["backend"] == "wasm" and r.elapsed_ms > 0
    assert run.created_at is not None and run.finished_at >= run.created_at
    assert client.get_run(run.id).result.stdout == "42\n"


def test_run_arguments(client):
    run = client.run("import sys, os\nprint(sys.argv[1:], os.environ['GREETING'], sys.stdin.buffer.read())",
                     args=["a", "b"], env={"GREETING": "hello"}, stdin=b"\xff\x00")
    assert run.result.stdout == "['a', 'b'] hello b'\\xff\\x00'\n"
    # Output that is not UTF-8 comes back exactly.
    run = client.run("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe')")
    assert run.result.stdout_bytes == b"\xff\xfe"


def test_run_limits(client):
    r = client.run("while True: pass", limits=Limits(timeout_ms=500)).result
    assert r.reason == "timeout" and not r.ok
    r = client.run("x = bytearray(400 << 20)", limits={"memory_mib": 64}).result
    assert r.reason == "memory_limit" or "MemoryError" in r.stderr


def test_stream(client):
    events = list(client.run_stream("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.05)"))
    out = [e for e in events if isinstance(e, sandcell.Output)]
    assert b"".join(e.data for e in out if e.stream == "stdout") == b"0\n1\n2\n"
    assert isinstance(events[-1], sandcell.Run) and events[-1].result.stdout == "0\n1\n2\n"
    # From after an event: only what follows it.
    first = out[0]
    if first.id is not None:
        rest = list(client.stream(events[-1].id, after=first.id))
        assert isinstance(rest[-1], sandcell.Run)


def test_cancel(client):
    run = client.start("import time\ntime.sleep(60)")
    assert run.state in ("queued", "running")
    client.cancel(run.id)
    for ev in client.stream(run.id):
        last = ev
    assert last.result.reason == "cancelled"


def test_workspaces_and_files(client):
    ws = client.create_workspace()
    try:
        client.write_file(ws.id, "data/in put é.csv", "a,b\n1,2\n")
        client.write_file(ws.id, "blob.bin", b"\x00\xff")
        names = {f.path: f for f in client.list_files(ws.id)}
        assert names["data/in put é.csv"].type == "file" and names["data/in put é.csv"].size == 8
        assert names["data"].type == "dir"
        run = client.run("import csv\nrows = list(csv.reader(open('/ws/data/in put é.csv')))\n"
                         "open('/ws/out.txt', 'w').write(str(len(rows)))\nprint(rows[1])", workspace=ws.id)
        assert run.result.stdout == "['1', '2']\n"
        assert client.read_file(ws.id, "out.txt") == b"2"
        assert client.read_file(ws.id, "blob.bin") == b"\x00\xff"
        info = client.workspace(ws.id)
        assert info.usage and info.quota and not info.over_quota
        client.delete_file(ws.id, "data")
        with pytest.raises(sandcell.NotFound) as e:
            client.read_file(ws.id, "data/in put é.csv")
        assert e.value.code == "not_found" and e.value.status == 404
        # A link the guest made is never followed: 409 unsafe_file.
        client.run("import os\nos.symlink('out.txt', '/ws/link')", workspace=ws.id)
        with pytest.raises(sandcell.Conflict) as e:
            client.read_file(ws.id, "link")
        assert e.value.code == "unsafe_file"
    finally:
        client.delete_workspace(ws.id)
    with pytest.raises(sandcell.NotFound):
        client.workspace(ws.id)


def test_paths_stay_on_their_route(client):
    """A path never leaves its workspace's files: '..' would reach another route."""
    ws, other = client.create_workspace(), client.create_workspace()
    try:
        for bad in ("../../" + other.id, "a/../b", "./a", "", "a//b", "/abs"):
            with pytest.raises(ValueError):
                client.delete_file(ws.id, bad)
        assert client.workspace(other.id).id == other.id
        client.write_file(ws.id, "we#ird ?%.txt", b"1")
        assert client.read_file(ws.id, "we#ird ?%.txt") == b"1"
    finally:
        client.delete_workspace(ws.id)
        client.delete_workspace(other.id)


def test_paging(client):
    ws = client.create_workspace()
    try:
        for i in range(5):
            client.write_file(ws.id, f"f{i}", b"x")
        page = client.workspace(ws.id, limit=2)
        assert len(page.files) == 2 and page.next
        assert [f.path for f in client.list_files(ws.id)] == [f"f{i}" for i in range(5)]
    finally:
        client.delete_workspace(ws.id)


def test_problems(client):
    with pytest.raises(sandcell.BadRequest) as e:
        client.run("print(1)", limits={"timeout_ms": 10**9})
    assert e.value.code == "limit_exceeded" and e.value.detail
    with pytest.raises(sandcell.BadRequest) as e:
        client.run("print(1)", limits={"no_such_limit": 1})
    assert e.value.code == "unknown_field"
    with pytest.raises(sandcell.BadRequest) as e:
        client.run("print('\x00')")
    assert e.value.code == "bad_request"
    with pytest.raises(sandcell.NotFound):
        client.get_run("no-such-run")
    with pytest.raises(sandcell.NotFound):
        client.session("no-such-session")
    assert isinstance(e.value, sandcell.ProblemError) and isinstance(e.value, sandcell.SandcellError)


def test_tokens(url, agent):
    with sandcell.Client(url=url, token="not-a-token") as c:
        with pytest.raises(sandcell.Unauthorized) as e:
            c.info()
    assert e.value.status == 401
    assert agent.run("print('over tcp')").result.stdout == "over tcp\n"
    # A runner decides nothing.
    with pytest.raises(sandcell.Forbidden):
        agent.approvals()


def test_info_and_tools(client):
    info = client.info()
    assert info["interpreter"] and info["limits"]
    tools = client.tools()
    assert {t["name"] for t in tools["tools"]} >= {"run_python", "read_file"}


def test_sessions(client):
    ws = client.create_workspace()
    with client.open_session(workspace=ws.id) as s:
        assert s.info.state == "ready" and s.workspace == ws.id
        a = s.run("x = 40\nx + 2")
        assert a.value == "42" and a.state == "preserved" and a.result.ok
        a = s.run("print(x); 1/0")
        assert a.result.stdout == "40\n" and "ZeroDivisionError" in a.result.stderr and a.state == "preserved"
        assert s.info.cells == 2
        assert s.id in {x.id for x in client.sessions()}
        with s.fork() as f:
            assert f.info.forked_from == s.id
            assert f.run("x").value == "40"
            f.run("x = 0")
        assert s.run("x").value == "40"
        a = s.run("while True: pass", limits=Limits(timeout_ms=300))
        assert a.state == "rolled_back" and a.result.reason == "timeout"
        assert s.run("x").value == "40"
        # The session's workspace is a workspace like any other.
        s.run("open('/ws/note.txt', 'w').write('kept')")
        assert client.read_file(s.workspace, "note.txt") == b"kept"
    with pytest.raises(sandcell.NotFound):
        client.run_cell(s.id, "x")
    s.close()  # closing again is not an error
    client.delete_workspace(ws.id)
    # Without a workspace of its own, a session has a private one, which no call reaches.
    with client.open_session() as s:
        assert s.workspace == "" and s.run("1 + 1").value == "2"


def test_sql_approval(client, agent, approver):
    ws = agent.create_workspace()
    try:
        agent.run("import sqlite3\nc = sqlite3.connect('/ws/db.sqlite')\nc.execute('create table t (a, b)')\nc.commit()",
                  workspace=ws.id)
        with pytest.raises(sandcell.ApprovalRequired) as e:
            agent.sql(ws.id, "db.sqlite", "insert into t values (?, ?)", params=[1, b"\x00\x01"])
        ap = e.value.approval_id
        assert ap and e.value.code == "approval_required"
        pending = {a.id: a for a in approver.approvals(state="pending")}
        assert pending[ap].action == "sql.write" and pending[ap].requester
        # The requester cannot approve its own request.
        with pytest.raises(sandcell.Forbidden):
            agent.decide(ap, True)
        decided = approver.decide(ap, True)
        assert decided.state == "approved" and decided.decided_by
        res = agent.sql(ws.id, "db.sqlite", "insert into t values (?, ?)", params=[1, b"\x00\x01"], approval=ap)
        assert res.changes == 1
        # A spent approval is not spent again.
        with pytest.raises(sandcell.Conflict) as e:
            agent.sql(ws.id, "db.sqlite", "insert into t values (?, ?)", params=[1, b"\x00\x01"], approval=ap)
        assert e.value.code == "approval_invalid"
        rows = agent.sql(ws.id, "db.sqlite", "select a, hex(b), b from t where a = :a", params={"a": 1})
        assert rows.columns == ["a", "hex(b)", "b"] and rows.rows == [[1, "0001", b"\x00\x01"]]
        with pytest.raises(sandcell.SQLError) as e:
            agent.sql(ws.id, "db.sqlite", "select * from no_such_table")
        assert e.value.sql_code
    finally:
        agent.delete_workspace(ws.id)


def test_retry_after(url):
    """runs.max_per_caller is 2 for these tests: a third run is refused 429 with
    Retry-After, raised at once without retries, and sent again with them."""
    import os
    tok = os.environ["SANDCELL_TEST_RETRY_TOKEN"]
    with sandcell.Client(url=url, token=tok, max_retries=0) as c, \
            sandcell.Client(url=url, token=tok, max_retries=30) as patient:
        held = [c.start("import time\ntime.sleep(2)") for _ in range(2)]
        with pytest.raises(sandcell.RateLimited) as e:
            c.run("print(1)")
        assert e.value.code == "caller_limit" and e.value.retry_after == 1.0
        t = time.monotonic()
        assert patient.run("print(1)").result.stdout == "1\n"
        assert time.monotonic() - t >= 0.9
        for r in held:
            assert c.get_run(r.id).state in ("running", "done")


def test_daemon_gone(tmp_path):
    # No socket at all: TransportError at once.
    with sandcell.Client(str(tmp_path / "none.sock")) as c:
        with pytest.raises(sandcell.TransportError):
            c.info()
    # A socket that accepts and never answers: Timeout within the client's timeout.
    path = str(tmp_path / "silent.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(8)
    held = []
    threading.Thread(target=lambda: held.append(srv.accept()), daemon=True).start()
    try:
        with sandcell.Client(path, timeout=0.5) as c:
            t = time.monotonic()
            with pytest.raises(sandcell.Timeout):
                c.info()
            assert time.monotonic() - t < 5
            # A run waits for its answer as long as run_timeout, no longer.
            c.run_timeout = 1.0
            with pytest.raises(sandcell.Timeout):
                c.run("print(1)")
    finally:
        srv.close()


def test_native_plot(client, native):
    ws = client.create_workspace()
    with client.open_session(workspace=ws.id, backend="native", limits={"memory_mib": 1024}) as s:
        a = s.run("import pandas as pd, matplotlib.pyplot as plt\n"
                  "df = pd.DataFrame({'x': [1, 2, 3], 'y': [1, 4, 9]})\n"
                  "df.plot(x='x', y='y')\nint(df.y.sum())")
        assert a.result.ok, a.result.stderr
        assert a.value == "14" and s.info.enforcement["backend"] == "native"
        png = [d for d in a.result.displays if d.type == "image/png"]
        assert png and png[0].width > 0
        data = client.read_file(s.workspace, png[0].path)
        assert data.startswith(b"\x89PNG") and len(data) == png[0].bytes
    client.delete_workspace(ws.id)


def test_cell_stream(client):
    with client.open_session() as s:
        seen = []
        for ev in s.run_stream("import time\nprint('a', flush=True)\ntime.sleep(1.5)\nprint('b')\n6 * 7"):
            seen.append((ev, time.monotonic()))
        first, at = seen[0]
        assert isinstance(first, sandcell.Output) and first.stream == "stdout" and first.data == b"a\n"
        last, end = seen[-1]
        assert isinstance(last, sandcell.CellAnswer) and last.value == "42" and last.result.stdout == "a\nb\n"
        assert end - at >= 1.0, f"the first output came {end - at:.2f} s before the answer"
        assert s.info.cells == 1
    with pytest.raises(sandcell.NotFound):
        list(client.run_cell_stream("01NOSUCHSESSION", "1"))
