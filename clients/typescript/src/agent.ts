/**
 * What agent frameworks' providers share (sandcell-ai-sdk, sandcell-deepagents): the
 * run_python tool's description, a cell's answer as the text a model reads, and the
 * workspace seen as directories (stat, one directory's entries) over the listing.
 */
import type { Client, Session } from "./client.js";
import { ApprovalRequired, ProblemError } from "./errors.js";
import { outputBytes, type CellAnswer, type FileEntry, type SessionOptions } from "./types.js";

/**
 * The run_python tool's description, as a model should read it: what the sandbox
 * offers (Python and the workspace's files, at /ws) and what it does not (a shell, a
 * network).
 */
export const RUN_PYTHON_DESCRIPTION =
  "Run Python 3 code in a persistent interpreter session inside a hardened sandbox. " +
  "Variables, imports and functions persist from one call to the next. The working " +
  "directory is /ws, the workspace: the files you read and write with the file tools " +
  "are there, and it is the only directory the code can touch. There is no shell, no " +
  "subprocess and no network: do the work in Python. Returns stdout, stderr, the last " +
  "expression's value, displayed plots and tables (saved as files in /ws), and the " +
  "error with its traceback if the code raised.";

/**
 * The words a shell-shaped call fails with: Sandcell offers Python and files, never a
 * shell, so a command is refused rather than imitated.
 */
export const NO_SHELL =
  "Sandcell runs Python, not shell commands: there is no shell, no subprocess and no " +
  "network in its sandbox. Use the run_python tool (Python 3 with the workspace at " +
  "/ws) and the file tools instead.";

/** A cell's answer as a model reads it. */
export interface CellReport {
  /** stdout, stderr, value, displays and error as labelled text, cut to maxChars */
  text: string;
  /** false when the code raised, or the cell ended other than by finishing */
  ok: boolean;
  /** the workspace's paths (from /ws) of the files the cell displayed, PNGs first */
  displays: { path: string; type: string; width?: number; height?: number }[];
  /** set when the cell waits for a person: the approval's id */
  approval?: string;
}

/**
 * Runs code as a cell of session and reports it as a model reads it. A cell held for
 * approval, a cell that ended by a limit and a lost session are reports too (ok
 * false), not exceptions: the model must learn what happened. Other errors (the
 * daemon unreachable, the caller refused) are thrown.
 */
export async function runForAgent(session: Session, code: string, options: { maxChars?: number } = {}): Promise<CellReport> {
  let answer: CellAnswer;
  try {
    answer = await session.run(code);
  } catch (e) {
    if (e instanceof ApprovalRequired) {
      return {
        ok: false, displays: [], approval: e.approvalId,
        text: `This code waits for a person's approval (approval ${e.approvalId}); it has not run. ` +
          "Tell the user; once it is approved, the same code may be run again.",
      };
    }
    if (e instanceof ProblemError && (e.status === 410 || e.code === "session_lost")) {
      return { ok: false, displays: [], text: `The interpreter session ended (${e.message}): its variables are gone.` };
    }
    throw e;
  }
  return cellReport(answer, options);
}

/**
 * A cell's answer as labelled text: stdout, stderr, the value, displays, and how it
 * ended when not by finishing. maxChars (default 20,000 characters) bounds the text;
 * what is cut is said.
 */
export function cellReport(answer: CellAnswer, options: { maxChars?: number } = {}): CellReport {
  const r = answer.result;
  const parts: string[] = [];
  const text = (stream: "stdout" | "stderr") => new TextDecoder().decode(outputBytes(r, stream));
  const out = text("stdout");
  const err = text("stderr");
  if (out) parts.push(`stdout:\n${out}${r.stdout_truncated ? "\n[stdout cut at its limit]" : ""}`);
  if (err) parts.push(`stderr:\n${err}${r.stderr_truncated ? "\n[stderr cut at its limit]" : ""}`);
  if (answer.value !== undefined && answer.value !== "None") {
    parts.push(`value: ${answer.value}${answer.value_truncated ? " [cut]" : ""}`);
  }
  const displays = (r.displays ?? [])
    .map((d) => ({ path: `/ws/${d.path}`, type: d.type, width: d.width, height: d.height, text: d.text }))
    .sort((a, b) => Number(b.type === "image/png") - Number(a.type === "image/png"));
  for (const d of displays) {
    const size = d.width && d.height ? ` ${d.width}x${d.height}` : "";
    parts.push(d.text !== undefined && d.type !== "text/html" ? `display (${d.type}) ${d.path}:\n${d.text}` : `display (${d.type}${size}) saved at ${d.path}`);
  }
  const finished = r.reason === "exited" && r.exit_code === 0;
  if (r.reason !== "exited") parts.push(`ended: ${r.reason}${r.diagnostics?.length ? ` (${r.diagnostics.join("; ")})` : ""}`);
  if (answer.state === "rolled_back") parts.push("the session was rolled back to before this code: its changes to variables are undone");
  if (answer.state === "lost") parts.push("the interpreter session was lost: its variables are gone");
  if (!parts.length) parts.push("(no output)");
  let all = parts.join("\n\n");
  const max = options.maxChars ?? 20_000;
  if (all.length > max) all = `${all.slice(0, max)}\n[cut: ${all.length - max} more characters]`;
  return { text: all, ok: finished && answer.state !== "lost", displays: displays.map(({ text: _, ...d }) => d) };
}

/**
 * A workspace path from a path an agent gives: relative to the workspace, or absolute
 * under root (the guest's "/ws", or "/" where a framework's files start there).
 * Throws Error naming the workspace for a path outside it.
 */
export function workspacePath(path: string, root: "/ws" | "/"): string {
  let p = path.trim();
  if (p.startsWith("/")) {
    if (root === "/ws") {
      if (p !== "/ws" && !p.startsWith("/ws/")) {
        throw new Error(`${path}: outside the workspace; the sandbox has only /ws (the workspace), where relative paths start`);
      }
      p = p.slice(3);
    }
  }
  const parts: string[] = [];
  for (const seg of p.split("/")) {
    if (seg === "" || seg === ".") continue;
    if (seg === "..") {
      if (!parts.length) throw new Error(`${path}: outside the workspace`);
      parts.pop();
      continue;
    }
    parts.push(seg);
  }
  return parts.join("/");
}

/**
 * The entry of a workspace path ("" is the workspace itself, a directory), or null
 * when nothing has that name. Reads the workspace's listing.
 */
export async function statPath(client: Client, workspace: string, path: string): Promise<FileEntry | null> {
  if (path === "") return { path: "", type: "dir", size: 0 };
  return (await client.listFiles(workspace)).find((f) => f.path === path) ?? null;
}

/**
 * The entries directly inside a workspace directory ("" is its root), with their
 * paths from the workspace's root; null when the directory does not exist. Throws
 * Error when the path names something other than a directory.
 */
export async function listDirectory(client: Client, workspace: string, dir: string): Promise<FileEntry[] | null> {
  const files = await client.listFiles(workspace);
  if (dir !== "") {
    const self = files.find((f) => f.path === dir);
    if (!self) return null;
    if (self.type !== "dir") throw new Error(`${dir}: not a directory`);
  }
  const prefix = dir === "" ? "" : `${dir}/`;
  return files.filter((f) => f.path.startsWith(prefix) && f.path.length > prefix.length && !f.path.slice(prefix.length).includes("/"));
}

/** How a provider's session is had: opened on a workspace, or one already open. */
export interface AgentSessionOptions extends SessionOptions {
  /** an open session to use instead of opening one (closing then leaves it open) */
  session?: Session;
  /** keep the workspace after closing, when opening made it (default: delete it) */
  keepWorkspace?: boolean;
}

/**
 * A session whose workspace the caller reaches through the files API too (a session
 * opened without one has a private workspace no call can name): options.session as
 * it is, or a new session on options.workspace, or on a workspace made for it.
 * close() closes what this opened and deletes what it made, unless kept.
 */
export async function openAgentSession(client: Client, options: AgentSessionOptions = {}):
  Promise<{ session: Session; close: () => Promise<void> }> {
  const { session: given, keepWorkspace, ...open } = options;
  if (given) return { session: given, close: async () => {} };
  const made = open.workspace ? undefined : (await client.createWorkspace()).id;
  const drop = async () => {
    if (made === undefined || keepWorkspace) return;
    try {
      await client.deleteWorkspace(made);
    } catch (e) {
      if (!(e instanceof ProblemError) || e.status !== 404) throw e;
    }
  };
  let session: Session;
  try {
    session = await client.openSession({ ...open, workspace: open.workspace ?? made });
  } catch (e) {
    await drop().catch(() => {});
    throw e;
  }
  return { session, close: async () => { await session.close(); await drop(); } };
}
