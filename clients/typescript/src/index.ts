/**
 * Sandcell's TypeScript client: runs, interpreter sessions, workspaces and files, SQL,
 * approvals and tools of a Sandcell daemon, over its Unix socket or over TCP with a
 * bearer token.
 *
 * ```ts
 * import { Client } from "sandcell";
 * const sc = new Client();                  // $SANDCELL_SOCKET or /run/sandcell/sandcell.sock
 * const run = await sc.run("print(6 * 7)");
 * console.log(run.result?.stdout);          // 42
 * ```
 */
export { Client, Session, DEFAULT_SOCKET, type ClientOptions } from "./client.js";
export * from "./errors.js";
export * from "./types.js";
export { AgentSession, describeSandbox, runPythonDescription, NO_SHELL, cellReport, workspacePath, statPath, listDirectory,
  type CellReport, type AgentSessionOptions } from "./agent.js";
