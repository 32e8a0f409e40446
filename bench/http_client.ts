/**
 * The HTTP bench's client side: one forward call over keep-alive HTTP with safetensors both
 * ways (timed from the send to the parsed answer; the request is built before), and a decode
 * client that pre-builds its steps' requests, waits at a start barrier, then sends them one
 * after another on its own caches (one per layer), keeping of each answer only what the
 * checker needs: a few (token, head) rows chosen at random per call, or the whole output for
 * the steps in `full_steps`. Those copies and every check happen after the clock stops.
 *
 * Calls go through a {@link Caller}: the bench's own HTTP/1.1 connection (bench/http_conn.ts,
 * the default) or Deno's `fetch`.
 *
 * Used in the main thread (the sequential phase) and by bench/http_client_worker.ts (one
 * worker per concurrent client, so the clients' own JS does not share one thread).
 * @module
 */
import { parseSafetensors } from "../core/safetensors.ts";
import { Rng } from "../tests/support/rng.ts";
import { decodeBody } from "./http_bodies.ts";
import { HttpConn, rawRequest } from "./http_conn.ts";
import { type HttpShape, type Layout, seedOf, stepData } from "./http_workload.ts";

/** A forward answer: the f16 output bits and the server's own account. */
export interface Answer {
  /** Client round trip in ms: send to parsed answer. */
  ms: number;
  backend: string;
  /**
   * The server's per-phase timings: the service's (`__metadata__.timings`) and the handler's
   * (`Server-Timing`: `parse`).
   */
  timings: Record<string, number>;
  /** [tokens, heads, head_size] float16 bits. */
  output: Uint16Array;
}

/** A call the server refused or answered with something that is not an f16 output. */
export class CallError extends Error {
  override name = "CallError";
}

/** How the bench's clients talk HTTP: their own keep-alive connection, or Deno's fetch. */
export type ClientKind = "raw" | "fetch";

/** The client kinds, for the command line. */
export const CLIENT_KINDS: readonly ClientKind[] = ["raw", "fetch"];

/** A forward call's request as built before the clock starts. */
export type Prepared = Uint8Array;

/** What {@link Caller.send} returns. */
export interface Sent {
  status: number;
  body: Uint8Array;
  /** The answer's `Server-Timing` header, if any. */
  serverTiming?: string;
}

/**
 * The durations (ms) of a `Server-Timing` header by metric name (`parse;dur=0.2, x;dur=1`);
 * metrics without a duration are left out.
 */
export function serverTimings(header: string | undefined): Record<string, number> {
  const out: Record<string, number> = {};
  for (const metric of header?.split(",") ?? []) {
    const [name, ...params] = metric.split(";").map((x) => x.trim());
    const dur = params.find((p) => p.startsWith("dur="));
    const ms = dur === undefined ? NaN : Number(dur.slice(4));
    if (name && Number.isFinite(ms)) out[name] = ms;
  }
  return out;
}

/** One client's way to send forward calls: one call at a time. */
export interface Caller {
  /** Builds a forward call's request from its safetensors body (untimed). */
  prepare(body: Uint8Array): Prepared;
  /** Sends a prepared request; the answer's status, body and `Server-Timing` header. */
  send(request: Prepared): Promise<Sent>;
  close(): void;
}

const FORWARD_HEADERS = {
  "content-type": "application/octet-stream",
  accept: "application/octet-stream",
};

/**
 * A caller of `kind` for the server at `url`, sending `headers` with every call. With
 * `reuseAnswers` the raw client reads every answer into one buffer (bench/http_conn.ts
 * `reuseAnswer`): an answer is then valid only until the next call (fetch ignores it).
 */
export function caller(
  kind: ClientKind,
  url: string,
  headers: Record<string, string>,
  options: { reuseAnswers?: boolean } = {},
): Caller {
  const target = `${url}/v1/attention/forward`;
  const all = { ...headers, ...FORWARD_HEADERS };
  if (kind === "raw") {
    const conn = new HttpConn(url, { reuseAnswer: options.reuseAnswers });
    return {
      prepare: (body) => rawRequest("POST", target, all, body),
      send: async (request) => {
        const a = await conn.send(request);
        return { status: a.status, body: a.body, serverTiming: a.headers.get("server-timing") };
      },
      close: () => conn.close(),
    };
  }
  return {
    prepare: (body) => body,
    send: async (body) => {
      const res = await fetch(target, {
        method: "POST",
        headers: all,
        body: body as Uint8Array<ArrayBuffer>,
      });
      const serverTiming = res.headers.get("server-timing") ?? undefined;
      return { status: res.status, body: new Uint8Array(await res.arrayBuffer()), serverTiming };
    },
    close: () => {},
  };
}

/** Sends one prepared forward call and parses the safetensors answer (timed together). */
export async function forward(c: Caller, request: Prepared): Promise<Answer> {
  const t0 = performance.now();
  const { status, body: bytes, serverTiming } = await c.send(request);
  if (status < 200 || status > 299) {
    throw new CallError(`forward: HTTP ${status}: ${new TextDecoder().decode(bytes)}`);
  }
  const file = parseSafetensors(bytes);
  const ms = performance.now() - t0;
  const out = file.tensors.output;
  if (!out || out.dtype !== "F16") {
    throw new CallError(`forward: expected an F16 output tensor, got ${out?.dtype ?? "none"}`);
  }
  const data = out.data.byteOffset % 2 === 0 ? out.data : out.data.slice();
  return {
    ms,
    backend: file.metadata.backend ?? "?",
    timings: {
      ...(file.metadata.timings ? JSON.parse(file.metadata.timings) : {}),
      ...serverTimings(serverTiming),
    },
    output: new Uint16Array(data.buffer, data.byteOffset, data.byteLength / 2),
  };
}

/** One decode client's job. */
export interface DecodeJob {
  url: string;
  headers: Record<string, string>;
  client: ClientKind;
  shape: HttpShape;
  layout: Layout;
  seed: number;
  /**
   * The client's caches, one per layer (`index` selects the data): every step sends one call
   * to each, in order, with the same metadata, as an engine's layers do.
   */
  caches: { index: number; id: string }[];
  first_step: number;
  steps: number;
  /**
   * Untimed calls before the timed ones: the timed requests in order and cycling, ending on
   * the last (each rewrites the same K/V its timed twin writes; a step's early write of a later
   * position is beyond every earlier step's seq_len, so nothing reads it early). 0: none. With
   * more than PLAN_VARIANTS (4) steps, no timed step finds a plan the warm-up left.
   */
  warmup: number;
  /** Output rows (token, head) kept per answer for the sampled check. */
  check_rows: number;
  /** Steps whose whole output is kept (fully checked). */
  full_steps: number[];
}

/** What one decode call left for the report and the checker. */
export interface DecodeCall {
  cache: number;
  step: number;
  ms: number;
  backend: string;
  timings: Record<string, number>;
  /** Flat (token * num_heads + head) indices of the kept rows. */
  rows: number[];
  /** Their output, rows.length x head_size float16 bits. */
  values: Uint16Array;
  /** The whole output, for full_steps. */
  full?: Uint16Array;
}

/** A client's calls, the first untimed warm-up call's round trip, and the error that stopped it. */
export interface DecodeResult {
  calls: DecodeCall[];
  warmup_ms?: number;
  error?: string;
}

/** The rows kept of a call: `n` distinct random (token, head) rows, seeded by cache and step. */
export function sampleRows(total: number, n: number, seed: number): number[] {
  if (n >= total) return Array.from({ length: total }, (_, i) => i);
  const rng = new Rng(seed), picked = new Set<number>();
  while (picked.size < n) picked.add(rng.int(total));
  return [...picked].sort((a, b) => a - b);
}

/** Copies the given rows out of an output. */
export function takeRows(output: Uint16Array, rows: number[], D: number): Uint16Array {
  const out = new Uint16Array(rows.length * D);
  rows.forEach((row, i) => out.set(output.subarray(row * D, (row + 1) * D), i * D));
  return out;
}

/**
 * Runs a decode client: builds every call's body, awaits `ready()` (the start barrier), then
 * sends the steps in order (each step: one call per cache). Stops at the first failed call.
 */
export async function runDecode(
  job: DecodeJob,
  ready: () => Promise<void> = () => Promise.resolve(),
): Promise<DecodeResult> {
  const s = job.shape, D = s.head_size;
  // Each answer's rows are copied out before the next call: one answer buffer serves them all.
  const api = caller(job.client, job.url, job.headers, { reuseAnswers: true });
  const todo: { cache: number; step: number; request: Prepared }[] = [];
  for (let i = 0; i < job.steps; i++) {
    const step = job.first_step + i;
    for (const c of job.caches) {
      const data = stepData(s, job.seed, c.index, step);
      const request = api.prepare(decodeBody(s, job.layout, c.id, step, data));
      todo.push({ cache: c.index, step, request });
    }
  }
  const result: DecodeResult = { calls: [] };
  const where = (t: { cache: number; step: number }) => `cache ${t.cache} step ${t.step}`;
  try {
    // The warm-up comes before the start barrier: concurrent clients start timed with their
    // own JIT warm, as an engine's long-running clients are (and none's warm-up is timed).
    if (job.warmup > 0 && todo.length) {
      // Ends on the last timed request, so the plans it leaves cached are the last steps'
      // (an engine's steps never repeat: the first timed steps plan anew).
      const n = todo.length, off = (n - (job.warmup % n)) % n;
      result.warmup_ms = (await forward(api, todo[off].request)).ms;
      for (let i = 1; i < job.warmup; i++) await forward(api, todo[(off + i) % n].request);
    }
    await ready();
    for (const t of todo) {
      let a: Answer;
      try {
        a = await forward(api, t.request);
      } catch (e) {
        throw new CallError(`${where(t)}: ${e instanceof Error ? e.message : e}`);
      }
      t.request = new Uint8Array(0);
      const rows = sampleRows(
        s.reqs * s.num_heads,
        job.check_rows,
        seedOf(job.seed, "rows", t.cache, t.step),
      );
      result.calls.push({
        cache: t.cache,
        step: t.step,
        ms: a.ms,
        backend: a.backend,
        timings: a.timings,
        rows,
        values: takeRows(a.output, rows, D),
        ...(job.full_steps.includes(t.step) ? { full: a.output.slice() } : {}),
      });
    }
  } catch (e) {
    result.error = e instanceof Error ? e.message : String(e);
  } finally {
    api.close();
  }
  return result;
}
