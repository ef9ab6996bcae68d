// The AI SDK provider against a real daemon, driven by the AI SDK's own agent loop
// (ToolLoopAgent, generateText) with its own scripted model (ai/test's
// MockLanguageModelV4): no network, no model. The caller starts the daemon (make test
// does, from cmd/appliance's TestProviders) and names its socket in SANDCELL_SOCKET.
import assert from "node:assert/strict";
import { test } from "node:test";
import { ToolLoopAgent, generateText, isStepCount } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { Client } from "sandcell";
import { SandcellSandbox, ShellNotOffered, sandcellTools } from "../dist/index.js";

if (!process.env.SANDCELL_SOCKET) throw new Error("SANDCELL_SOCKET is not set: these tests need a running daemon (make test starts one)");

const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
const call = (id, toolName, input) => ({
  content: [{ type: "tool-call", toolCallId: id, toolName, input: JSON.stringify(input) }],
  finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage, warnings: [],
});
const say = (text) => ({ content: [{ type: "text", text }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] });

// A model that follows a script, one answer a step, and keeps what it was shown.
function scripted(steps) {
  return new MockLanguageModelV4({ doGenerate: steps });
}

test("an agent loop writes a file, computes with Python across cells, reads the answer", async () => {
  const sandbox = await SandcellSandbox.create();
  const client = sandbox.client;
  try {
    const model = scripted([
      call("c1", "write_file", { path: "data/sales.csv", content: "month,sales\n1,10\n2,30\n3,2\n" }),
      call("c2", "run_python", { code: "import csv\nrows = list(csv.DictReader(open('data/sales.csv')))\ntotal = sum(int(r['sales']) for r in rows)\nprint('total', total)\ntotal" }),
      call("c3", "run_python", { code: "open('/ws/report.txt', 'w').write(f'{total * 2}\\n')\nlen(rows)" }),
      call("c4", "run_python", { code: "1 / 0" }),
      call("c5", "list_directory", { path: "." }),
      call("c6", "read_file", { path: "report.txt" }),
      say("The total is 42."),
    ]);
    const agent = new ToolLoopAgent({ model, tools: sandcellTools(), instructions: sandbox.description, stopWhen: isStepCount(10) });
    const result = await agent.generate({ prompt: "Sum the sales", experimental_sandbox: sandbox });
    assert.equal(result.text, "The total is 42.");
    const outputs = result.steps.flatMap((s) => s.toolResults).map((r) => [r.toolCallId, r.output]);
    const out = Object.fromEntries(outputs);
    assert.deepEqual(out.c1, { written: "data/sales.csv", bytes: 26 });
    assert.equal(out.c2.ok, true);
    assert.match(out.c2.text, /stdout:\ntotal 42\n/);
    assert.match(out.c2.text, /value: 42/);
    assert.equal(out.c3.ok, true, out.c3.text);
    assert.match(out.c3.text, /value: 3/);
    assert.equal(out.c4.ok, false);
    assert.match(out.c4.text, /ZeroDivisionError: division by zero/);
    assert.match(out.c4.text, /Traceback/);
    const names = out.c5.entries.map((e) => `${e.name}:${e.type}`).sort();
    assert.deepEqual(names, ["data:directory", "report.txt:file"]);
    assert.deepEqual(out.c6, { content: "84\n" });
    // What the model was shown of a cell is the report's text, not its JSON.
    const shown = JSON.stringify(model.doGenerateCalls[2].prompt);
    assert.match(shown, /total 42/);
    // The files are the workspace's, seen by the daemon's own API.
    assert.equal(new TextDecoder().decode(await client.readFile(sandbox.workspace, "report.txt")), "84\n");
  } finally {
    await sandbox.close();
  }
  // close() closed the session and deleted the workspace it made.
  await assert.rejects(new Client().workspace(sandbox.workspace), (e) => e.status === 404);
});

test("a shell command is refused by name, and the model learns what is offered", async () => {
  const sandbox = await SandcellSandbox.create();
  try {
    await assert.rejects(sandbox.run({ command: "ls -la" }), (e) => e instanceof ShellNotOffered && /run_python/.test(e.message) && /ls -la/.test(e.message));
    await assert.rejects(sandbox.spawn({ command: "bash" }), ShellNotOffered);
    // A tool of the caller's that runs a command through the sandbox: the loop goes on,
    // and the model is told why it failed.
    const { tool } = await import("ai");
    const { z } = await import("zod");
    const bash = tool({
      description: "run a shell command",
      inputSchema: z.object({ command: z.string() }),
      execute: async ({ command }, { experimental_sandbox }) => experimental_sandbox.run({ command }),
    });
    const model = scripted([call("b1", "bash", { command: "cat /etc/passwd" }), say("No shell here.")]);
    const result = await generateText({ model, tools: { bash }, experimental_sandbox: sandbox, prompt: "list", stopWhen: isStepCount(3) });
    assert.equal(result.text, "No shell here.");
    const err = result.steps[0].content.find((p) => p.type === "tool-error");
    assert.ok(err, JSON.stringify(result.steps[0].content));
    assert.match(String(err.error), /Sandcell runs Python, not shell commands/);
    // Nor can Python start one.
    const r = await sandbox.runPython("import subprocess\nsubprocess.run(['ls'])");
    assert.equal(r.ok, false);
  } finally {
    await sandbox.close();
  }
});

test("the sandbox's files, as the AI SDK's interface defines them", async () => {
  const sandbox = await SandcellSandbox.create();
  try {
    await sandbox.writeTextFile({ path: "a/b/c.txt", content: "one\ntwo\nthree\nfour" });
    assert.equal(await sandbox.readTextFile({ path: "/ws/a/b/c.txt", startLine: 2, endLine: 3 }), "two\nthree");
    assert.equal(await sandbox.readTextFile({ path: "a/b/c.txt", startLine: 3, endLine: 99 }), "three\nfour");
    await sandbox.writeBinaryFile({ path: "bin", content: new Uint8Array([0, 255, 1]) });
    assert.deepEqual([...await sandbox.readBinaryFile({ path: "./bin" })], [0, 255, 1]);
    const chunks = [];
    for await (const c of await sandbox.readFile({ path: "bin" })) chunks.push(...c);
    assert.deepEqual(chunks, [0, 255, 1]);
    await sandbox.writeFile({ path: "streamed", content: new ReadableStream({ start(c) { c.enqueue(new Uint8Array([104, 105])); c.enqueue(new Uint8Array([33])); c.close(); } }) });
    assert.equal(await sandbox.readTextFile({ path: "streamed" }), "hi!");
    assert.deepEqual(await sandbox.stat({ path: "a/b" }), { type: "directory", size: (await sandbox.stat({ path: "a/b" })).size });
    assert.deepEqual(await sandbox.stat({ path: "a/b/c.txt" }), { type: "file", size: 18 });
    assert.deepEqual(await sandbox.stat({ path: "." }), { type: "directory", size: 0 });
    assert.equal(await sandbox.stat({ path: "nothing" }), null);
    assert.equal(await sandbox.readBinaryFile({ path: "nothing" }), null);
    assert.equal(await sandbox.listDirectory({ path: "nothing" }), null);
    await assert.rejects(sandbox.listDirectory({ path: "bin" }), /not a directory/);
    assert.deepEqual((await sandbox.listDirectory({ path: "a" })).map((e) => e.name), ["b"]);
    await assert.rejects(sandbox.deleteFile({ path: "a/b" }), /a directory/);
    assert.equal(await sandbox.deleteFile({ path: "bin" }), true);
    assert.equal(await sandbox.deleteFile({ path: "bin" }), false);
    // What Python wrote is what the interface reads, and the other way round.
    const r = await sandbox.runPython("print(open('a/b/c.txt').read().split()[-1])");
    assert.match(r.text, /four/);
    // Nothing outside the workspace is reachable by name.
    for (const path of ["/etc/passwd", "../x", "/ws/../etc/passwd", "/wsx"]) {
      await assert.rejects(sandbox.readTextFile({ path }), /outside the workspace/, path);
      await assert.rejects(sandbox.writeTextFile({ path, content: "x" }), /outside the workspace/, path);
    }
    await assert.rejects(sandbox.writeTextFile({ path: "latin", content: "x", encoding: "latin1" }), /only UTF-8/);
  } finally {
    await sandbox.close();
  }
});

test("one step's parallel run_python calls run one after the other, in order", async () => {
  const sandbox = await SandcellSandbox.create();
  try {
    const model = scripted([
      { ...call("p1", "run_python", { code: "import time\ntime.sleep(1)\nx = 20" }),
        content: [
          { type: "tool-call", toolCallId: "p1", toolName: "run_python", input: JSON.stringify({ code: "import time\ntime.sleep(1)\nx = 20" }) },
          { type: "tool-call", toolCallId: "p2", toolName: "run_python", input: JSON.stringify({ code: "x + 22" }) },
        ] },
      say("done"),
    ]);
    const result = await generateText({ model, tools: sandcellTools(sandbox), experimental_sandbox: sandbox, prompt: "go", stopWhen: isStepCount(3) });
    const out = Object.fromEntries(result.steps[0].toolResults.map((r) => [r.toolCallId, r.output]));
    assert.equal(out.p1.ok, true, out.p1.text);
    assert.equal(out.p2.ok, true, out.p2.text);
    assert.match(out.p2.text, /value: 42/);
  } finally {
    await sandbox.close();
  }
});

test("what a model reads of a cell: the traceback survives a flood, exit status, a lost session replaced", async () => {
  const sandbox = await SandcellSandbox.create({ maxOutputChars: 5_000 });
  try {
    assert.match(sandbox.description, /standard library only/);
    assert.match(sandbox.description, /no shell/);
    const flood = await sandbox.runPython("print('x' * 30000)\n1/0");
    assert.equal(flood.ok, false);
    assert.ok(flood.text.length < 6_000, `${flood.text.length} characters`);
    assert.match(flood.text, /characters cut/);
    assert.match(flood.text, /ZeroDivisionError/);
    const exit = await sandbox.runPython("raise SystemExit(3)");
    assert.equal(exit.ok, false);
    assert.match(exit.text, /exit status 3/);
    await sandbox.runPython("kept = 1\nopen('kept.txt', 'w').write('still here')");
    // The session ends behind the sandbox's back: the next cell runs in a new one, and says so.
    const first = sandbox.id;
    await sandbox.client.closeSession(first);
    const again = await sandbox.runPython("print(open('kept.txt').read())\n'kept' in globals()");
    assert.notEqual(sandbox.id, first);
    assert.match(again.text, /ran in a new one/);
    assert.match(again.text, /still here/);
    assert.match(again.text, /value: False/);
  } finally {
    await sandbox.close();
  }
});

test("the read_file tool: names taken as given, binary and large files refused, not sent", async () => {
  const sandbox = await SandcellSandbox.create();
  try {
    await sandbox.runPython("open('report', 'w').write('plain')\nopen('report ', 'w').write('spaced')\nopen('img.bin', 'wb').write(bytes(range(256)))\nopen('big.txt', 'w').write('y' * (1 << 21))");
    assert.equal(await sandbox.readTextFile({ path: "report " }), "spaced");
    const { read_file } = sandcellTools(sandbox);
    const exec = (input) => read_file.execute(input, { toolCallId: "t", messages: [], experimental_sandbox: sandbox });
    assert.deepEqual(await exec({ path: "report" }), { content: "plain" });
    assert.match((await exec({ path: "img.bin" })).error, /binary \(256 bytes\)/);
    assert.match((await exec({ path: "big.txt" })).error, /over the 1048576 this tool reads/);
    assert.match((await exec({ path: "none" })).error, /no such file/);
  } finally {
    await sandbox.close();
  }
});

test("code held for a person's approval runs when the model asks again after it is approved", async (t) => {
  const socket = process.env.SANDCELL_TEST_APPROVALS_SOCKET;
  if (!socket) throw new Error("SANDCELL_TEST_APPROVALS_SOCKET is not set: make test starts a daemon that holds code for approval");
  const client = new Client({ socket });
  const sandbox = await SandcellSandbox.create({ client });
  try {
    const code = "print('ran', 6 * 7)";
    const held = await sandbox.runPython(code);
    assert.equal(held.ok, false);
    assert.ok(held.approval, held.text);
    assert.match(held.text, /waits for a person's approval/);
    assert.match((await sandbox.runPython(code)).text, /waits for a person's approval/, "still pending");
    await client.confirm(held.approval, true);
    const ran = await sandbox.runPython(code);
    assert.equal(ran.ok, true, ran.text);
    assert.match(ran.text, /ran 42/);
    // Declined: said, and not run.
    const other = await sandbox.runPython("print('never')");
    await client.confirm(other.approval, false);
    const refused = await sandbox.runPython("print('never')");
    assert.equal(refused.ok, false);
    assert.doesNotMatch(refused.text, /stdout/);
  } finally {
    await sandbox.close();
  }
});
