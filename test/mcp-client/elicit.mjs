// Runs and SQL writes held for approval, confirmed at the client: the official
// TypeScript SDK's client answers the server's elicitation (accept, decline); a
// client without the elicitation capability gets the approval id instead. Run by
// TestMCPWithTheTypeScriptSDK against a daemon whose approvals.required has "run";
// SANDCELL_MCP_URL and SANDCELL_MCP_TOKEN say where it listens.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

function check(ok, what, seen) {
  if (!ok) {
    console.error(`FAILED: ${what}: ${JSON.stringify(seen)}`);
    process.exit(1);
  }
}
const text = (res) => (res.content || []).filter((c) => c.type === "text").map((c) => c.text).join("");
const transport = () =>
  new StreamableHTTPClientTransport(new URL(process.env.SANDCELL_MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.SANDCELL_MCP_TOKEN}` } },
  });

const answers = ["accept", "decline", "accept", "accept", "decline"];
const shown = [];
const asking = new Client({ name: "sandcell-ts-elicit", version: "1.0.0" }, { capabilities: { elicitation: {} } });
asking.setRequestHandler(ElicitRequestSchema, (req) => {
  shown.push(req.params.message);
  return { action: answers.shift(), content: {} };
});
await asking.connect(transport());
let res = await asking.callTool({ name: "run_python", arguments: { code: "print(6*7)" } });
check(!res.isError && text(res).includes("42"), "accepted at the client", res);
check(shown.length === 1 && shown[0].includes("print(6*7)"), "the person saw the code", shown);
res = await asking.callTool({ name: "run_python", arguments: { code: "print('no')" } });
check(res.isError && text(res).includes("declined"), "declined at the client", res);
// A SQL write held for approval: confirmed, it writes; declined, it does not.
res = await asking.callTool({ name: "run_python", arguments: { code: "import sqlite3; c = sqlite3.connect('t.db'); c.execute('create table t (x)'); c.commit()" } });
check(!res.isError, "a database, made by a confirmed run", res);
res = await asking.callTool({ name: "run_sql", arguments: { db: "t.db", sql: "INSERT INTO t VALUES (?)", params: [42] } });
check(!res.isError && res.structuredContent.result.changes === 1, "a write confirmed at the client", res);
check(shown[shown.length - 1].includes("INSERT INTO t") && shown[shown.length - 1].includes("[42]"), "the person saw the statement and its parameters", shown);
res = await asking.callTool({ name: "run_sql", arguments: { db: "t.db", sql: "DELETE FROM t" } });
check(res.isError && text(res).includes("declined"), "a write declined at the client", res);
await asking.close();

const silent = new Client({ name: "sandcell-ts-no-elicit", version: "1.0.0" });
await silent.connect(transport());
res = await silent.callTool({ name: "run_python", arguments: { code: "print(1)" } });
check(res.isError && text(res).includes("approval_required") && text(res).includes("approval_id"), "no elicitation: the approval id", res);
await silent.close();
console.log("ok");
process.exit(0);
