// Code mode as the official TypeScript SDK's client sees it. Run by cmd/appliance's
// TestMCPCodeModeWithTheTypeScriptSDK, which starts a daemon whose [tools.memory] is
// the reference memory server and whose approvals.elicitation lets the person at
// this client decide, and says how to start `sandcell mcp` (SANDCELL_MCP_COMMAND,
// SANDCELL_MCP_ARGS, SANDCELL_MCP_ENV, as for client.mjs).
//
// run_python's description lists the memory server's tools; a program loops 20
// writes over it; the client, which declared elicitation, is asked once (the tool,
// the arguments, the program) and answers "accept" with calls: 20; the run ends with
// the 20 entities made. Prints "ok" at the end; any failed check exits 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

function check(ok, what, seen) {
  if (!ok) {
    console.error(`FAILED: ${what}: ${JSON.stringify(seen)}`);
    process.exit(1);
  }
}

const text = (res) => (res.content || []).filter((c) => c.type === "text").map((c) => c.text).join("");

const transport = new StdioClientTransport({
  command: process.env.SANDCELL_MCP_COMMAND,
  args: JSON.parse(process.env.SANDCELL_MCP_ARGS || "[]"),
  env: JSON.parse(process.env.SANDCELL_MCP_ENV || "{}"),
  stderr: "inherit",
});
const client = new Client({ name: "sandcell-ts-codemode", version: "1.0.0" }, { capabilities: { elicitation: {} } });
const asked = [];
client.setRequestHandler(ElicitRequestSchema, async (req) => {
  asked.push(req.params.message);
  return { action: "accept", content: { calls: 20 } };
});
await client.connect(transport);

const { tools } = await client.listTools();
const runPython = tools.find((t) => t.name === "run_python");
check(runPython && runPython.description.includes("- memory.create_entities [writes]"), "run_python lists the guest tools", runPython);

const res = await client.callTool({ name: "run_python", arguments: { code: [
  "from sandcell.tools import memory",
  "for i in range(20):",
  "    memory.create_entities(entities=[{'name': 'ts%d' % i, 'entityType': 't', 'observations': []}])",
  "print(len(memory.read_graph()['entities']))",
].join("\n") } });
check(!res.isError && text(res).includes("\n20\n"), "the program's 20 writes", res);
check(asked.length === 1 && asked[0].includes("memory.create_entities") && asked[0].includes("for i in range(20):"), "asked once", asked);
await client.close();
console.log("ok");
