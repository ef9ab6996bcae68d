// The TypeScript client against a real daemon, which the caller starts (make test
// does, from cmd/appliance's TestTypeScriptClient) and names in the environment:
// SANDCELL_SOCKET (this uid: runner, approver, admin), SANDCELL_TEST_URL (TCP),
// SANDCELL_TEST_TOKEN (a runner), SANDCELL_TEST_APPROVER_TOKEN (an approver),
// SANDCELL_TEST_RETRY_TOKEN (another runner; runs.max_per_caller = 2).
import assert from "node:assert/strict";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import * as fs from "node:fs";
import { test } from "node:test";

import * as sandcell from "../dist/index.js";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: these tests need a running daemon (make test starts one)`);
  return v;
};
const client = () => new sandcell.Client({ socket: env("SANDCELL_SOCKET") });
const overTCP = (token) => new sandcell.Client({ url: env("SANDCELL_TEST_URL"), token });

test("a run", async () => {
  const sc = client();
  try {
    const run = await sc.run("import sys\nprint(6 * 7)\nprint('é', file=sys.stderr)");
    assert.equal(run.state, "done");
    assert.equal(run.result.reason, "exited");
    assert.equal(run.result.stdout, "42\n");
    assert.equal(run.result.stderr, "é\n");
    assert.equal(run.result.enforcement.backend, "wasm");
    const bin = await sc.run("import sys\nsys.stdout.buffer.write(b'\\xff\\x00')", { stdin: new Uint8Array([1]) });
    assert.deepEqual([...sandcell.outputBytes(bin.result, "stdout")], [0xff, 0]);
    const args = await sc.run("import sys, os\nprint(sys.argv[1:], os.environ['GREETING'], sys.stdin.read())",
      { args: ["a"], env: { GREETING: "hello" }, stdin: "in" });
    assert.equal(args.result.stdout, "['a'] hello in\n");
    const slow = await sc.run("while True: pass", { limits: { timeout_ms: 500 } });
    assert.equal(slow.result.reason, "timeout");
    assert.equal((await sc.getRun(run.id)).result.stdout, "42\n");
  } finally {
    sc.close();
  }
});

test("a run's events", async () => {
  const sc = client();
  try {
    const events = [];
    for await (const ev of sc.runStream("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.05)")) events.push(ev);
    const out = Buffer.concat(events.filter((e) => e.kind === "output" && e.stream === "stdout").map((e) => e.data));
    assert.equal(out.toString(), "0\n1\n2\n");
    assert.equal(events.at(-1).kind, "result");
    assert.equal(events.at(-1).run.result.stdout, "0\n1\n2\n");
    const started = await sc.start("import time\ntime.sleep(60)");
    await sc.cancel(started.id);
    let last;
    for await (const ev of sc.stream(started.id)) last = ev;
    assert.equal(last.run.result.reason, "cancelled");
  } finally {
    sc.close();
  }
});

test("workspaces and files", async () => {
  const sc = client();
  const ws = await sc.createWorkspace();
  try {
    await sc.writeFile(ws.id, "data/in put é.csv", "a,b\n1,2\n");
    await sc.writeFile(ws.id, "blob.bin", new Uint8Array([0, 255]));
    const names = Object.fromEntries((await sc.listFiles(ws.id)).map((f) => [f.path, f]));
    assert.equal(names["data/in put é.csv"].size, 8);
    assert.equal(names.data.type, "dir");
    const run = await sc.run("print(open('/ws/data/in put é.csv').read().split()[1])\nopen('/ws/out.txt', 'w').write('ok')", { workspace: ws.id });
    assert.equal(run.result.stdout, "1,2\n");
    assert.equal(Buffer.from(await sc.readFile(ws.id, "out.txt")).toString(), "ok");
    assert.deepEqual([...(await sc.readFile(ws.id, "blob.bin"))], [0, 255]);
    await sc.deleteFile(ws.id, "data");
    await assert.rejects(sc.readFile(ws.id, "data/in put é.csv"), sandcell.NotFound);
    // A path never leaves the workspace's files: ".." would reach another route.
    for (const bad of ["../../" + ws.id, "a/../b", "./a", "", "a//b", "/abs"]) await assert.rejects(sc.deleteFile(ws.id, bad), TypeError);
    assert.equal((await sc.workspace(ws.id)).id, ws.id);
    await sc.writeFile(ws.id, "we#ird ?%.txt", "1");
    assert.equal(Buffer.from(await sc.readFile(ws.id, "we#ird ?%.txt")).toString(), "1");
    await sc.run("import os\nos.symlink('out.txt', '/ws/link')", { workspace: ws.id });
    await assert.rejects(sc.readFile(ws.id, "link"), (e) => e instanceof sandcell.Conflict && e.code === "unsafe_file");
  } finally {
    await sc.deleteWorkspace(ws.id);
    sc.close();
  }
});

test("problems are typed errors", async () => {
  const sc = client();
  try {
    await assert.rejects(sc.run("print(1)", { limits: { timeout_ms: 1e9 } }), (e) => e instanceof sandcell.BadRequest && e.code === "limit_exceeded" && e.status === 400);
    await assert.rejects(sc.run("print(1)", { limits: { no_such_limit: 1 } }), (e) => e instanceof sandcell.BadRequest && e.code === "unknown_field");
    await assert.rejects(sc.getRun("no-such-run"), (e) => e instanceof sandcell.NotFound && e instanceof sandcell.ProblemError && e instanceof sandcell.SandcellError);
    const stranger = overTCP("not-a-token");
    await assert.rejects(stranger.info(), sandcell.Unauthorized);
    stranger.close();
    const agent = overTCP(env("SANDCELL_TEST_TOKEN"));
    assert.equal((await agent.run("print('tcp')")).result.stdout, "tcp\n");
    await assert.rejects(agent.approvals(), sandcell.Forbidden);
    agent.close();
    const tools = await sc.tools();
    assert.ok(tools.tools.some((t) => t.name === "run_python"));
  } finally {
    sc.close();
  }
});

test("sessions", async () => {
  const sc = client();
  try {
    const s = await sc.openSession();
    try {
      assert.equal(s.info.state, "ready");
      let a = await s.run("x = 40\nx + 2");
      assert.equal(a.value, "42");
      assert.equal(a.state, "preserved");
      a = await s.run("while True: pass", { limits: { timeout_ms: 300 } });
      assert.equal(a.state, "rolled_back");
      assert.equal((await s.run("x")).value, "40");
      const f = await s.fork();
      try {
        assert.equal(f.info.forked_from, s.id);
        assert.equal((await f.run("x")).value, "40");
      } finally {
        await f.close();
      }
      assert.ok((await sc.sessions()).some((x) => x.id === s.id));
    } finally {
      await s.close();
    }
    await s.close(); // again: not an error
    await assert.rejects(sc.runCell(s.id, "x"), sandcell.NotFound);
  } finally {
    sc.close();
  }
});

test("a SQL write approved by another person", async () => {
  const agent = overTCP(env("SANDCELL_TEST_TOKEN"));
  const approver = overTCP(env("SANDCELL_TEST_APPROVER_TOKEN"));
  const ws = await agent.createWorkspace();
  try {
    await agent.run("import sqlite3\nc = sqlite3.connect('/ws/db.sqlite')\nc.execute('create table t (a, b)')\nc.commit()", { workspace: ws.id });
    const write = () => agent.sql(ws.id, "db.sqlite", "insert into t values (?, ?)", { params: [1, new Uint8Array([0, 1])], approval: id });
    let id;
    await assert.rejects(write(), (e) => e instanceof sandcell.ApprovalRequired && Boolean(id = e.approvalId));
    assert.ok((await approver.approvals("pending")).some((a) => a.id === id && a.action === "sql.write"));
    await assert.rejects(agent.decide(id, true), sandcell.Forbidden);
    assert.equal((await approver.decide(id, true)).state, "approved");
    assert.equal((await write()).changes, 1);
    await assert.rejects(write(), (e) => e instanceof sandcell.Conflict && e.code === "approval_invalid");
    const rows = await agent.sql(ws.id, "db.sqlite", "select a, hex(b), b from t where a = :a", { params: { a: 1 } });
    assert.deepEqual(rows.columns.map((c) => c.name), ["a", "hex(b)", "b"]);
    assert.deepEqual(rows.rows, [[1, "0001", new Uint8Array([0, 1])]]);
    await assert.rejects(agent.sql(ws.id, "db.sqlite", "select * from nothing"), (e) => e instanceof sandcell.SQLError && e.sqlCode !== "");
  } finally {
    await agent.deleteWorkspace(ws.id);
    agent.close();
    approver.close();
  }
});

test("Retry-After is honoured, nothing else retried", async () => {
  const token = env("SANDCELL_TEST_RETRY_TOKEN");
  const hasty = new sandcell.Client({ url: env("SANDCELL_TEST_URL"), token, maxRetries: 0 });
  const patient = new sandcell.Client({ url: env("SANDCELL_TEST_URL"), token, maxRetries: 30 });
  try {
    await Promise.all([hasty.start("import time\ntime.sleep(2)"), hasty.start("import time\ntime.sleep(2)")]);
    await assert.rejects(hasty.run("print(1)"), (e) => e instanceof sandcell.RateLimited && e.code === "caller_limit" && e.retryAfter === 1);
    const t = Date.now();
    assert.equal((await patient.run("print(1)")).result.stdout, "1\n");
    assert.ok(Date.now() - t >= 900);
  } finally {
    hasty.close();
    patient.close();
  }
});

test("a daemon that is gone or silent", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "sandcell-ts-"));
  const none = new sandcell.Client({ socket: path.join(dir, "none.sock") });
  await assert.rejects(none.info(), sandcell.TransportError);
  none.close();
  const held = [];
  const server = net.createServer((c) => held.push(c));
  await new Promise((r) => server.listen(path.join(dir, "silent.sock"), r));
  const silent = new sandcell.Client({ socket: path.join(dir, "silent.sock"), timeoutMs: 500, runTimeoutMs: 1000 });
  try {
    const t = Date.now();
    await assert.rejects(silent.info(), sandcell.TimeoutError);
    assert.ok(Date.now() - t < 5000);
    await assert.rejects(silent.run("print(1)"), sandcell.TimeoutError);
  } finally {
    silent.close();
    held.forEach((c) => c.destroy());
    server.close();
  }
});

test("a native session's plot", { skip: process.env.SANDCELL_TEST_NATIVE !== "1" && "the native backend is not installed here" }, async () => {
  const sc = client();
  const ws = await sc.createWorkspace();
  const s = await sc.openSession({ workspace: ws.id, backend: "native", limits: { memory_mib: 1024 } });
  try {
    const a = await s.run("import pandas as pd\ndf = pd.DataFrame({'x': [1, 2, 3], 'y': [1, 4, 9]})\ndf.plot(x='x', y='y')\nint(df.y.sum())");
    assert.equal(a.value, "14", a.result.stderr);
    const png = a.result.displays.find((d) => d.type === "image/png");
    const data = await sc.readFile(s.workspace, png.path);
    assert.deepEqual([...data.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
    assert.equal(data.length, png.bytes);
  } finally {
    await s.close();
    await sc.deleteWorkspace(ws.id);
    sc.close();
  }
});

test("a cell's output as it comes, then its answer", async () => {
  const sc = client();
  const s = await sc.openSession();
  try {
    const seen = [];
    for await (const ev of s.runStream("import time\nprint('a', flush=True)\ntime.sleep(1.5)\nprint('b')\n6 * 7")) seen.push([ev, Date.now()]);
    const [first, at] = seen[0];
    assert.equal(first.kind, "output");
    assert.equal(Buffer.from(first.data).toString(), "a\n");
    const [last, end] = seen.at(-1);
    assert.equal(last.kind, "answer");
    assert.equal(last.answer.value, "42");
    assert.equal(last.answer.result.stdout, "a\nb\n");
    assert.ok(end - at >= 1000, `the first output came ${end - at} ms before the answer`);
    assert.equal(s.info.cells, 1);
    await assert.rejects(async () => {
      for await (const _ of sc.runCellStream("01NOSUCHSESSION", "1")); // eslint-disable-line no-empty
    }, (e) => e instanceof sandcell.NotFound);
  } finally {
    await s.close();
    sc.close();
  }
});
