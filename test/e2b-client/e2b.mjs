// E2B's own SDK (@e2b/code-interpreter, on e2b) against Sandcell's E2B-compatible
// endpoint, pointed at it by its own configuration: E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY (a Sandcell runner's token). Prints "ok" at the end.
import assert from "node:assert/strict";
import { Sandbox } from "@e2b/code-interpreter";

const sbx = await Sandbox.create({ timeoutMs: 3_600_000 });
try {
  // Files in, code, files out.
  const written = await sbx.files.write("/home/user/data.csv", "region,amount\nnorth,10\nsouth,32\n");
  assert.equal(written.path, "/home/user/data.csv");
  const exec = await sbx.runCode(
    "import csv\nrows = list(csv.DictReader(open('data.csv')))\ntotal = sum(int(r['amount']) for r in rows)\n" +
    "print('rows', len(rows))\nopen('total.txt', 'w').write(str(total))\ntotal");
  assert.equal(exec.error, undefined);
  assert.deepEqual(exec.logs.stdout, ["rows 2\n"]);
  assert.equal(exec.text, "42");
  assert.equal(await sbx.files.read("/home/user/total.txt"), "42");
  assert.equal(await sbx.files.read("total.txt"), "42");

  // A large file both ways, streamed through the daemon.
  const big = Buffer.alloc(24 << 20, 7);
  await sbx.files.write("big.bin", big);
  const back = await sbx.files.read("big.bin", { format: "bytes" });
  assert.equal(back.length, big.length);
  assert.ok(Buffer.from(back).equals(big));

  // State is kept from one call to the next; output streams to the callbacks.
  const seen = [];
  const again = await sbx.runCode("import sys\nprint(total * 2)\nprint('warn', file=sys.stderr)",
    { onStdout: (m) => seen.push(m.line), onStderr: (m) => seen.push("err:" + m.line) });
  assert.deepEqual(again.logs.stdout, ["84\n"]);
  assert.deepEqual(again.logs.stderr, ["warn\n"]);
  assert.deepEqual(seen, ["84\n", "err:warn\n"]);

  // stdout comes as the cell prints it, not at its end; characters are never split.
  const times = [];
  const live = await sbx.runCode("import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('é' * 40000)",
    { onStdout: (m) => times.push([m.line, Date.now()]) });
  const ended = Date.now();
  assert.equal(times[0][0], "first\n");
  assert.ok(ended - times[0][1] >= 1500, `the first line came ${ended - times[0][1]} ms before the end`);
  assert.equal(live.logs.stdout.join(""), "first\n" + "é".repeat(40000) + "\n");
  // The SDK decodes each network read on its own: a character split across two would
  // be lost, so the lines it reads are ASCII.
  const mixed = await sbx.runCode("for _ in range(20): print('é€😀' * 5000, flush=True)");
  assert.equal(mixed.logs.stdout.join(""), ("é€😀".repeat(5000) + "\n").repeat(20));

  // A client slower than the cell (an onStdout that takes its time) neither stalls nor
  // cancels it: stdout past what the stream holds comes with the answer.
  let slept = false;
  const slow = await sbx.runCode("print('\\x01' * 1_000_000)\nslow_done = 1", {
    onStdout: async () => {
      if (!slept) {
        slept = true;
        await new Promise((r) => setTimeout(r, 3_000));
      }
    },
  });
  assert.equal(slow.error, undefined, slow.error && slow.error.value);
  assert.equal(slow.logs.stdout.join(""), "\x01".repeat(1_000_000) + "\n");
  assert.equal((await sbx.runCode("slow_done")).text, "1");

  // An exception: name, value and traceback, as E2B gives them.
  const failed = await sbx.runCode("def f():\n    return 1 / 0\nf()");
  assert.equal(failed.error.name, "ZeroDivisionError");
  assert.equal(failed.error.value, "division by zero");
  assert.match(failed.error.traceback, /Traceback \(most recent call last\)[\s\S]*return 1 \/ 0/);

  // A display is a result of its richest type.
  const shown = await sbx.runCode("class T:\n    def _repr_html_(self):\n        return '<b>bold</b>'\ndisplay(T())");
  assert.equal(shown.results[0].html, "<b>bold</b>");

  // The SDK's lifecycle calls: a timeout set again, the caller's sandboxes listed, a
  // second handle connected to the same one.
  await sbx.setTimeout(3_000_000);
  const endAt = (await sbx.getInfo()).endAt.getTime();
  assert.ok(endAt > Date.now() + 2_900_000 && endAt < Date.now() + 3_100_000, `endAt ${new Date(endAt)}`);
  const listed = await Sandbox.list().nextItems();
  assert.ok(listed.some((x) => x.sandboxId === sbx.sandboxId));
  const again2 = await Sandbox.connect(sbx.sandboxId);
  assert.equal((await again2.runCode("total")).text, "42");

  // Files nested, by each file's own path.
  await sbx.files.write([{ path: "/home/user/sub/a.txt", data: "A" }, { path: "sub/b.txt", data: "B" }]);
  assert.equal(await sbx.files.read("sub/a.txt"), "A");
  assert.equal(await sbx.files.read("/home/user/sub/b.txt"), "B");

  // What a Sandcell sandbox does not have: a clear error, not a fake.
  await assert.rejects(sbx.commands.run("ls"), (e) => /no shell/.test(e.message));
  await assert.rejects(sbx.files.write("/etc/passwd", "x"), (e) => /workspace/.test(e.message));
  // (The code interpreter's SDK shows only the status of a refused execution.)
  await assert.rejects(sbx.runCode("1", { language: "js" }), (e) => /400/.test(e.message));
} finally {
  await sbx.kill();
}
// Killed: gone for the SDK too.
await assert.rejects(sbx.runCode("1"), (e) => /not found|gone|sandbox/i.test(e.message));

// A kill while a cell runs ends the cell and the sandbox, without waiting for it.
const busy = await Sandbox.create();
const running = busy.runCode("import time\ntime.sleep(20)", { timeoutMs: 60_000 }).catch((e) => e);
await new Promise((r) => setTimeout(r, 1500));
const t0 = Date.now();
assert.equal(await busy.kill(), true);
assert.ok(Date.now() - t0 < 10_000, "the kill waited for the cell");
await running;
assert.equal(await busy.isRunning().catch(() => false), false);

// A sandbox lives until its timeout, which setTimeout sets again from now; then it is
// killed, as by the API.
const brief = await Sandbox.create({ timeoutMs: 3_000 });
await brief.setTimeout(60_000);
await new Promise((r) => setTimeout(r, 4_000));
assert.equal(await brief.isRunning(), true, "setTimeout did not extend the sandbox's life");
await brief.setTimeout(1_000);
for (const t0 = Date.now(); await brief.isRunning().catch(() => false) && Date.now() - t0 < 30_000;) {
  await new Promise((r) => setTimeout(r, 500));
}
assert.equal(await brief.isRunning().catch(() => false), false, "the sandbox outlived its timeout");
await assert.rejects(brief.runCode("1"), (e) => /not found|gone|sandbox/i.test(e.message));
await assert.rejects(Sandbox.create({ timeoutMs: 2 * 86_400_000 }), (e) => /86400/.test(e.message));

// A sandbox whose session ended (closed through Sandcell's own API here) is not found
// and holds nothing: its workspace is deleted, its place among the caller's sessions
// free again (two at most here).
const ended = await Sandbox.create();
const closed = await fetch(`${process.env.SANDCELL_URL}/v1/sessions/${ended.sandboxId}`,
  { method: "DELETE", headers: { authorization: `Bearer ${process.env.E2B_API_KEY}` } });
assert.equal(closed.status, 204);
await assert.rejects(ended.files.read("total.txt"), (e) => /not found/i.test(e.message));
assert.equal(await ended.isRunning(), false);
const two = [await Sandbox.create(), await Sandbox.create()];
await Promise.all(two.map((x) => x.kill()));

if (process.env.SANDCELL_TEST_NATIVE === "1") {
  const nat = await Sandbox.create("sandcell-native");
  try {
    const plot = await nat.runCode("import pandas as pd\ndf = pd.DataFrame({'x': [1, 2, 3], 'y': [1, 4, 9]})\n" +
      "df.plot(x='x', y='y')\nint(df.y.sum())");
    assert.equal(plot.error, undefined, plot.error && plot.error.traceback);
    assert.equal(plot.text, "14");
    const png = plot.results.find((r) => r.png);
    assert.ok(png && Buffer.from(png.png, "base64").subarray(0, 4).toString("latin1") === "\x89PNG");
  } finally {
    await nat.kill();
  }
}
console.log("ok");
