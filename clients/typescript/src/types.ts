/**
 * The daemon's documents as the API sends them (supervisor/wire, docs/api.md): field
 * names as on the wire. Members this version does not know are kept as they came.
 */

/** A run's or a session's limits, each at most the daemon's maximum (a cell's: CellLimits). */
export interface Limits {
  /** wall clock, milliseconds */
  timeout_ms?: number;
  /** CPU time, milliseconds */
  cpu_ms?: number;
  /** memory, MiB */
  memory_mib?: number;
  /** stdout and stderr, each, bytes */
  max_output_bytes?: number;
  /** WebAssembly instructions (wasm backend) */
  fuel?: number;
}

/** One item a program displayed: a workspace file (`path`) of a MIME `type`. */
export interface Display {
  type: "image/png" | "image/svg+xml" | "text/html" | "application/json" | "text/plain" | string;
  path: string;
  bytes: number;
  width?: number;
  height?: number;
  /** a text type's content up to 64 KiB */
  text?: string;
}

/** How a run or cell ended. */
export type Reason = "exited" | "timeout" | "cancelled" | "cpu_limit" | "output_limit" | "memory_limit" |
  "quota_exceeded" | "trap" | "rejected" | "internal_error";

/**
 * A finished run's or cell's outcome. `stdout`/`stderr` are text, or base64 where
 * `stdout_encoding`/`stderr_encoding` says so (the output was not UTF-8): `outputBytes`
 * gives the exact bytes either way.
 */
export interface Result {
  exit_code: number;
  reason: Reason | string;
  stdout: string;
  stdout_encoding?: "base64";
  stderr: string;
  stderr_encoding?: "base64";
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  elapsed_ms: number;
  peak_memory_bytes: number;
  worker_max_rss_bytes?: number;
  fuel_consumed?: number;
  diagnostics?: string[];
  /** the contract the worker verified (backend, layers, rlimits) */
  enforcement?: { backend?: string; [key: string]: unknown };
  displays?: Display[];
  [key: string]: unknown;
}

/** A program's tool call waiting for a person. */
export interface Waiting {
  approval: string;
  tool: string;
  confirmable: boolean;
}

/** A run: `state` queued, running or done (then `result` is set). */
export interface Run {
  id: string;
  state: "queued" | "running" | "done" | string;
  created_at: string;
  finished_at?: string;
  result?: Result;
  waiting?: Waiting;
  [key: string]: unknown;
}

/** An interpreter session: `state` ready, busy, paused or lost. */
export interface SessionInfo {
  id: string;
  workspace?: string;
  created_at: string;
  last_used_at: string;
  cells: number;
  state: "ready" | "busy" | "paused" | "lost" | string;
  lost?: string;
  forked_from?: string;
  memory_bytes: number;
  enforcement?: { backend?: string; [key: string]: unknown };
  [key: string]: unknown;
}

/**
 * A cell's answer: what became of the session's state (`preserved`, `restored`,
 * `rolled_back`, `lost`), the last expression's repr, the result, the session after.
 */
export interface CellAnswer {
  state: "preserved" | "restored" | "rolled_back" | "lost" | string;
  value?: string;
  value_truncated?: boolean;
  result: Result;
  session: SessionInfo;
  [key: string]: unknown;
}

/** A name in a workspace. */
export interface FileEntry {
  path: string;
  type: "file" | "dir" | "symlink" | "fifo" | "socket" | "device" | "other" | string;
  size: number;
}

/** A workspace, with one page of its names (`next`: more follow). */
export interface Workspace {
  id: string;
  quota?: Record<string, unknown>;
  usage?: Record<string, unknown>;
  over_quota: boolean;
  files?: FileEntry[];
  next?: string;
  [key: string]: unknown;
}

/** One SQL statement's answer. */
export interface SQLResult {
  status: string;
  /** the result's columns: names, and declared types where the table has them */
  columns?: { name: string; decl_type?: string }[];
  /** values as JSON carries them; blobs as Uint8Array, integers beyond 2^53 as their digits */
  rows?: unknown[][];
  truncated?: boolean;
  changes?: number;
  classification?: Record<string, unknown>;
  approval?: string;
  [key: string]: unknown;
}

/** An approval: pending, approved, denied, spent or expired. */
export interface Approval {
  id: string;
  action: string;
  state: "pending" | "approved" | "denied" | "spent" | "expired" | string;
  requester: Record<string, unknown>;
  subject?: unknown;
  digest: string;
  created_at: string;
  expires_at: string;
  decided_by?: Record<string, unknown>;
  decided_at?: string;
  grant?: number;
  [key: string]: unknown;
}

/** A piece of a run's output as it streams (`data` may end inside a UTF-8 character). */
export interface OutputEvent {
  kind: "output";
  stream: "stdout" | "stderr";
  data: Uint8Array;
  /** the event's id where it has one: resume after it with `after` */
  id?: number;
}

/** A display, as the run's stream sends it after the output. */
export interface DisplayEvent {
  kind: "display";
  display: Display;
}

/** The finished run, the stream's last event. */
export interface ResultEvent {
  kind: "result";
  run: Run;
}

export type StreamEvent = OutputEvent | DisplayEvent | ResultEvent;

/** A cell's answer, its stream's last event. */
export interface AnswerEvent {
  kind: "answer";
  answer: CellAnswer;
}

/** What a cell's stream yields: its output as it comes, then its answer. */
export type CellStreamEvent = OutputEvent | AnswerEvent;

/** A stream's failure after its output began: the problem it ends with. */
export interface ErrorEvent {
  kind: "error";
  problem: Record<string, unknown> & { status?: number; code?: string };
}

/** A run's request (POST /v1/runs). */
export interface RunOptions {
  /** a .py file of the workspace to run instead of code */
  path?: string;
  args?: string[];
  /** text, or bytes (sent base64) */
  stdin?: string | Uint8Array;
  env?: Record<string, string>;
  /** a workspace's id, mounted as /ws; omitted: a fresh one, removed after */
  workspace?: string;
  backend?: "wasm" | "native";
  limits?: Limits;
  /** an approved approval's id for exactly this request */
  approval?: string;
}

/** A session's request (POST /v1/sessions). */
export interface SessionOptions {
  workspace?: string;
  backend?: "wasm" | "native";
  limits?: Limits;
  env?: Record<string, string>;
}

/** The limits a cell may lower (memory and fuel are its session's). */
export type CellLimits = Pick<Limits, "timeout_ms" | "cpu_ms" | "max_output_bytes">;

/** A cell's request. */
export interface CellOptions {
  stdin?: string | Uint8Array;
  limits?: CellLimits;
  approval?: string;
}

/** The exact bytes of a result's stdout or stderr. */
export function outputBytes(result: Result, stream: "stdout" | "stderr"): Uint8Array {
  const text = result[stream] ?? "";
  return result[`${stream}_encoding`] === "base64" ? Buffer.from(text, "base64") : Buffer.from(text, "utf8");
}
