/**
 * Sandcell as the Vercel AI SDK's sandbox (`ai` 7, `experimental_sandbox`): a
 * {@link SandcellSandbox} is an interpreter session with its workspace, whose files the
 * SDK's sandbox methods read and write, and {@link sandcellTools} give a model
 * run_python (a cell of that session) and file tools.
 *
 * Sandcell offers Python and files, not a shell: `run` and `spawn` reject with
 * {@link ShellNotOffered}, whose message names what is offered.
 *
 * ```ts
 * import { generateText, isStepCount } from "ai";
 * import { SandcellSandbox, sandcellTools } from "sandcell-ai-sdk";
 * const sandbox = await SandcellSandbox.create();           // $SANDCELL_SOCKET, or SANDCELL_URL and SANDCELL_TOKEN
 * const { text } = await generateText({
 *   model, tools: sandcellTools(), experimental_sandbox: sandbox,
 *   instructions: sandbox.description, prompt: "Plot sales.csv by month",
 *   stopWhen: isStepCount(10),
 * });
 * await sandbox.close();
 * ```
 */
import { tool, type Experimental_SandboxSession, type Experimental_SandboxFileStat,
  type Experimental_SandboxDirectoryEntry } from "ai";
import { z } from "zod";
import { AgentSession, Client, FileTooLarge, NotFound, ProblemError, NO_SHELL, runPythonDescription, workspacePath,
  statPath, listDirectory, type Session, type AgentSessionOptions, type CellReport } from "sandcell";

type SandboxSession = Experimental_SandboxSession;
type Options<K extends keyof SandboxSession> = SandboxSession[K] extends (o: infer O) => unknown ? O : never;

/** The error of `run` and `spawn`: Sandcell has no shell; its message names what it has. */
export class ShellNotOffered extends Error {
  constructor(command?: string) {
    super(command ? `${NO_SHELL} (refused: ${JSON.stringify(command.slice(0, 200))})` : NO_SHELL);
    this.name = "ShellNotOffered";
  }
}

/** How a {@link SandcellSandbox} is made. */
export interface SandcellSandboxOptions extends AgentSessionOptions {
  /** the daemon's client; by default one from the environment (SANDCELL_SOCKET, or SANDCELL_URL and SANDCELL_TOKEN) */
  client?: Client;
}

/** The read_file tool's bounds: a file over maxBytes is not read, an answer over maxChars is cut. */
const READ_TOOL = { maxBytes: 1 << 20, maxChars: 100_000 };

/**
 * An interpreter session and its workspace as an AI SDK sandbox. Paths are relative
 * to /ws (the workspace, where Python starts) or absolute under /ws; any other path
 * is outside the sandbox and rejects.
 */
export class SandcellSandbox implements SandboxSession {
  readonly description: string;

  private constructor(readonly client: Client, private readonly agent: AgentSession) {
    this.description = `You work in a Sandcell sandbox: ${agent.describe()}`;
  }

  /** Opens a session (on a new workspace unless options.workspace names one), or wraps options.session. */
  static async create(options: SandcellSandboxOptions = {}): Promise<SandcellSandbox> {
    const { client: given, ...open } = options;
    const client = given ?? new Client();
    return new SandcellSandbox(client, await AgentSession.open(client, open, "/ws"));
  }

  /** the session cells run in now (a lost one is replaced) */
  get session(): Session {
    return this.agent.session;
  }

  /** the session's id */
  get id(): string {
    return this.agent.session.id;
  }

  /** the workspace's id */
  get workspace(): string {
    return this.agent.workspace;
  }

  /** run_python's description for this sandbox's backend. */
  get runPythonDescription(): string {
    return this.agent.runPythonDescription();
  }

  /**
   * Runs Python as the session's next cell (after any asked before it); the report is
   * what a model reads, and is never an exception.
   */
  runPython(code: string): Promise<CellReport> {
    return this.agent.run(code);
  }

  /** Closes the session(s) it opened, and deletes the workspace it made unless kept. */
  close(): Promise<void> {
    return this.agent.close();
  }

  /**
   * A text file for a model: at most READ_TOOL.maxBytes read, lines startLine to
   * endLine, cut at READ_TOOL.maxChars; what cannot be shown as text is said.
   */
  async readForModel(path: string, startLine?: number, endLine?: number): Promise<{ content: string } | { error: string }> {
    let bytes: Uint8Array;
    try {
      bytes = await this.client.readFile(this.workspace, this.path(path), { maxBytes: READ_TOOL.maxBytes });
    } catch (e) {
      if (e instanceof NotFound) return { error: `${path}: no such file` };
      if (e instanceof FileTooLarge) return { error: `${path}: ${e.size} bytes or more, over the ${READ_TOOL.maxBytes} this tool reads; read parts of it with run_python` };
      if (e instanceof ProblemError || e instanceof Error) return { error: `${path}: ${e.message}` };
      throw e;
    }
    let text: string;
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    } catch {
      return { error: `${path}: binary (${bytes.byteLength} bytes), not text; look at it with run_python` };
    }
    return { content: cutText(lineRange(text, startLine, endLine), READ_TOOL.maxChars) };
  }

  private path(p: string): string {
    return workspacePath(p, "/ws");
  }

  readonly readBinaryFile = async ({ path }: Options<"readBinaryFile">): Promise<Uint8Array | null> => {
    try {
      return await this.client.readFile(this.workspace, this.path(path));
    } catch (e) {
      if (e instanceof NotFound) return null;
      throw e;
    }
  };

  readonly readFile = async (o: Options<"readFile">): Promise<ReadableStream<Uint8Array> | null> => {
    const bytes = await this.readBinaryFile(o);
    if (bytes === null) return null;
    return new ReadableStream({ start(c) { c.enqueue(bytes); c.close(); } });
  };

  readonly readTextFile = async ({ path, encoding = "utf-8", startLine, endLine, abortSignal }: Options<"readTextFile">): Promise<string | null> => {
    const bytes = await this.readBinaryFile({ path, abortSignal });
    if (bytes === null) return null;
    return lineRange(new TextDecoder(encoding).decode(bytes), startLine, endLine);
  };

  readonly writeBinaryFile = async ({ path, content }: Options<"writeBinaryFile">): Promise<void> => {
    await this.client.writeFile(this.workspace, this.path(path), content);
  };

  readonly writeFile = async ({ path, content, abortSignal }: Options<"writeFile">): Promise<void> => {
    // The client sends a body whole; the workspace's quota bounds what it may hold.
    const chunks: Uint8Array[] = [];
    const reader = content.getReader();
    for (;;) {
      abortSignal?.throwIfAborted();
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
    }
    await this.writeBinaryFile({ path, content: Buffer.concat(chunks) });
  };

  readonly writeTextFile = async ({ path, content, encoding = "utf-8" }: Options<"writeTextFile">): Promise<void> => {
    if (!/^utf-?8$/i.test(encoding)) throw new Error(`${encoding}: only UTF-8 text is written; write bytes with writeBinaryFile`);
    await this.writeBinaryFile({ path, content: new TextEncoder().encode(content) });
  };

  readonly stat = async ({ path }: Options<"stat">): Promise<Experimental_SandboxFileStat | null> => {
    const e = await statPath(this.client, this.workspace, this.path(path));
    if (!e) return null;
    return { type: e.type === "dir" ? "directory" : e.type === "file" ? "file" : "other", size: e.size };
  };

  readonly listDirectory = async ({ path }: Options<"listDirectory">): Promise<Experimental_SandboxDirectoryEntry[] | null> => {
    const entries = await listDirectory(this.client, this.workspace, this.path(path));
    return entries?.map((e) => ({
      name: e.path.slice(e.path.lastIndexOf("/") + 1),
      type: e.type === "dir" ? "directory" : e.type === "file" || e.type === "symlink" ? e.type : "other",
    })) ?? null;
  };

  readonly deleteFile = async ({ path }: Options<"deleteFile">): Promise<boolean> => {
    const p = this.path(path);
    const e = await statPath(this.client, this.workspace, p);
    if (!e) return false;
    if (e.type === "dir") throw new Error(`${path}: a directory; deleteFile deletes files`);
    try {
      await this.client.deleteFile(this.workspace, p);
      return true;
    } catch (err) {
      if (err instanceof NotFound) return false;
      throw err;
    }
  };

  readonly run = async ({ command }: Options<"run">): Promise<never> => {
    throw new ShellNotOffered(command);
  };

  readonly spawn = (async ({ command }: { command: string }) => {
    throw new ShellNotOffered(command);
  }) as SandboxSession["spawn"];
}

/**
 * The tools a model uses a Sandcell sandbox with: run_python (a cell of the session),
 * read_file, write_file and list_directory. Each uses the sandbox the SDK passes
 * (`experimental_sandbox`), else the one given here. run_python needs a
 * {@link SandcellSandbox}; the file tools work with any AI SDK sandbox.
 */
export function sandcellTools(sandbox?: SandcellSandbox) {
  const current = (given: SandboxSession | undefined): SandboxSession => {
    const s = given ?? sandbox;
    if (!s) throw new Error("no sandbox: pass experimental_sandbox to generateText or streamText, or a SandcellSandbox to sandcellTools");
    return s;
  };
  return {
    run_python: tool({
      description: sandbox?.runPythonDescription ?? runPythonDescription(),
      inputSchema: z.object({ code: z.string().describe("Python source to run as the session's next cell") }),
      execute: async ({ code }, { experimental_sandbox }) => {
        const s = current(experimental_sandbox);
        if (!(s instanceof SandcellSandbox)) throw new Error("run_python needs a SandcellSandbox as experimental_sandbox");
        return s.runPython(code);
      },
      toModelOutput: ({ output }) => ({ type: "text", value: output.text }),
    }),
    read_file: tool({
      description: `Read a text file of the workspace (/ws), optionally lines startLine to endLine (1-based, inclusive); files over ${READ_TOOL.maxBytes} bytes and binary files are refused (use run_python).`,
      inputSchema: z.object({
        path: z.string().describe("path relative to /ws"),
        startLine: z.number().int().positive().optional(),
        endLine: z.number().int().positive().optional(),
      }),
      execute: async ({ path, startLine, endLine }, { experimental_sandbox }) => {
        const s = current(experimental_sandbox);
        if (s instanceof SandcellSandbox) return s.readForModel(path, startLine, endLine);
        const text = await s.readTextFile({ path, startLine, endLine });
        return text === null ? { error: `${path}: no such file` } : { content: cutText(text, READ_TOOL.maxChars) };
      },
    }),
    write_file: tool({
      description: "Write a text file in the workspace (/ws), creating directories and replacing the file if it exists.",
      inputSchema: z.object({ path: z.string().describe("path relative to /ws"), content: z.string() }),
      execute: async ({ path, content }, { experimental_sandbox }) => {
        await current(experimental_sandbox).writeTextFile({ path, content });
        return { written: path, bytes: Buffer.byteLength(content) };
      },
    }),
    list_directory: tool({
      description: "List one directory of the workspace (/ws): names and types, not descending.",
      inputSchema: z.object({ path: z.string().default(".").describe("directory relative to /ws") }),
      execute: async ({ path }, { experimental_sandbox }) => {
        const entries = await current(experimental_sandbox).listDirectory({ path });
        return entries === null ? { error: `${path}: no such directory` } : { entries };
      },
    }),
  };
}

// lineRange is lines startLine to endLine (1-based, inclusive) of text, or all of it.
function lineRange(text: string, startLine?: number, endLine?: number): string {
  if (startLine === undefined && endLine === undefined) return text;
  const lines = text.split("\n");
  return lines.slice(Math.max(0, (startLine ?? 1) - 1), endLine ?? lines.length).join("\n");
}

// cutText keeps text within max characters, saying how much is left out.
function cutText(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max)}\n[cut: ${text.length - max} more characters; read a line range]`;
}

export { ProblemError };
