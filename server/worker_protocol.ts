/**
 * The messages between the HTTP worker threads (http_worker.ts) and the thread that owns the
 * service (worker_front.ts), and their checks. A worker posts a request's head as soon as it
 * arrives, then its body in one transferred ArrayBuffer (or how reading it ended); the owner
 * answers with status, headers and the body bytes, transferred. Each side checks what it gets:
 * a message that is not well formed is a server fault (logged; a 500 where a request waits for
 * it), never blamed on the client.
 * @module
 */
import type { AccessPolicy } from "./auth.ts";

/** What a worker needs to serve: where to listen, the access policy, the body limit. */
export interface WorkerInit {
  type: "init";
  port: number;
  hostname: string;
  /** The access policy (the worker skips reading the body of a request it would refuse). */
  access: AccessPolicy;
  /** The largest body any route reads (the general limit; JSON's is never above it). */
  maxBodyBytes: number;
  /** The largest JSON body a route reads (default `maxBodyBytes`). */
  maxJsonBodyBytes?: number;
  /** The HTTP server the worker runs (default `deno`: Deno.serve; `http1`: http1_server.ts). */
  engine?: "deno" | "http1";
  /** The instance name the http1 server's own answers carry (`X-Attention-Instance`). */
  instance?: string;
  /**
   * The http1 servers' counts of open connections, Int32s shared by every worker: word 0 the
   * port's, word `connectionSlot` this worker's (http1_server.ts `openConnections`).
   */
  openConnections?: SharedArrayBuffer;
  connectionSlot?: number;
}

/** A request's method, URL and headers, posted when they arrive. */
export interface HeadMessage {
  type: "head";
  id: number;
  method: string;
  url: string;
  /** The path as the client sent it (dot segments unresolved; default: `url`'s). */
  path?: string;
  headers: [string, string][];
  /** A body follows (a {@link BodyMessage} with the same id). */
  hasBody: boolean;
}

/**
 * A request body: `bytes` holds what arrived; `end` says how reading ended: `complete` (the
 * stream ended), `too_large` (more than the limit arrived: reading stopped), `error` (the
 * stream failed; `message` says why), `timeout` (no bytes came for the body timeout,
 * `timeout_ms`) or `skipped` (not read: the declared length is over the limit or the access
 * check refuses the request, so no route will read it).
 */
export interface BodyMessage {
  type: "body";
  id: number;
  bytes: ArrayBuffer;
  end: "complete" | "too_large" | "error" | "timeout" | "skipped";
  message?: string;
  /** A `timeout` end: the limit that ran out, in ms. */
  timeout_ms?: number;
  /** An `error` end of a body read in one piece: how many bytes came is not known. */
  uncounted?: boolean;
  /** When it was posted, `Date.now()` there (request_arrival.ts: the hop's wait counts). */
  sentAt?: number;
  /** What the body waited between threads on earlier hops, ms. */
  waitedMs?: number;
  /** How long threads before the owner spent reading the body before posting its head, ms. */
  readMs?: number;
}

/** The client went away before its answer. */
export interface AbortMessage {
  type: "abort";
  id: number;
}

/** A worker is listening (`port` is where). */
export interface ListeningMessage {
  type: "listening";
  port: number;
  hostname: string;
}

/** A worker stopped listening and every answer it took was sent (after a shutdown). */
export interface ClosedMessage {
  type: "closed";
}

/**
 * An answer the worker's http1 server gave itself (a refused head, its timeouts, its connection
 * cap: http1_refusals.ts), to be counted where the handler counts its answers.
 */
export interface OwnAnswerMessage {
  type: "own_answer";
  route: string;
  method: string;
  status: number;
  code?: string;
}

/** Worker → owner. */
export type FromWorker =
  | HeadMessage
  | BodyMessage
  | AbortMessage
  | ListeningMessage
  | ClosedMessage
  | OwnAnswerMessage;

/** An answer to a request. */
export interface ResponseMessage {
  type: "response";
  id: number;
  status: number;
  headers: [string, string][];
  body: ArrayBuffer | null;
}

/** Owner → worker: stop taking connections, finish the answers in flight, then say "closed". */
export interface ShutdownMessage {
  type: "shutdown";
}

/** Owner → worker: throw from the message handler (tests use it to exercise crash recovery). */
export interface FaultMessage {
  type: "fault";
}

/** Owner → worker. */
export type ToWorker = WorkerInit | ResponseMessage | ShutdownMessage | FaultMessage;

const isId = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;
const isPairs = (v: unknown): v is [string, string][] =>
  Array.isArray(v) &&
  v.every((p) =>
    Array.isArray(p) && p.length === 2 && typeof p[0] === "string" && typeof p[1] === "string"
  );
const BODY_ENDS = ["complete", "too_large", "error", "timeout", "skipped"];

/** A worker's message, or a string saying what is wrong with it. */
export function checkFromWorker(m: unknown): FromWorker | string {
  if (typeof m !== "object" || m === null) return `not an object: ${typeof m}`;
  const o = m as Record<string, unknown>;
  switch (o.type) {
    case "head":
      if (!isId(o.id)) return `head: bad id ${String(o.id)}`;
      if (typeof o.method !== "string" || typeof o.url !== "string") return "head: method/url";
      if (o.path !== undefined && typeof o.path !== "string") return "head: path";
      if (!isPairs(o.headers) || typeof o.hasBody !== "boolean") return "head: headers/hasBody";
      return o as unknown as HeadMessage;
    case "body":
      if (!isId(o.id)) return `body: bad id ${String(o.id)}`;
      if (!(o.bytes instanceof ArrayBuffer)) return "body: bytes is not an ArrayBuffer";
      if (!BODY_ENDS.includes(o.end as string)) return `body: bad end ${String(o.end)}`;
      if (o.uncounted !== undefined && typeof o.uncounted !== "boolean") return "body: uncounted";
      if (o.timeout_ms !== undefined && typeof o.timeout_ms !== "number") return "body: timeout_ms";
      if (o.sentAt !== undefined && !Number.isFinite(o.sentAt)) return "body: sentAt";
      for (const k of ["waitedMs", "readMs"] as const) {
        const ms = o[k];
        if (ms !== undefined && !(Number.isFinite(ms) && (ms as number) >= 0)) return `body: ${k}`;
      }
      return o as unknown as BodyMessage;
    case "abort":
      return isId(o.id) ? o as unknown as AbortMessage : `abort: bad id ${String(o.id)}`;
    case "listening":
      return isId(o.port) && typeof o.hostname === "string"
        ? o as unknown as ListeningMessage
        : "listening: port/hostname";
    case "closed":
      return o as unknown as ClosedMessage;
    case "own_answer":
      if (typeof o.route !== "string" || typeof o.method !== "string") return "own_answer: route";
      if (!Number.isInteger(o.status) || (o.status as number) < 100 || (o.status as number) > 599) {
        return `own_answer: bad status ${String(o.status)}`;
      }
      if (o.code !== undefined && typeof o.code !== "string") return "own_answer: code";
      return o as unknown as OwnAnswerMessage;
    default:
      return `unknown message type ${JSON.stringify(o.type)}`;
  }
}

/** The owner's answer for request `id`, or a string saying what is wrong with it. */
export function checkResponse(m: unknown): ResponseMessage | string {
  if (typeof m !== "object" || m === null) return `not an object: ${typeof m}`;
  const o = m as Record<string, unknown>;
  if (o.type !== "response" || !isId(o.id)) return "not a response with an id";
  if (!Number.isInteger(o.status) || (o.status as number) < 200 || (o.status as number) > 599) {
    return `bad status ${String(o.status)}`;
  }
  if (!isPairs(o.headers)) return "bad headers";
  if (o.body !== null && !(o.body instanceof ArrayBuffer)) return "body is not an ArrayBuffer";
  return o as unknown as ResponseMessage;
}
