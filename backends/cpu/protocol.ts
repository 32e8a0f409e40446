/**
 * The messages between the CPU worker pool (backends/cpu/pool.ts, main thread) and a CPU
 * worker (backends/cpu/worker.ts). One worker runs one call at a time:
 *
 * - main → worker: a {@link CallRequest}: the batch without its cache (structured-cloned), the
 *   cache as a {@link HostCacheHandle} (shared memory, not copied), a shared control word and
 *   a shared undo buffer (backends/cpu/undo.ts).
 * - worker → main: `written` once the cache write is complete, then exactly one of `done`
 *   (output and lse, transferred), `failed` (a {@link WireError}) or `cancelled`.
 *
 * The control word (Int32 0 of `control`) says how far the call got, and is how main cancels
 * without a message: the worker moves it PENDING → WRITING with a compare-exchange just before
 * its first cache write, main moves it PENDING → CANCELLED. Whoever swaps first wins, so a call
 * is either cancelled before any byte is written or its write goes ahead (and is then undone
 * if the call does not complete).
 *
 * A {@link ServiceError} crosses as plain data and is rebuilt with the same status, code,
 * title, issues, reasons and extra fields; any other error becomes a 500 `cpu_worker_failed`.
 * The pool's own endings are {@link cancelledError} (499), {@link crashedError} (500) and
 * {@link closedError} (503); each says `cache_write: "none"`.
 * @module
 */
import { errorFromPlain, errorToPlain, type PlainError, ServiceError } from "../../core/errors.ts";
import type { HostCacheHandle } from "./host_cache.ts";
import type { ForwardBatch } from "../../core/types.ts";

/** Control word: the worker has not started writing; main may still cancel. */
export const PENDING = 0;
/** Control word: the worker is writing the cache. */
export const WRITING = 1;
/** Control word: the cache write is complete (or there was none); the worker is attending. */
export const WRITTEN = 2;
/** Control word: main cancelled the call before the write began; the worker writes nothing. */
export const CANCELLED = 3;

/** A forward batch as it crosses to a worker: everything but the cache object. */
export type WireBatch = Omit<ForwardBatch, "cache">;

/** main → worker: run one call. */
export interface CallRequest {
  id: number;
  batch: WireBatch;
  /** The call's cache, or null when it reads none (encoder types). */
  cache: HostCacheHandle | null;
  /** 4 bytes: the control word. */
  control: SharedArrayBuffer;
  /** The undo log, sized by `undoBytes`; null when the call writes nothing. */
  undo: SharedArrayBuffer | null;
}

/**
 * main → worker: nothing to run; answered `warm` (id 0). The first message a worker started
 * from inside a worker receives takes about 500 ms to arrive on Deno 2.9.6 however long it has
 * been running (later ones well under 1 ms): a warm pool pays that before its first call.
 */
export interface WarmRequest {
  warm: true;
}

/** An error as data. `service` is set when it was a ServiceError. */
/** An error across the worker boundary (core/errors.ts' plain form). */
export type WireError = PlainError;

/** worker → main. */
export type CallReply =
  | { id: number; kind: "written" }
  | {
    id: number;
    kind: "done";
    output: Float32Array;
    lse: Float32Array | null;
    timings: Record<string, number>;
  }
  | { id: number; kind: "failed"; error: WireError }
  | { id: number; kind: "cancelled" }
  | { id: 0; kind: "warm" };

/**
 * The batch to post: without its cache, and with every typed array that views only part of
 * its buffer copied out (posting a view clones its whole buffer, which may be a request body).
 */
export function toWireBatch(batch: ForwardBatch): WireBatch {
  const { cache: _cache, ...rest } = batch;
  return compact(rest);
}

function compact<T>(x: T): T {
  if (ArrayBuffer.isView(x)) {
    if (x instanceof DataView || x.byteLength === x.buffer.byteLength) return x;
    return (x as unknown as Uint8Array).slice() as T;
  }
  if (x !== null && typeof x === "object" && Object.getPrototypeOf(x) === Object.prototype) {
    return Object.fromEntries(Object.entries(x).map(([k, v]) => [k, compact(v)])) as T;
  }
  return x;
}

/** Any thrown value as a {@link WireError}. */
export const toWire: (e: unknown) => WireError = errorToPlain;

/** The main-side error for a {@link WireError}: the same ServiceError, or a 500. */
export function fromWire(w: WireError): ServiceError {
  if (w.service) return errorFromPlain(w) as ServiceError;
  return new ServiceError(`the CPU_REFERENCE worker failed: ${w.name}: ${w.message}`, {
    status: 500,
    code: "cpu_worker_failed",
    extra: { error: w.name },
  });
}

/** 499 `client_closed_request`: the caller's signal aborted; the cache is unchanged. */
export function cancelledError(): ServiceError {
  return new ServiceError(
    "the call was cancelled (the client closed the request); no cache byte changed",
    {
      status: 499,
      code: "client_closed_request",
      title: "Client Closed Request",
      extra: { cache_write: "none" },
    },
  );
}

/** 500 `cpu_worker_crashed`: the worker died running the call; the cache was restored. */
export function crashedError(why: string): ServiceError {
  return new ServiceError(
    `the CPU_REFERENCE worker running this call crashed (${why}); no cache byte changed`,
    { status: 500, code: "cpu_worker_crashed", extra: { cache_write: "none" } },
  );
}

/** 503 `cpu_pool_closed`: the pool is closing; the call never ran. */
export function closedError(): ServiceError {
  return new ServiceError("the CPU worker pool is closing; the call did not run", {
    status: 503,
    code: "cpu_pool_closed",
    extra: { cache_write: "none" },
  });
}
