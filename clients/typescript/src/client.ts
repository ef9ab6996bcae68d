/**
 * The client of the Sandcell daemon's API, over its Unix socket (the caller is its
 * uid) or over TCP with a bearer token (http or https), on Node's own http modules.
 */
import * as http from "node:http";
import * as https from "node:https";

import { FileTooLarge, ProblemError, SandcellError, type Problem, TimeoutError, TransportError, problemError } from "./errors.js";
import type {
  Approval, CellAnswer, CellOptions, CellStreamEvent, ErrorEvent, FileEntry, Run, RunOptions, SessionInfo, SessionOptions,
  SQLResult, StreamEvent, Workspace,
} from "./types.js";

/** Where the packaged daemon listens (socket.path of its configuration). */
export const DEFAULT_SOCKET = "/run/sandcell/sandcell.sock";

/**
 * An event stream's idle timeout: the daemon sends a comment every 15 s on an idle
 * stream, so a minute of silence means it has gone away.
 */
const STREAM_IDLE_MS = 60_000;

/** How a Client reaches the daemon, and how long it waits. */
export interface ClientOptions {
  /** the daemon's Unix socket (default: $SANDCELL_SOCKET, else DEFAULT_SOCKET) */
  socket?: string;
  /** the daemon's TCP address, http(s)://host:port (default: $SANDCELL_URL); takes the place of socket */
  url?: string;
  /** the bearer token over TCP (default: $SANDCELL_TOKEN) */
  token?: string;
  /** the longest silence on any request, ms (default 30 s): connect, send, answer */
  timeoutMs?: number;
  /** the longest wait for a run's, cell's or statement's answer, ms (default 900 s) */
  runTimeoutMs?: number;
  /** how often a 429 or 503 with Retry-After is sent again (default 2) */
  maxRetries?: number;
  /** the longest Retry-After honoured, ms (default 30 s); a longer one is thrown */
  maxRetryWaitMs?: number;
}

interface Request {
  method: string;
  path: string;
  json?: unknown;
  body?: Uint8Array;
  query?: Record<string, string | number | undefined>;
  /** replaces the client's timeout for this request, ms */
  timeoutMs?: number;
  /** a 429 or 503 with Retry-After may be sent again (the daemon did not act on it) */
  retry?: boolean;
  headers?: Record<string, string>;
  /** a successful answer's body past this many bytes is not read: FileTooLarge */
  maxBytes?: number;
}

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

const seg = (s: string) => encodeURIComponent(s);

/**
 * A workspace path's files route, each segment escaped. A path with an empty, "." or
 * ".." segment is refused here (a TypeError): URLs resolve those before sending, which
 * would reach another route (another workspace, a run, a session).
 */
function filePath(workspace: string, path: string): string {
  const segs = path.split("/");
  if (segs.some((p) => p === "" || p === "." || p === "..")) {
    throw new TypeError(`workspace path ${JSON.stringify(path)}: relative, without empty, "." or ".." segments`);
  }
  return `/v1/workspaces/${seg(workspace)}/files/` + segs.map(seg).join("/");
}

function stdinFields(stdin: string | Uint8Array | undefined): Record<string, string> {
  if (stdin === undefined) return {};
  if (typeof stdin === "string") return { stdin };
  return { stdin: Buffer.from(stdin).toString("base64"), stdin_encoding: "base64" };
}

/** Retry-After in seconds: delta-seconds only, as the daemon sends it (else undefined: not retried). */
function retryAfter(h: http.IncomingHttpHeaders): number | undefined {
  const v = String(h["retry-after"] ?? "").trim();
  return /^[0-9]{1,6}$/.test(v) ? Number(v) : undefined;
}

function problemOf(a: Answer): Problem {
  try {
    const doc = JSON.parse(a.body.toString("utf8"));
    if (doc && typeof doc === "object" && !Array.isArray(doc)) return doc as Problem;
  } catch {
    // not a problem document: a proxy's page, the HTTP server's plain text
  }
  return { status: a.status, title: http.STATUS_CODES[a.status] ?? "", detail: a.body.subarray(0, 500).toString("utf8").trim() };
}

/** A cell's request body. */
function cellBody(code: string, options: CellOptions): Record<string, unknown> {
  const body: Record<string, unknown> = { code, ...stdinFields(options.stdin) };
  if (options.limits) body.limits = options.limits;
  if (options.approval !== undefined) body.approval = options.approval;
  return body;
}

/** A SQL parameter as the API binds it: bytes as {"base64": ...}; a bigint as a number where exact. */
function sqlParam(v: unknown): unknown {
  if (v instanceof Uint8Array) return { base64: Buffer.from(v).toString("base64") };
  if (typeof v === "bigint") {
    if (v > BigInt(Number.MAX_SAFE_INTEGER) || v < BigInt(Number.MIN_SAFE_INTEGER)) {
      throw new RangeError(`SQL parameter ${v}: beyond 2^53, which JSON numbers carry exactly`);
    }
    return Number(v);
  }
  return v;
}

/** Parses an event stream as the daemon writes it: event, id and one data line. */
class SSE {
  private event = "";
  private id: number | undefined;
  private data: string[] = [];

  line(line: string): StreamEvent | CellStreamEvent | ErrorEvent | undefined {
    if (line === "") {
      const ev = this.event, data = this.data.join("\n"), id = this.id;
      this.event = ""; this.data = []; this.id = undefined;
      return ev ? toEvent(ev, data, id) : undefined;
    }
    if (line.startsWith(":")) return undefined;
    const i = line.indexOf(":");
    const name = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? "" : line.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.event = value;
    else if (name === "data") this.data.push(value);
    else if (name === "id" && /^\d+$/.test(value)) this.id = Number(value);
    return undefined;
  }
}

function toEvent(name: string, data: string, id: number | undefined): StreamEvent | CellStreamEvent | ErrorEvent | undefined {
  const doc = JSON.parse(data);
  if (name === "stdout" || name === "stderr") {
    const raw = String(doc.data ?? "");
    const bytes = doc.encoding === "base64" ? Buffer.from(raw, "base64") : Buffer.from(raw, "utf8");
    return { kind: "output", stream: name, data: new Uint8Array(bytes), id };
  }
  if (name === "display") return { kind: "display", display: doc };
  if (name === "result") return { kind: "result", run: doc };
  if (name === "answer") return { kind: "answer", answer: doc };
  if (name === "error") return { kind: "error", problem: doc };
  return undefined; // an event a later daemon sends that this version does not know
}

/**
 * A client of one daemon. Every method returns a promise (`stream` and `runStream` an
 * async iterable); failures are ProblemError subclasses (by the answer's code),
 * TransportError and TimeoutError. Call `close()` when done (or `await using`).
 */
export class Client {
  readonly baseURL: URL;
  timeoutMs: number;
  runTimeoutMs: number;
  maxRetries: number;
  maxRetryWaitMs: number;
  private readonly socket: string | undefined;
  // An ECMAScript private field: neither JSON.stringify nor util.inspect shows it.
  readonly #auth: string | undefined;
  private readonly agent: http.Agent;

  constructor(options: ClientOptions = {}) {
    const url = options.url ?? (options.socket === undefined ? process.env.SANDCELL_URL : undefined);
    if (url) {
      this.baseURL = new URL(url);
      const token = options.token ?? process.env.SANDCELL_TOKEN;
      this.#auth = token ? `Bearer ${token}` : undefined;
      this.agent = this.baseURL.protocol === "https:" ? new https.Agent({ keepAlive: true }) : new http.Agent({ keepAlive: true });
    } else {
      this.baseURL = new URL("http://sandcell");
      this.socket = options.socket ?? process.env.SANDCELL_SOCKET ?? DEFAULT_SOCKET;
      this.agent = new http.Agent({ keepAlive: true });
    }
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.runTimeoutMs = options.runTimeoutMs ?? 900_000;
    this.maxRetries = options.maxRetries ?? 2;
    this.maxRetryWaitMs = options.maxRetryWaitMs ?? 30_000;
  }

  /** Closes the client's idle connections. */
  close(): void {
    this.agent.destroy();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /**
   * Sends req and resolves with the response once its headers have come: connecting
   * and sending are bounded by timeoutMs, the wait for the answer by answerMs.
   */
  private open(req: Request, answerMs: number): Promise<http.IncomingMessage> {
    // The base URL's path is a prefix (a proxy's); IPv6 literals lose their brackets.
    const url = new URL(this.baseURL.pathname.replace(/\/$/, "") + req.path, this.baseURL);
    const hostname = url.hostname.replace(/^\[(.*)\]$/, "$1");
    for (const [k, v] of Object.entries(req.query ?? {})) if (v !== undefined && v !== "") url.searchParams.set(k, String(v));
    const headers: Record<string, string> = { ...req.headers };
    let body: Uint8Array | undefined = req.body;
    if (req.json !== undefined) {
      body = Buffer.from(JSON.stringify(req.json), "utf8");
      headers["content-type"] = "application/json";
    } else if (body !== undefined) {
      headers["content-type"] = "application/octet-stream";
    }
    if (body !== undefined) headers["content-length"] = String(body.byteLength);
    if (this.#auth) headers.authorization = this.#auth;
    const mod = url.protocol === "https:" ? https : http;
    return new Promise((resolve, reject) => {
      const r = mod.request({
        method: req.method, agent: this.agent, headers, socketPath: this.socket,
        hostname: this.socket ? undefined : hostname, port: this.socket ? undefined : url.port,
        path: url.pathname + url.search,
      }, resolve);
      const silence = (ms: number) => () => r.destroy(new TimeoutError(`the daemon was silent for ${ms} ms: ${req.method} ${req.path}`));
      r.setTimeout(this.timeoutMs, silence(this.timeoutMs));
      r.on("finish", () => r.setTimeout(answerMs, silence(answerMs)));
      r.on("error", (e) => reject(e instanceof TransportError ? e : new TransportError(`cannot reach the daemon: ${e.message}`, { cause: e })));
      r.end(body);
    });
  }

  /** Sends req (again, where the daemon says when) and reads its whole answer. */
  private async send(req: Request): Promise<Answer> {
    for (let attempt = 0; ; attempt++) {
      const idle = req.timeoutMs ?? this.timeoutMs;
      const res = await this.open(req, idle);
      const ok = (res.statusCode ?? 0) < 400;
      const size = Number(res.headers["content-length"] ?? NaN);
      if (ok && req.maxBytes !== undefined && size > req.maxBytes) {
        res.destroy();
        throw new FileTooLarge(size, req.maxBytes);
      }
      const body = await readAll(res, idle, ok ? req.maxBytes : undefined);
      const a: Answer = { status: res.statusCode ?? 0, headers: res.headers, body };
      if (a.status < 400) return a;
      const wait = retryAfter(a.headers);
      if ((req.retry ?? true) && wait !== undefined && (a.status === 429 || a.status === 503) &&
          attempt < this.maxRetries && wait * 1000 <= this.maxRetryWaitMs) {
        await new Promise((r) => setTimeout(r, wait * 1000));
        continue;
      }
      throw problemError(a.status, problemOf(a), wait);
    }
  }

  /** The answer's JSON object (a TransportError where it is not one: a proxy's page, another server). */
  private async json<T>(req: Request): Promise<T> {
    const a = await this.send(req);
    let doc: unknown;
    try {
      doc = JSON.parse(a.body.toString("utf8"));
    } catch (e) {
      throw new TransportError(`the daemon's answer is not JSON: ${(e as Error).message}`, { cause: e });
    }
    if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
      throw new TransportError("the daemon's answer is not the API's document (a JSON object)");
    }
    return doc as T;
  }

  // Runs.

  /** Runs code (or options.path) and waits for its end: a Run whose `result` is set. */
  run(code: string | undefined, options: RunOptions = {}): Promise<Run> {
    return this.json<Run>({ method: "POST", path: "/v1/runs", json: runBody(code, options, true), timeoutMs: this.runTimeoutMs });
  }

  /** As run, but answers at once: the Run queued or running. */
  start(code: string | undefined, options: RunOptions = {}): Promise<Run> {
    return this.json<Run>({ method: "POST", path: "/v1/runs", json: runBody(code, options, false) });
  }

  /** The run (this caller's; another's is NotFound). */
  getRun(id: string): Promise<Run> {
    return this.json<Run>({ method: "GET", path: `/v1/runs/${seg(id)}` });
  }

  /** Cancels the run: its worker is killed and it ends cancelled. */
  cancel(id: string): Promise<Run> {
    return this.json<Run>({ method: "DELETE", path: `/v1/runs/${seg(id)}` });
  }

  /**
   * The run's events as they come: output pieces from its start (or after event id
   * `after`), a display event per display, then the finished run, which ends it.
   */
  async *stream(id: string, options: { after?: number } = {}): AsyncGenerator<StreamEvent> {
    const headers: Record<string, string> = options.after !== undefined ? { "last-event-id": String(options.after) } : {};
    const res = await this.open({ method: "GET", path: `/v1/runs/${seg(id)}/events`, headers }, STREAM_IDLE_MS);
    for await (const ev of this.events(res, `the event stream of run ${id}`, STREAM_IDLE_MS)) {
      if (ev.kind === "answer" || ev.kind === "error") continue; // not a run's
      yield ev;
      if (ev.kind === "result") return;
    }
    throw new TransportError(`the event stream of run ${id} ended before its result`);
  }

  /**
   * The events of an answer that is an event stream (a problem document where the
   * daemon refused), as they come; what names the stream in errors; a stream silent
   * for idleMs is a TimeoutError.
   */
  private async *events(res: http.IncomingMessage, what: string, idleMs: number): AsyncGenerator<StreamEvent | CellStreamEvent | ErrorEvent> {
    if ((res.statusCode ?? 0) >= 400) {
      const body = await readAll(res, this.timeoutMs);
      const a = { status: res.statusCode ?? 0, headers: res.headers, body };
      throw problemError(a.status, problemOf(a), retryAfter(a.headers));
    }
    let timedOut: TimeoutError | undefined;
    const sse = new SSE();
    let rest = "";
    res.setTimeout(idleMs, () => {
      timedOut = new TimeoutError(`${what} was silent for ${idleMs} ms`);
      res.destroy(timedOut);
    });
    try {
      for await (const chunk of res.setEncoding("utf8") as AsyncIterable<string>) {
        rest += chunk;
        let i: number;
        while ((i = rest.indexOf("\n")) >= 0) {
          const line = rest.slice(0, i).replace(/\r$/, "");
          rest = rest.slice(i + 1);
          const ev = sse.line(line);
          if (ev) yield ev;
        }
      }
    } catch (e) {
      if (timedOut) throw timedOut;
      throw e instanceof SandcellError ? e : new TransportError(`${what} broke: ${(e as Error).message}`, { cause: e });
    } finally {
      res.destroy();
    }
  }


  /** Starts a run and streams its events. */
  async *runStream(code: string | undefined, options: RunOptions = {}): AsyncGenerator<StreamEvent> {
    const run = await this.start(code, options);
    yield* this.stream(run.id);
  }

  // The daemon.

  /** Versions, the interpreter, limits and maxima, backends, the enforcement contract. */
  info(): Promise<Record<string, unknown>> {
    return this.json({ method: "GET", path: "/v1/info" });
  }

  /** The agent tools' JSON Schemas and the guest tools a program may call. */
  tools(): Promise<{ tools: { name: string; description: string; [k: string]: unknown }[]; [k: string]: unknown }> {
    return this.json({ method: "GET", path: "/v1/tools" });
  }

  // Workspaces and files.

  /** A new empty workspace owned by the caller. */
  createWorkspace(): Promise<Workspace> {
    return this.json({ method: "POST", path: "/v1/workspaces", retry: false });
  }

  /** The workspace: quota, usage and one page of its names. */
  workspace(id: string, page: { after?: string; limit?: number } = {}): Promise<Workspace> {
    return this.json({ method: "GET", path: `/v1/workspaces/${seg(id)}`, query: { after: page.after, limit: page.limit } });
  }

  /** Every name in the workspace, page after page, depth first. */
  async listFiles(id: string): Promise<FileEntry[]> {
    const files: FileEntry[] = [];
    for (let after: string | undefined; ;) {
      const page = await this.workspace(id, { after });
      files.push(...(page.files ?? []));
      if (!page.next) return files;
      after = page.next;
    }
  }

  /** Deletes the workspace and everything in it (Conflict while in use). */
  async deleteWorkspace(id: string): Promise<void> {
    await this.send({ method: "DELETE", path: `/v1/workspaces/${seg(id)}` });
  }

  /** Writes a file (a string as UTF-8), creating missing directories. */
  async writeFile(id: string, path: string, data: string | Uint8Array): Promise<void> {
    const body = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    await this.send({ method: "PUT", path: filePath(id, path), body });
  }

  /**
   * A regular file's bytes (Conflict unsafe_file for a link, FIFO or directory);
   * FileTooLarge, before reading it, for a file over options.maxBytes.
   */
  async readFile(id: string, path: string, options: { maxBytes?: number } = {}): Promise<Uint8Array> {
    return new Uint8Array((await this.send({ method: "GET", path: filePath(id, path), maxBytes: options.maxBytes })).body);
  }

  /** Removes a file, link or directory with its contents. */
  async deleteFile(id: string, path: string): Promise<void> {
    await this.send({ method: "DELETE", path: filePath(id, path) });
  }

  // SQL.

  /**
   * One statement on the workspace's SQLite file db; params positional (an array) or
   * named (an object), bytes bound as blobs. A write throws ApprovalRequired; once it
   * is approved, send it again with options.approval.
   */
  async sql(workspace: string, db: string, statement: string,
    options: { params?: unknown[] | Record<string, unknown>; maxRows?: number; approval?: string } = {}): Promise<SQLResult> {
    const body: Record<string, unknown> = { workspace, db, sql: statement };
    if (Array.isArray(options.params)) body.params = options.params.map(sqlParam);
    else if (options.params) body.params = Object.fromEntries(Object.entries(options.params).map(([k, v]) => [k, sqlParam(v)]));
    if (options.maxRows !== undefined) body.max_rows = options.maxRows;
    if (options.approval !== undefined) body.approval = options.approval;
    const res = await this.json<SQLResult>({ method: "POST", path: "/v1/sql", json: body, timeoutMs: this.runTimeoutMs });
    // Blobs come as {"base64": ...}: bytes, as they went in.
    res.rows = res.rows?.map((row) => row.map((v) => isBlob(v) ? new Uint8Array(Buffer.from(v.base64, "base64")) : v));
    return res;
  }

  // Approvals.

  /** Approvals (approvers), oldest first, of a state if given. */
  async approvals(state?: Approval["state"]): Promise<Approval[]> {
    return (await this.json<{ approvals: Approval[] }>({ method: "GET", path: "/v1/approvals", query: { state } })).approvals ?? [];
  }

  /** One approval (its requester, approvers, admins). */
  approval(id: string): Promise<Approval> {
    return this.json({ method: "GET", path: `/v1/approvals/${seg(id)}` });
  }

  /**
   * Decides a pending approval (approvers; never the requester's own). On a guest's
   * tool call, grant N approves the run's next calls to the tool, at most N.
   */
  decide(id: string, approve: boolean, options: { grant?: number } = {}): Promise<Approval> {
    return this.json({ method: "POST", path: `/v1/approvals/${seg(id)}`, json: decision(approve, options.grant), retry: false });
  }

  /** The requester's own decision, as the person at its MCP client gave it, where allowed. */
  confirm(id: string, approve: boolean, options: { grant?: number } = {}): Promise<Approval> {
    return this.json({ method: "POST", path: `/v1/approvals/${seg(id)}/confirm`, json: decision(approve, options.grant), retry: false });
  }

  // Sessions.

  /** Opens an interpreter session (its state kept from one cell to the next). */
  async openSession(options: SessionOptions = {}): Promise<Session> {
    const body: Record<string, unknown> = { ...options };
    return new Session(this, await this.json<SessionInfo>({ method: "POST", path: "/v1/sessions", json: body, timeoutMs: this.runTimeoutMs }));
  }

  /** The caller's sessions. */
  async sessions(): Promise<SessionInfo[]> {
    return (await this.json<{ sessions: SessionInfo[] }>({ method: "GET", path: "/v1/sessions" })).sessions ?? [];
  }

  /** A session of the caller's, by id. */
  async session(id: string): Promise<Session> {
    return new Session(this, await this.json<SessionInfo>({ method: "GET", path: `/v1/sessions/${seg(id)}` }));
  }

  /** Runs a cell in the session (resumed first if paused). */
  runCell(id: string, code: string, options: CellOptions = {}): Promise<CellAnswer> {
    return this.json({ method: "POST", path: `/v1/sessions/${seg(id)}/cells`, json: cellBody(code, options), timeoutMs: this.runTimeoutMs });
  }

  /**
   * Runs a cell, yielding its output as the worker produces it, then its answer (the
   * last event; its result holds the whole output too). A failure after the output
   * began is thrown as the problem the stream ends with. The stream may be silent
   * while the cell computes, for up to the client's runTimeoutMs.
   */
  async *runCellStream(id: string, code: string, options: CellOptions = {}): AsyncGenerator<CellStreamEvent> {
    const res = await this.open({ method: "POST", path: `/v1/sessions/${seg(id)}/cells`, json: cellBody(code, options),
      headers: { accept: "text/event-stream" } }, this.runTimeoutMs);
    if ((res.statusCode ?? 0) < 400 && !String(res.headers["content-type"] ?? "").startsWith("text/event-stream")) {
      // Answered whole: no output came before the answer.
      yield { kind: "answer", answer: JSON.parse((await readAll(res, this.runTimeoutMs)).toString("utf8")) as CellAnswer };
      return;
    }
    for await (const ev of this.events(res, `the event stream of a cell of session ${id}`, this.runTimeoutMs)) {
      if (ev.kind === "error") throw problemError(Number(ev.problem.status ?? 500), ev.problem);
      if (ev.kind === "output" || ev.kind === "answer") yield ev;
      if (ev.kind === "answer") return;
    }
    throw new TransportError(`the event stream of a cell of session ${id} ended before its answer`);
  }


  /** A new session from the session's state (wasm backend). */
  async forkSession(id: string): Promise<Session> {
    return new Session(this, await this.json<SessionInfo>({ method: "POST", path: `/v1/sessions/${seg(id)}/fork`, timeoutMs: this.runTimeoutMs, retry: false }));
  }

  /** Closes the session: its worker ends, its state with it. */
  async closeSession(id: string): Promise<void> {
    await this.send({ method: "DELETE", path: `/v1/sessions/${seg(id)}` });
  }
}

/** An interpreter session of a Client: `info` as last seen. */
export class Session {
  constructor(readonly client: Client, public info: SessionInfo) {}

  get id(): string {
    return this.info.id;
  }

  get workspace(): string {
    return this.info.workspace ?? "";
  }

  /** Runs a cell; the answer's `value` is its last expression's repr. */
  async run(code: string, options: CellOptions = {}): Promise<CellAnswer> {
    const a = await this.client.runCell(this.id, code, options);
    this.info = a.session;
    return a;
  }

  /** Runs a cell, yielding its output as it comes, then its answer (see Client.runCellStream). */
  async *runStream(code: string, options: CellOptions = {}): AsyncGenerator<CellStreamEvent> {
    for await (const ev of this.client.runCellStream(this.id, code, options)) {
      if (ev.kind === "answer") this.info = ev.answer.session;
      yield ev;
    }
  }

  fork(): Promise<Session> {
    return this.client.forkSession(this.id);
  }

  async refresh(): Promise<SessionInfo> {
    this.info = (await this.client.session(this.id)).info;
    return this.info;
  }

  /** Closes it; a session already gone (closed, lost, expired) is not an error. */
  async close(): Promise<void> {
    try {
      await this.client.closeSession(this.id);
    } catch (e) {
      if (!(e instanceof ProblemError) || (e.status !== 404 && e.status !== 410)) throw e;
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

function isBlob(v: unknown): v is { base64: string } {
  return v !== null && typeof v === "object" && Object.keys(v).length === 1 && typeof (v as { base64?: unknown }).base64 === "string";
}

function runBody(code: string | undefined, o: RunOptions, wait: boolean): Record<string, unknown> {
  const body: Record<string, unknown> = { wait, ...stdinFields(o.stdin) };
  if (code !== undefined) body.code = code;
  for (const k of ["path", "workspace", "backend", "approval", "limits", "env"] as const) if (o[k] !== undefined) body[k] = o[k];
  if (o.args?.length) body.args = o.args;
  return body;
}

function decision(approve: boolean, grant?: number): Record<string, unknown> {
  return grant ? { decision: approve ? "approve" : "deny", grant } : { decision: approve ? "approve" : "deny" };
}

/** Reads a response whole, each silence bounded by idleMs. */
function readAll(res: http.IncomingMessage, idleMs: number, maxBytes?: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    res.setTimeout(idleMs, () => res.destroy(new TimeoutError(`the daemon stopped answering for ${idleMs} ms`)));
    res.on("data", (c: Buffer) => {
      size += c.length;
      if (maxBytes !== undefined && size > maxBytes) res.destroy(new FileTooLarge(size, maxBytes));
      else chunks.push(c);
    });
    res.on("end", () => resolve(Buffer.concat(chunks)));
    res.on("error", (e) => reject(e instanceof TransportError || e instanceof FileTooLarge ? e : new TransportError(`the answer broke off: ${e.message}`, { cause: e })));
    res.on("aborted", () => reject(new TransportError("the answer broke off")));
  });
}
