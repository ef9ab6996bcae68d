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
import { Client, NotFound, ProblemError, RUN_PYTHON_DESCRIPTION, NO_SHELL, runForAgent, workspacePath, statPath,
  listDirectory, openAgentSession, type Session, type AgentSessionOptions, type CellReport } from "sandcell";

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
  /** a cell's report to the model is cut at this many characters (default 20,000) */
  maxOutputChars?: number;
}

/**
 * An interpreter session and its workspace as an AI SDK sandbox. Paths are relative
 * to /ws (the workspace, where Python starts) or absolute under /ws; any other path
 * is outside the sandbox and rejects.
 */
export class SandcellSandbox implements SandboxSession {
  readonly description: string;

  private constructor(readonly client: Client, readonly session: Session,
    private readonly release: () => Promise<void>, private readonly maxOutputChars?: number) {
    this.description =
      "You work in a Sandcell sandbox: Python 3 in a persistent interpreter session (the run_python tool), " +
      "with one directory, /ws (the workspace), where your files are and where Python starts. " +
      "There is no shell, no subprocess and no network. Paths are relative to /ws.";
  }

  /** Opens a session (a new workspace unless options.workspace names one), or wraps options.session. */
  static async create(options: SandcellSandboxOptions = {}): Promise<SandcellSandbox> {
    const { client: given, maxOutputChars, ...open } = options;
    const client = given ?? new Client();
    const { session, close } = await openAgentSession(client, open);
    return new SandcellSandbox(client, session, close, maxOutputChars);
  }

  /** the session's id */
  get id(): string {
    return this.session.id;
  }

  /** the workspace's id */
  get workspace(): string {
    return this.session.workspace;
  }

  /** Runs Python as the session's next cell; the report is what a model reads. */
  runPython(code: string): Promise<CellReport> {
    return runForAgent(this.session, code, { maxChars: this.maxOutputChars });
  }

  /** Closes the session it opened, and deletes the workspace it made unless kept. */
  close(): Promise<void> {
    return this.release();
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
    const text = new TextDecoder(encoding).decode(bytes);
    if (startLine === undefined && endLine === undefined) return text;
    const lines = text.split("\n");
    return lines.slice(Math.max(0, (startLine ?? 1) - 1), endLine ?? lines.length).join("\n");
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
      description: RUN_PYTHON_DESCRIPTION,
      inputSchema: z.object({ code: z.string().describe("Python 3 source to run as the session's next cell") }),
      execute: async ({ code }, { experimental_sandbox }) => {
        const s = current(experimental_sandbox);
        if (!(s instanceof SandcellSandbox)) throw new Error("run_python needs a SandcellSandbox as experimental_sandbox");
        return s.runPython(code);
      },
      toModelOutput: ({ output }) => ({ type: "text", value: output.text }),
    }),
    read_file: tool({
      description: "Read a text file of the workspace (/ws), optionally lines startLine to endLine (1-based, inclusive).",
      inputSchema: z.object({
        path: z.string().describe("path relative to /ws"),
        startLine: z.number().int().positive().optional(),
        endLine: z.number().int().positive().optional(),
      }),
      execute: async (input, { experimental_sandbox }) => {
        const text = await current(experimental_sandbox).readTextFile(input);
        return text === null ? { error: `${input.path}: no such file` } : { content: text };
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

export { ProblemError };
