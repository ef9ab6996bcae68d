// The Deep Agents backend against a real daemon, driven by Deep Agents' own agent
// (createDeepAgent, its file tools and loop) with LangChain's own scripted model
// (@langchain/core/testing's fakeModel): no network, no model. The caller starts the
// daemon (make test does, from cmd/appliance's TestTypeScriptClient) and names its
// socket in SANDCELL_SOCKET.
import assert from "node:assert/strict";
import { test } from "node:test";
import { createDeepAgent, isSandboxBackend } from "deepagents";
import { fakeModel } from "@langchain/core/testing";
import { AIMessage } from "@langchain/core/messages";
import { Client } from "sandcell";
import { SandcellBackend } from "../dist/index.js";

if (!process.env.SANDCELL_SOCKET) throw new Error("SANDCELL_SOCKET is not set: these tests need a running daemon (make test starts one)");

const toolMessages = (result) => Object.fromEntries(result.messages.filter((m) => m.type === "tool" || m._getType?.() === "tool")
  .map((m) => [m.tool_call_id, typeof m.content === "string" ? m.content : JSON.stringify(m.content)]));

test("a deep agent writes, edits and searches its files and computes with Python across cells", async () => {
  const backend = await SandcellBackend.create();
  try {
    assert.equal(isSandboxBackend(backend), false, "no execute: the agent is offered no shell");
    const model = fakeModel()
      .respondWithTools([{ name: "write_file", id: "w1", args: { file_path: "/data/sales.csv", content: "month,sales\n1,10\n2,30\n3,2\n" } }])
      .respondWithTools([{ name: "write_file", id: "w2", args: { file_path: "/notes.md", content: "# Notes\nTODO: total\n" } }])
      .respondWithTools([{ name: "edit_file", id: "e1", args: { file_path: "/notes.md", old_string: "TODO: total", new_string: "total: see report.txt" } }])
      .respondWithTools([{ name: "run_python", id: "p1", args: { code: "import csv\nrows = list(csv.DictReader(open('data/sales.csv')))\ntotal = sum(int(r['sales']) for r in rows)\nprint('total', total)" } }])
      .respondWithTools([{ name: "run_python", id: "p2", args: { code: "open('report.txt', 'w').write(f'{total}\\n')\ntotal * 2" } }])
      .respondWithTools([{ name: "run_python", id: "p3", args: { code: "import subprocess\nsubprocess.run(['sh', '-c', 'ls'])" } }])
      .respondWithTools([{ name: "ls", id: "l1", args: { path: "/" } }])
      .respondWithTools([{ name: "grep", id: "g1", args: { pattern: "total", path: "/", glob: "*.md" } }])
      .respondWithTools([{ name: "glob", id: "g2", args: { pattern: "**/*.csv" } }])
      .respondWithTools([{ name: "read_file", id: "r1", args: { file_path: "/report.txt" } }])
      .respondWithTools([{ name: "execute", id: "x1", args: { command: "ls" } }])
      .respond(new AIMessage("The total is 42."));
    // What the agent binds to the model is what the model is offered.
    const bound = [];
    const bindTools = model.bindTools.bind(model);
    model.bindTools = (tools, ...rest) => {
      bound.push(tools.map((t) => t.name ?? t.function?.name));
      return bindTools(tools, ...rest);
    };
    const agent = createDeepAgent({ model, backend, tools: backend.tools() });
    const result = await agent.invoke({ messages: [{ role: "user", content: "Sum the sales" }] }, { recursionLimit: 50 });
    assert.equal(result.messages.at(-1).content, "The total is 42.");
    const out = toolMessages(result);
    assert.match(out.w1, /Successfully wrote/);
    assert.match(out.e1, /Successfully replaced|1/);
    assert.match(out.p1, /stdout:\ntotal 42\n/);
    assert.match(out.p2, /value: 84/);
    assert.match(out.p3, /Error|Traceback/, out.p3);
    assert.match(out.l1, /\/data\/ \(directory\)/);
    assert.match(out.l1, /\/notes\.md/);
    assert.match(out.l1, /\/report\.txt/);
    assert.match(out.g1, /notes\.md/);
    assert.doesNotMatch(out.g1, /^\/report\.txt/m, "the glob kept grep to *.md");
    assert.match(out.g2, /\/data\/sales\.csv/);
    assert.match(out.r1, /42/);
    // The model was offered the file tools and run_python, never execute; one that asks
    // for a shell anyway is told there is none.
    const offered = new Set(bound.flat());
    for (const name of ["ls", "read_file", "write_file", "edit_file", "glob", "grep", "run_python"]) assert.ok(offered.has(name), `${name} in ${[...offered]}`);
    assert.ok(!offered.has("execute"), `execute offered: ${[...offered]}`);
    assert.match(out.x1, /Execution not available/);
    // The files are the workspace's, seen by the daemon's own API.
    const client = new Client();
    assert.equal(new TextDecoder().decode(await client.readFile(backend.workspace, "notes.md")), "# Notes\ntotal: see report.txt\n");
    assert.equal(new TextDecoder().decode(await client.readFile(backend.workspace, "report.txt")), "42\n");
  } finally {
    await backend.close();
  }
  await assert.rejects(new Client().workspace(backend.workspace), (e) => e.status === 404);
});

test("the backend's answers, as Deep Agents' protocol defines them", async () => {
  const backend = await SandcellBackend.create();
  try {
    assert.deepEqual(await backend.write("/a.txt", "x\ny\nz\n"), { path: "/a.txt", filesUpdate: null });
    const page = await backend.read("/a.txt", 1, 1);
    assert.deepEqual(page, { content: "y", mimeType: "text/plain", totalLines: 3, startLine: 2, endLine: 2, nextOffset: 2 });
    assert.match((await backend.read("/a.txt", 9)).error, /exceeds file length/);
    assert.match((await backend.read("/none")).error, /not found/);
    assert.match((await backend.ls("/none")).error, /not found/);
    assert.match((await backend.edit("/a.txt", "q", "r")).error, /not found/);
    await backend.write("/b.txt", "aa aa");
    assert.match((await backend.edit("/b.txt", "aa", "b")).error, /2 occurrences/);
    assert.equal((await backend.edit("/b.txt", "aa", "b", true)).occurrences, 2);
    const png = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0, 1, 2]);
    assert.deepEqual(await backend.uploadFiles([["/img/p.png", png], ["/../x", png]]), [
      { path: "/img/p.png", error: null }, { path: "/../x", error: "invalid_path" }]);
    const bin = await backend.read("/img/p.png");
    assert.equal(bin.mimeType, "image/png");
    assert.deepEqual([...bin.content], [...png]);
    const dl = await backend.downloadFiles(["/img/p.png", "/nothing", "/img"]);
    assert.deepEqual([...dl[0].content], [...png]);
    assert.equal(dl[1].error, "file_not_found");
    assert.equal(dl[2].error, "is_directory");
    assert.deepEqual((await backend.glob("*.txt")).files.map((f) => f.path).sort(), ["/a.txt", "/b.txt"]);
    assert.deepEqual((await backend.glob("**/*.png", "/img")).files.map((f) => f.path), ["/img/p.png"]);
    const g = await backend.grep("y", "/", null, 1);
    assert.equal(g.matches.length, 1);
    assert.deepEqual(g.matches[0], { path: "/a.txt", line: 2, text: "y" });
    assert.deepEqual(await backend.delete("/img"), { path: "/img", filesUpdate: null });
    assert.match((await backend.delete("/img")).error, /not found/);
    assert.match((await backend.delete("/")).error, /root/);
    assert.match((await backend.write("/../../etc/passwd", "x")).error, /outside the workspace/);
    // Python sees the same files at /ws.
    const r = await backend.runPython("import os\nsorted(os.listdir('/ws'))");
    assert.match(r.text, /value: \['a.txt', 'b.txt'\]/);
  } finally {
    await backend.close();
  }
});

test("a deep agent's parallel and failing run_python calls never end its run", async () => {
  const backend = await SandcellBackend.create();
  try {
    const model = fakeModel()
      .respondWithTools([
        { name: "run_python", id: "a", args: { code: "import time\ntime.sleep(1)\nx = 20" } },
        { name: "run_python", id: "b", args: { code: "x + 22" } },
      ])
      .respond(new AIMessage("half"))
      .respondWithTools([{ name: "run_python", id: "c", args: { code: "'x' in globals()" } }])
      .respondWithTools([{ name: "read_file", id: "d", args: { file_path: "/ws/blob.bin" } }])
      .respond(new AIMessage("done"));
    await backend.uploadFiles([["/blob.bin", new Uint8Array([0, 159, 146, 150, 255])]]);
    const agent = createDeepAgent({ model, backend, tools: backend.tools() });
    const half = await agent.invoke({ messages: [{ role: "user", content: "go" }] }, { recursionLimit: 20 });
    // The session ends behind the agent's back (an idle timeout, a restart).
    await backend.client.closeSession(backend.id);
    const result = await agent.invoke({ messages: [...half.messages, { role: "user", content: "more" }] }, { recursionLimit: 20 });
    assert.equal(result.messages.at(-1).content, "done");
    const out = { ...toolMessages(half), ...toolMessages(result) };
    assert.doesNotMatch(out.a, /Sandcell did not run/, out.a);
    assert.match(out.b, /value: 42/);
    assert.match(out.c, /ran in a new one/);
    assert.match(out.c, /value: False/);
    assert.match(out.d, /binary \(5 bytes\)/, "the /ws/ prefix names the workspace's root; a binary file is described, not sent");
  } finally {
    await backend.close();
  }
});

test("grep past a file it does not read keeps what it found, flagged incomplete", async () => {
  const backend = await SandcellBackend.create({ maxFileBytes: 1000 });
  try {
    await backend.write("/big.csv", "TODO\n".repeat(400));
    await backend.write("/notes.md", "a\nTODO: this\n");
    const g = await backend.grep("TODO", "/", null);
    assert.deepEqual(g.matches, [{ path: "/notes.md", line: 2, text: "TODO: this" }]);
    assert.equal(g.truncated, true);
    assert.equal(g.error, undefined);
    assert.match((await backend.read("/big.csv")).error, /run_python/);
    const capped = await backend.grep("a", "/", "/*.md", 1);
    assert.equal(capped.matches.length, 1);
  } finally {
    await backend.close();
  }
});
