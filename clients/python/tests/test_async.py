"""The asyncio client: the same calls, as coroutines, many at once on one client."""

import asyncio

import pytest

import sandcell

pytestmark = pytest.mark.asyncio


async def test_async_runs(socket_path):
    async with sandcell.AsyncClient(socket_path) as c:
        runs = await asyncio.gather(*(c.run(f"print({i} * 2)") for i in range(4)))
        assert [r.result.stdout for r in runs] == [f"{i * 2}\n" for i in range(4)]
        events = [e async for e in c.run_stream("print('a'); print('b')")]
        assert isinstance(events[-1], sandcell.Run) and events[-1].result.stdout == "a\nb\n"
        with pytest.raises(sandcell.NotFound):
            await c.get_run("missing")


async def test_async_session_and_files(socket_path):
    async with sandcell.AsyncClient(socket_path) as c:
        ws = await c.create_workspace()
        try:
            await c.write_file(ws.id, "n.txt", "21")
            async with await c.open_session(workspace=ws.id) as s:
                a = await s.run("n = int(open('/ws/n.txt').read())\nn * 2")
                assert a.value == "42" and s.info.cells == 1
                evs = [ev async for ev in s.run_stream("print('half', n)\nn")]
                assert b"".join(e.data for e in evs if isinstance(e, sandcell.Output)) == b"half 21\n"
                assert isinstance(evs[-1], sandcell.CellAnswer) and evs[-1].value == "21" and s.info.cells == 2
                f = await s.fork()
                try:
                    assert (await f.run("n")).value == "21"
                finally:
                    await f.close()
            assert [x.path for x in await c.list_files(ws.id)] == ["n.txt"]
            assert await c.read_file(ws.id, "n.txt") == b"21"
        finally:
            await c.delete_workspace(ws.id)


async def test_async_transport_error(tmp_path):
    async with sandcell.AsyncClient(str(tmp_path / "none.sock")) as c:
        with pytest.raises(sandcell.TransportError):
            await c.info()
