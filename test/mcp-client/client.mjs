// Sandcell's MCP server as the official TypeScript SDK's client sees it. Run by
// cmd/appliance's TestMCPWithTheTypeScriptSDK, which starts a real daemon and says
// how to reach it:
//
//   SANDCELL_MCP_COMMAND, SANDCELL_MCP_ARGS (JSON), SANDCELL_MCP_ENV (JSON): start
//       `sandcell mcp` and speak over its stdin and stdout; or
//   SANDCELL_MCP_URL, SANDCELL_MCP_TOKEN: streamable HTTP with a bearer token.
//
// It prints "waiting for the kill switch" when it has checked the tools, then expects
// the tool list to empty (the test turns the kill switch on) and prints "ok" at the
// end. Any failed check exits 1 with what was seen.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

function check(ok, what, seen) {
  if (!ok) {
    console.error(`FAILED: ${what}: ${JSON.stringify(seen)}`);
    process.exit(1);
  }
}

const text = (res) => (res.content || []).filter((c) => c.type === "text").map((c) => c.text).join("");

let transport;
if (process.env.SANDCELL_MCP_URL) {
  transport = new StreamableHTTPClientTransport(new URL(process.env.SANDCELL_MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.SANDCELL_MCP_TOKEN}` } },
  });
} else {
  transport = new StdioClientTransport({
    command: process.env.SANDCELL_MCP_COMMAND,
    args: JSON.parse(process.env.SANDCELL_MCP_ARGS || "[]"),
    env: JSON.parse(process.env.SANDCELL_MCP_ENV || "{}"),
    stderr: "inherit",
  });
}

const client = new Client({ name: "sandcell-ts-test", version: "1.0.0" });
let changed = () => {};
client.setNotificationHandler(ToolListChangedNotificationSchema, () => changed());
await client.connect(transport);

const info = client.getServerVersion();
check(info && info.name === "sandcell", "server info", info);

const { tools } = await client.listTools();
const names = tools.map((t) => t.name).sort();
check(JSON.stringify(names) === JSON.stringify(["list_files", "read_file", "run_cell", "run_python", "run_sql", "write_file"]), "tools", names);
const runPython = tools.find((t) => t.name === "run_python");
check(runPython.inputSchema.properties.code.maxLength > 0, "run_python's code has a bound", runPython.inputSchema);

let res = await client.callTool({ name: "run_python", arguments: { code: "print(6*7)" } });
check(!res.isError && text(res).startsWith("exit 0 (exited) in ") && text(res).includes("42"), "run_python 42", res);
check(res.structuredContent && res.structuredContent.run.result.stdout === "42\n", "structured content", res.structuredContent);
const workspace = res.structuredContent.workspace;

res = await client.callTool({ name: "run_python", arguments: { code: "import sqlite3; c = sqlite3.connect('t.db'); c.execute('create table t (x)'); c.execute('insert into t values (7)'); c.commit()" } });
check(!res.isError, "create a database", res);
res = await client.callTool({ name: "run_sql", arguments: { db: "t.db", sql: "SELECT x * 6 AS answer FROM t" } });
check(!res.isError && text(res).includes("[42]"), "SQL read", res);
check(res.structuredContent.workspace === workspace, "one workspace per session", res.structuredContent);
res = await client.callTool({ name: "run_sql", arguments: { db: "t.db", sql: "DELETE FROM t" } });
check(res.isError && text(res).includes("approval_required") && text(res).includes("approval_id"), "SQL write held for approval", res);

// run_cell: one interpreter for this session, its state kept from call to call, and
// said to be lost when a cell ends it.
res = await client.callTool({ name: "run_cell", arguments: { code: "rows = [6, 7]" } });
check(!res.isError && text(res).includes("a fresh interpreter") && text(res).includes("state: preserved"), "run_cell first", res);
res = await client.callTool({ name: "run_cell", arguments: { code: "rows[0] * rows[1]" } });
check(!res.isError && !text(res).includes("fresh") && text(res).includes("\n42\n"), "run_cell keeps state", res);
check(res.structuredContent.cell.state === "preserved" && res.structuredContent.cell.value === "42" &&
  res.structuredContent.workspace === workspace, "run_cell structured", res.structuredContent);
res = await client.callTool({ name: "run_cell", arguments: { code: "rows.append(1)\nwhile True: pass", timeout_ms: 300 } });
check(res.isError && text(res).includes("state: rolled_back") && res.structuredContent.cell.state === "rolled_back", "run_cell rolled back", res);
res = await client.callTool({ name: "run_cell", arguments: { code: "rows" } });
check(!res.isError && !text(res).includes("fresh") && text(res).includes("[6, 7]"), "run_cell state before the rolled-back cell", res);
res = await client.callTool({ name: "run_cell", arguments: { code: "import time\ntime.sleep(5)", timeout_ms: 300 } });
check(res.isError && text(res).includes("state: lost") && res.structuredContent.cell.state === "lost", "run_cell lost", res);
res = await client.callTool({ name: "run_cell", arguments: { code: "'rows' in dir()" } });
check(!res.isError && text(res).includes("a fresh interpreter") && text(res).includes("False"), "run_cell fresh after lost", res);

res = await client.callTool({ name: "write_file", arguments: { path: "notes/a.txt", content: "hello" } });
check(!res.isError, "write_file", res);
res = await client.callTool({ name: "read_file", arguments: { path: "notes/a.txt" } });
check(!res.isError && text(res) === "hello", "read_file", res);

// An argument past its bound is refused before anything runs.
let refused;
try {
  res = await client.callTool({ name: "run_python", arguments: { code: "x".repeat(256 * 1024 + 1) } });
  refused = res.isError;
} catch (e) {
  refused = true;
}
check(refused, "oversized code refused", res);
// An unknown tool is an error, not a crash.
try {
  res = await client.callTool({ name: "no_such_tool", arguments: {} });
  refused = res.isError;
} catch (e) {
  refused = true;
}
check(refused, "unknown tool", res);
res = await client.callTool({ name: "run_python", arguments: { code: "print('still here')" } });
check(!res.isError && text(res).includes("still here"), "the server after the refusals", res);

// The kill switch: the list empties, and the client is told.
const emptied = new Promise((resolve) => {
  changed = async () => {
    const { tools } = await client.listTools();
    if (tools.length === 0) resolve();
  };
});
console.log("waiting for the kill switch");
const timeout = setTimeout(() => check(false, "tools/list_changed after the kill switch", null), 20000);
await emptied;
clearTimeout(timeout);
try {
  res = await client.callTool({ name: "run_python", arguments: { code: "print(1)" } });
  refused = res.isError;
} catch (e) {
  refused = true;
}
check(refused, "a call with the kill switch on", res);

await client.close();
console.log("ok");
process.exit(0);
