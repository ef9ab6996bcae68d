/**
 * Sandcell as a LangChain Deep Agents backend (`deepagents` 1.14): a
 * {@link SandcellBackend} keeps the agent's files (ls, read, write, edit, grep,
 * glob, delete, upload, download) in a workspace of a Sandcell interpreter session,
 * and {@link SandcellBackend.tools} give the agent run_python, a cell of that session.
 *
 * Sandcell offers Python and files, not a shell: the backend is not a Deep Agents
 * sandbox backend (it has no `execute`), so the agent is never offered a shell tool
 * that could only fail; run_python's description says what it has instead.
 *
 * ```ts
 * import { createDeepAgent } from "deepagents";
 * import { SandcellBackend } from "sandcell-deepagents";
 * const backend = await SandcellBackend.create();  // $SANDCELL_SOCKET, or SANDCELL_URL and SANDCELL_TOKEN
 * const agent = createDeepAgent({ model, backend, tools: backend.tools() });
 * await agent.invoke({ messages: [{ role: "user", content: "Summarise sales.csv" }] });
 * await backend.close();
 * ```
 */
import { tool, type StructuredToolInterface } from "@langchain/core/tools";
import { applyGrepMaxCount, normalizeReadPagination, type BackendProtocolV2, type DeleteResult, type EditResult,
  type FileDownloadResponse, type FileInfo, type FileUploadResponse, type GlobResult, type GrepMatch,
  type GrepResult, type LsResult, type ReadRawResult, type ReadResult, type WriteResult } from "deepagents";
import picomatch from "picomatch";
import { z } from "zod";
import { AgentSession, Client, Conflict, FileTooLarge, NotFound, ProblemError, workspacePath, listDirectory,
  type FileEntry, type Session, type AgentSessionOptions, type CellReport } from "sandcell";

/** How a {@link SandcellBackend} is made. */
export interface SandcellBackendOptions extends AgentSessionOptions {
  /** the daemon's client; by default one from the environment (SANDCELL_SOCKET, or SANDCELL_URL and SANDCELL_TOKEN) */
  client?: Client;
  /** read, readRaw, edit and grep leave files over this many bytes (default 16 MiB) to run_python, saying so */
  maxFileBytes?: number;
}

// Types Deep Agents' read tool shows as text (text/*, JSON, SVG); other UTF-8 files are text/plain.
const TEXT_TYPES: Record<string, string> = {
  md: "text/markdown", csv: "text/csv", tsv: "text/tab-separated-values", json: "application/json", py: "text/x-python",
  html: "text/html", xml: "text/xml", yaml: "text/yaml", yml: "text/yaml", svg: "image/svg+xml", js: "text/javascript",
};
// Binary types a model can be shown (images, PDF); any other binary file is described, not sent.
const SHOWN_TYPES: Record<string, string> = {
  png: "image/png", jpg: "image/jpeg", jpeg: "image/jpeg", gif: "image/gif", webp: "image/webp", pdf: "application/pdf",
};

function mimeOf(path: string, bytes: Uint8Array): { mimeType: string; text?: string } {
  const ext = path.slice(path.lastIndexOf(".") + 1).toLowerCase();
  if (SHOWN_TYPES[ext]) return { mimeType: SHOWN_TYPES[ext] };
  try {
    return { mimeType: TEXT_TYPES[ext] ?? "text/plain", text: new TextDecoder("utf-8", { fatal: true }).decode(bytes) };
  } catch {
    return { mimeType: "application/octet-stream" };
  }
}

const message = (e: unknown): string => (e instanceof Error ? e.message : String(e));

/**
 * A Deep Agents backend over a Sandcell interpreter session's workspace. The agent's
 * "/" is the workspace, which Python sees as /ws (its working directory, so relative
 * paths mean the same in both).
 */
export class SandcellBackend implements BackendProtocolV2 {
  private constructor(readonly client: Client, private readonly agent: AgentSession, private readonly maxFileBytes: number) {}

  /** Opens a session (on a new workspace unless options.workspace names one), or wraps options.session. */
  static async create(options: SandcellBackendOptions = {}): Promise<SandcellBackend> {
    const { client: given, maxFileBytes, ...open } = options;
    const client = given ?? new Client();
    return new SandcellBackend(client, await AgentSession.open(client, open, "/"), maxFileBytes ?? 16 << 20);
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

  /**
   * Runs Python as the session's next cell (after any asked before it); the report is
   * what a model reads, and is never an exception.
   */
  runPython(code: string): Promise<CellReport> {
    return this.agent.run(code);
  }

  /** The agent's tools beyond Deep Agents' own file tools: run_python. */
  tools(): StructuredToolInterface[] {
    return [
      tool(async ({ code }: { code: string }) => (await this.runPython(code)).text, {
        name: "run_python",
        description: this.agent.runPythonDescription(),
        schema: z.object({ code: z.string().describe("Python source to run as the session's next cell") }),
      }),
    ];
  }

  /** Closes the session(s) it opened, and deletes the workspace it made unless kept. */
  close(): Promise<void> {
    return this.agent.close();
  }

  private info(e: FileEntry): FileInfo {
    return e.type === "dir" ? { path: `/${e.path}/`, is_dir: true, size: 0 } : { path: `/${e.path}`, is_dir: false, size: e.size };
  }

  private async bytes(filePath: string): Promise<{ bytes: Uint8Array } | { error: string }> {
    try {
      return { bytes: await this.client.readFile(this.workspace, workspacePath(filePath, "/"), { maxBytes: this.maxFileBytes }) };
    } catch (e) {
      if (e instanceof NotFound) return { error: `File '${filePath}' not found` };
      if (e instanceof FileTooLarge) return { error: `'${filePath}' has ${e.size} bytes or more, over the ${this.maxFileBytes} the file tools read: work on it with run_python` };
      if (e instanceof Conflict) return { error: `'${filePath}' is not a regular file (${e.message})` };
      return { error: `Error reading file '${filePath}': ${message(e)}` };
    }
  }

  async ls(path: string): Promise<LsResult> {
    try {
      const entries = await listDirectory(this.client, this.workspace, workspacePath(path, "/"));
      if (entries === null) return { error: `Directory '${path}' not found` };
      return { files: entries.map((e) => this.info(e)).sort((a, b) => a.path.localeCompare(b.path)) };
    } catch (e) {
      return { error: `Error listing '${path}': ${message(e)}` };
    }
  }

  async read(filePath: string, offset = 0, limit = 500): Promise<ReadResult> {
    const got = await this.bytes(filePath);
    if ("error" in got) return got;
    const { mimeType, text } = mimeOf(filePath, got.bytes);
    if (text === undefined && mimeType === "application/octet-stream") {
      return { error: `'${filePath}' is binary (${got.bytes.byteLength} bytes), not text: look at it with run_python` };
    }
    if (text === undefined) return { content: got.bytes, mimeType };
    if (text.trim() === "") return { content: "System reminder: File exists but has empty contents", mimeType };
    const page = normalizeReadPagination(offset, limit);
    const lines = text.split("\n");
    const totalLines = lines[lines.length - 1] === "" ? lines.length - 1 : lines.length;
    if (page.offset >= totalLines) return { error: `Line offset ${page.offset} exceeds file length (${totalLines} lines)` };
    const end = Math.min(page.offset + page.limit, totalLines);
    return {
      content: lines.slice(page.offset, end).join("\n"), mimeType, totalLines,
      startLine: page.offset + 1, endLine: end, nextOffset: end < totalLines ? end : undefined,
    };
  }

  async readRaw(filePath: string): Promise<ReadRawResult> {
    const got = await this.bytes(filePath);
    if ("error" in got) return got;
    const { mimeType, text } = mimeOf(filePath, got.bytes);
    const now = new Date().toISOString();
    return { data: { content: text ?? got.bytes, mimeType, created_at: now, modified_at: now } };
  }

  async write(filePath: string, content: string): Promise<WriteResult> {
    try {
      await this.client.writeFile(this.workspace, workspacePath(filePath, "/"), content);
      return { path: filePath, filesUpdate: null };
    } catch (e) {
      return { error: `Error writing file '${filePath}': ${message(e)}` };
    }
  }

  async edit(filePath: string, oldString: string, newString: string, replaceAll = false): Promise<EditResult> {
    const got = await this.bytes(filePath);
    if ("error" in got) return got;
    const { text } = mimeOf(filePath, got.bytes);
    if (text === undefined) return { error: `'${filePath}' is not UTF-8 text; edit it with run_python` };
    if (oldString === "") {
      if (text !== "") return { error: "old_string is empty: give the text to replace" };
      const written = await this.write(filePath, newString);
      return written.error ? written : { path: filePath, filesUpdate: null, occurrences: 1 };
    }
    const occurrences = text.split(oldString).length - 1;
    if (occurrences === 0) return { error: `String not found in file '${filePath}'` };
    if (occurrences > 1 && !replaceAll) {
      return { error: `'${filePath}' has ${occurrences} occurrences of old_string: give more context to make it unique, or replace all` };
    }
    const written = await this.write(filePath, replaceAll ? text.split(oldString).join(newString) : text.replace(oldString, () => newString));
    return written.error ? written : { path: filePath, filesUpdate: null, occurrences: replaceAll ? occurrences : 1 };
  }

  // The files under base ("" is the workspace's root), paths from the root.
  private async filesUnder(base: string): Promise<FileEntry[]> {
    const all = await this.client.listFiles(this.workspace);
    const prefix = base === "" ? "" : `${base}/`;
    return all.filter((f) => f.path === base || f.path.startsWith(prefix));
  }

  async grep(pattern: string, path?: string | null, glob?: string | null, maxCount?: number | null): Promise<GrepResult> {
    try {
      const base = workspacePath(path ?? "/", "/");
      const pat = glob?.replace(/^\/+/, "");
      const match = pat ? picomatch(pat, { dot: true, basename: !pat.includes("/") }) : () => true;
      const matches: GrepMatch[] = [];
      let truncated = false;
      for (const f of await this.filesUnder(base)) {
        if (f.type !== "file") continue;
        const rel = base === "" || f.path === base ? f.path : f.path.slice(base.length + 1);
        if (!match(rel)) continue;
        if (maxCount && matches.length >= maxCount) {
          truncated = true;
          break;
        }
        if (f.size > this.maxFileBytes) {
          // Not searched (run_python can): the matches found elsewhere stand, flagged incomplete.
          truncated = true;
          continue;
        }
        const got = await this.bytes(`/${f.path}`);
        if ("error" in got) continue;
        const { text } = mimeOf(f.path, got.bytes);
        if (text === undefined) continue;
        text.split("\n").forEach((line, i) => {
          if (line.includes(pattern)) matches.push({ path: `/${f.path}`, line: i + 1, text: line });
        });
      }
      const result = applyGrepMaxCount({ result: { matches }, maxCount });
      if (truncated) result.truncated = true;
      return result;
    } catch (e) {
      return { error: `Error searching '${path ?? "/"}': ${message(e)}` };
    }
  }

  async glob(pattern: string, path = "/"): Promise<GlobResult> {
    try {
      const base = workspacePath(path, "/");
      const match = picomatch(pattern.replace(/^\/+/, ""), { dot: true });
      const files = (await this.filesUnder(base))
        .filter((f) => f.type === "file" && match(base === "" ? f.path : f.path.slice(base.length + 1)))
        .map((f) => this.info(f))
        .sort((a, b) => a.path.localeCompare(b.path));
      return { files };
    } catch (e) {
      return { error: `Error matching '${pattern}': ${message(e)}` };
    }
  }

  async delete(filePath: string): Promise<DeleteResult> {
    try {
      const p = workspacePath(filePath, "/");
      if (p === "") return { error: "the workspace's root is not deleted; delete what is in it" };
      await this.client.deleteFile(this.workspace, p);
      return { path: filePath, filesUpdate: null };
    } catch (e) {
      if (e instanceof NotFound) return { error: `'${filePath}' not found` };
      return { error: `Error deleting '${filePath}': ${message(e)}` };
    }
  }

  async uploadFiles(files: Array<[string, Uint8Array]>): Promise<FileUploadResponse[]> {
    const out: FileUploadResponse[] = [];
    for (const [path, content] of files) {
      try {
        await this.client.writeFile(this.workspace, workspacePath(path, "/"), content);
        out.push({ path, error: null });
      } catch (e) {
        out.push({ path, error: e instanceof ProblemError && e.status === 403 ? "permission_denied" : e instanceof ProblemError && e.status === 409 ? "is_directory" : "invalid_path" });
      }
    }
    return out;
  }

  async downloadFiles(paths: string[]): Promise<FileDownloadResponse[]> {
    const out: FileDownloadResponse[] = [];
    for (const path of paths) {
      try {
        out.push({ path, content: await this.client.readFile(this.workspace, workspacePath(path, "/")), error: null });
      } catch (e) {
        out.push({ path, content: null, error: e instanceof NotFound ? "file_not_found" : e instanceof Conflict ? "is_directory" : e instanceof ProblemError && e.status === 403 ? "permission_denied" : "invalid_path" });
      }
    }
    return out;
  }
}
