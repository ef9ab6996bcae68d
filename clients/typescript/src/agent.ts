/**
 * What agent frameworks' providers share (sandcell-ai-sdk, sandcell-deepagents): the
 * run_python tool's description, a cell's answer as the text a model reads, and the
 * workspace seen as directories (stat, one directory's entries) over the listing.
 */
import type { Client, Session } from "./client.js";
import { ApprovalRequired, ProblemError, SandcellError } from "./errors.js";
import { outputBytes, type CellAnswer, type FileEntry, type SessionOptions } from "./types.js";

/**
 * What the sandbox has, for a model's instructions and the run_python tool's
 * description: the backend's Python, the workspace at /ws (or, for a framework whose
 * file tools start at "/", that "/" is Python's /ws), and no shell or network.
 */
export function describeSandbox(options: { backend?: string; root?: "/ws" | "/" } = {}): string {
  const python = options.backend === "native"
    ? "Python 3.13 with numpy, pandas, matplotlib (plots are saved as files), scipy, scikit-learn, seaborn and statsmodels"
    : options.backend === "wasm" ? "Python 3 with its standard library only (no third-party packages)" : "Python 3";
  const files = options.root === "/"
    ? "The file tools' / is /ws in Python, its working directory, so relative paths mean the same in both."
    : "Paths are relative to /ws, Python's working directory.";
  return `${python}, in a persistent interpreter session inside a hardened sandbox: variables, imports and ` +
    "functions persist from one call to the next. Files you keep go in /ws, the workspace; the rest of the " +
    `filesystem is read-only or scratch. ${files} There is no shell, no subprocess and no network: do the ` +
    "work in Python.";
}

/**
 * The run_python tool's description, as a model should read it (describeSandbox
 * says what the sandbox has).
 */
export function runPythonDescription(options: { backend?: string; root?: "/ws" | "/" } = {}): string {
  return `Run Python code. ${describeSandbox(options)} Returns stdout, stderr, the last expression's value, ` +
    "displayed plots and tables (saved as files in the workspace), and the error with its traceback if the code raised.";
}

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
  /** stdout, stderr, value, displays, error and how it ended, as labelled text within maxChars */
  text: string;
  /** false when the code raised or exited non-zero, the cell ended other than by finishing, or did not run */
  ok: boolean;
  /** the files the cell displayed (paths from the report's root), PNGs first */
  displays: { path: string; type: string; width?: number; height?: number }[];
  /** set when the code waits for a person: the approval's id */
  approval?: string;
}

/** How an {@link AgentSession} is had: opened on a workspace, or one already open. */
export interface AgentSessionOptions extends SessionOptions {
  /** an open session to use instead of opening one (closing then leaves it open) */
  session?: Session;
  /** keep the workspace after closing, when opening made it (default: delete it) */
  keepWorkspace?: boolean;
  /** a cell's report is cut to this many characters (default 20,000) */
  maxOutputChars?: number;
}

/**
 * An interpreter session for a model's tools, on a workspace the caller reaches
 * through the files API too (a session opened without one has a private workspace no
 * call can name). Cells run one at a time, in the order asked (frameworks run one
 * step's tool calls at once; a session runs one cell). Code held for a person's
 * approval runs when the model asks for the same code again after the approval. A
 * session that is lost or gone (the daemon restarted, an idle timeout) is replaced
 * by a new one on the same workspace, and the report says the variables are gone.
 */
export class AgentSession {
  private queue: Promise<unknown> = Promise.resolve();
  private readonly pending = new Map<string, string>();
  // the sessions this opened: closed with it
  private readonly owned: Session[] = [];

  private constructor(readonly client: Client, private current: Session, private readonly open: SessionOptions,
    private readonly made: string | undefined, private readonly options: AgentSessionOptions, private readonly root: "/ws" | "/") {}

  /**
   * options.session as it is, or a new session on options.workspace, or on a
   * workspace made for it. root is where the framework's paths start ("/ws", or "/"
   * for one whose "/" is the workspace), for the paths reports name.
   */
  static async open(client: Client, options: AgentSessionOptions = {}, root: "/ws" | "/" = "/ws"): Promise<AgentSession> {
    const { session: given, keepWorkspace: _k, maxOutputChars: _m, ...open } = options;
    if (given) return new AgentSession(client, given, { ...open, workspace: given.workspace }, undefined, options, root);
    const made = open.workspace ? undefined : (await client.createWorkspace()).id;
    try {
      const s = await client.openSession({ ...open, workspace: open.workspace ?? made });
      const a = new AgentSession(client, s, { ...open, workspace: s.workspace }, made, options, root);
      a.owned.push(s);
      return a;
    } catch (e) {
      if (made !== undefined) await client.deleteWorkspace(made).catch(() => {});
      throw e;
    }
  }

  /** the session cells run in now */
  get session(): Session {
    return this.current;
  }

  /** the workspace's id */
  get workspace(): string {
    return this.open.workspace ?? this.current.workspace;
  }

  // the backend the session runs on, as its contract says
  private get backend(): string | undefined {
    return this.current.info.enforcement?.backend ?? this.open.backend;
  }

  /** What the sandbox has, for a model's instructions. */
  describe(): string {
    return describeSandbox({ backend: this.backend, root: this.root });
  }

  /** The run_python tool's description. */
  runPythonDescription(): string {
    return runPythonDescription({ backend: this.backend, root: this.root });
  }

  /**
   * Runs code as the session's next cell, after those asked before it, and reports
   * it as a model reads it. Nothing is thrown: a refusal, a daemon out of reach and a
   * lost session are reports (ok false) the model can act on.
   */
  run(code: string): Promise<CellReport> {
    const next = this.queue.then(() => this.runNow(code));
    this.queue = next.catch(() => {});
    return next;
  }

  private async runNow(code: string): Promise<CellReport> {
    let note = "";
    for (let attempt = 0; ; attempt++) {
      const approval = this.pending.get(code);
      try {
        const answer = await this.current.run(code, approval ? { approval } : {});
        this.pending.delete(code);
        const r = cellReport(answer, { maxChars: this.options.maxOutputChars, root: this.root });
        return note ? { ...r, text: `${note}\n\n${r.text}` } : r;
      } catch (e) {
        if (e instanceof ApprovalRequired) {
          this.pending.set(code, e.approvalId);
          return waiting(e.approvalId);
        }
        if (approval && e instanceof ProblemError && (e.code === "approval_invalid" || e.status === 404)) {
          const state = (e.problem.approval as { state?: string } | undefined)?.state;
          if (state === "pending") return waiting(approval);
          this.pending.delete(code);
          // An approval the daemon no longer knows (or a session gone): ask again without it.
          if (e.status === 404 && attempt < 2) continue;
          return { ok: false, displays: [], text: `The approval of this code (${approval}) is not usable: ${e.message}. It has not run.` };
        }
        const lost = e instanceof ProblemError && (e.status === 410 || (e.status === 404 && e.code === "not_found"));
        if (lost && !note && attempt < 2) {
          try {
            await this.reopen();
          } catch (err) {
            return { ok: false, displays: [], text: `The interpreter session ended (${e.message}), and a new one could not be opened: ${message(err)}` };
          }
          note = "The interpreter session had ended (the daemon restarted or it sat idle), so this ran in a new one: " +
            "variables, imports and functions from before are gone; the files in the workspace are kept.";
          continue;
        }
        if (e instanceof ProblemError || e instanceof SandcellError) {
          return { ok: false, displays: [], text: `Sandcell did not run this code: ${e.message}` };
        }
        throw e;
      }
    }
  }

  private async reopen(): Promise<void> {
    this.current = await this.client.openSession(this.open);
    this.owned.push(this.current);
  }

  /** Closes the sessions this opened (the first, and any that replaced a lost one) and deletes the workspace it made, unless kept. */
  async close(): Promise<void> {
    await this.queue;
    for (const s of this.owned.splice(0)) await s.close();
    if (this.made !== undefined && !this.options.keepWorkspace) {
      try {
        await this.client.deleteWorkspace(this.made);
      } catch (e) {
        if (!(e instanceof ProblemError) || e.status !== 404) throw e;
      }
    }
  }
}

function waiting(id: string): CellReport {
  return {
    ok: false, displays: [], approval: id,
    text: `This code waits for a person's approval (approval ${id}); it has not run. Tell the user. Once it is ` +
      "approved, call run_python again with exactly the same code and it runs (files it reads must not change meanwhile).",
  };
}

const message = (e: unknown): string => (e instanceof Error ? e.message : String(e));

// cut keeps text within max characters: its head and its tail, saying what is left out.
function cut(text: string, max: number): string {
  if (text.length <= max) return text;
  const head = Math.floor(max / 2);
  return `${text.slice(0, head)}\n[... ${text.length - max} characters cut ...]\n${text.slice(text.length - (max - head))}`;
}

/**
 * A cell's answer as labelled text: stdout, stderr, the value, displays, and how it
 * ended when not by finishing (exit status, limit, rollback). maxChars (default
 * 20,000) bounds the text: stdout and stderr are cut in their middle (the end of a
 * traceback is kept), the lines saying how the cell ended never. root is where the
 * framework's paths start, for the displays' paths ("/ws" by default).
 */
export function cellReport(answer: CellAnswer, options: { maxChars?: number; root?: "/ws" | "/" } = {}): CellReport {
  const r = answer.result;
  const max = Math.max(options.maxChars ?? 20_000, 1_000);
  const prefix = options.root === "/" ? "/" : "/ws/";
  const text = (stream: "stdout" | "stderr") => new TextDecoder().decode(outputBytes(r, stream));
  const displays = (r.displays ?? [])
    .map((d) => ({ path: `${prefix}${d.path}`, type: d.type, width: d.width, height: d.height, text: d.text }))
    .sort((a, b) => Number(b.type === "image/png") - Number(a.type === "image/png"));
  // What is never cut: how the cell ended.
  const ending: string[] = [];
  const finished = r.reason === "exited" && r.exit_code === 0;
  if (r.reason !== "exited") ending.push(`ended: ${r.reason}`);
  else if (r.exit_code !== 0) ending.push(`exit status ${r.exit_code}`);
  if (r.diagnostics?.length) ending.push(`diagnostics: ${r.diagnostics.join("; ")}`);
  if (answer.state === "rolled_back") ending.push("the session was rolled back to before this code: its changes to variables are undone");
  if (answer.state === "lost") ending.push("the interpreter session was lost: its variables are gone");
  const shown: string[] = [];
  for (const d of displays) {
    const size = d.width && d.height ? ` ${d.width}x${d.height}` : "";
    shown.push(d.text !== undefined && d.type !== "text/html" ? `display (${d.type}) ${d.path}:\n${cut(d.text, 2_000)}` : `display (${d.type}${size}) saved at ${d.path}`);
  }
  const value = answer.value !== undefined && answer.value !== "None" ? `value: ${cut(answer.value, 4_000)}${answer.value_truncated ? " [cut]" : ""}` : "";
  const fixed = [value, ...shown, ...ending].filter(Boolean).join("\n\n");
  // stdout and stderr share what is left, stderr (the traceback) first.
  const room = Math.max(max - fixed.length, 400);
  const err = text("stderr");
  const errText = err ? cut(err, Math.max(Math.floor(room / 2), room - text("stdout").length)) : "";
  const out = text("stdout");
  const outText = out ? cut(out, Math.max(room - errText.length, 200)) : "";
  const parts: string[] = [];
  if (outText) parts.push(`stdout:\n${outText}${r.stdout_truncated ? "\n[stdout cut at its limit]" : ""}`);
  if (errText) parts.push(`stderr:\n${errText}${r.stderr_truncated ? "\n[stderr cut at its limit]" : ""}`);
  if (fixed) parts.push(fixed);
  if (!parts.length) parts.push("(no output)");
  return {
    text: parts.join("\n\n"),
    ok: finished && answer.state !== "lost" && answer.state !== "rolled_back",
    displays: displays.map(({ text: _, ...d }) => d),
  };
}

/**
 * A workspace path ("" for its root) from a path an agent gives: relative to the
 * workspace, or absolute under /ws (Python's name for it), or, where root is "/" (a
 * framework whose files start there), absolute under "/". Throws Error naming the
 * workspace for a path outside it. (Where root is "/", a top-level directory named
 * "ws" is reached as /ws/ws: /ws is Python's name for the root.)
 */
export function workspacePath(path: string, root: "/ws" | "/"): string {
  let p = path;
  if (p.startsWith("/")) {
    if (p === "/ws" || p.startsWith("/ws/")) {
      p = p.slice(3);
    } else if (root === "/ws") {
      throw new Error(`${path}: outside the workspace; the sandbox has only /ws (the workspace), where relative paths start`);
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
