/**
 * The CPU worker: a Web Worker that runs one CPU_REFERENCE call per message with the float64
 * oracle of backends/cpu/reference.ts, reading and writing the host cache in place through its shared
 * memory. Messages and the control word: backends/cpu/protocol.ts.
 *
 * A call: check the batch (nothing written if it fails), save the rows it will overwrite in
 * the undo log, claim the control word PENDING → WRITING (if main cancelled first, reply
 * `cancelled` having written nothing), write the K/V, mark WRITTEN and say `written`, attend,
 * reply `done` with the output and lse transferred (not copied).
 *
 * Started as a worker (`import.meta.main`), it serves calls; imported, it only exports
 * {@link runCall} and {@link serveCalls} (tests build faulty workers from them).
 * @module
 */
import { HostKvCache } from "./host_cache.ts";
import { attend, checkBatch, kvFromCall, writeKv } from "./reference.ts";
import type { ForwardBatch } from "../../core/types.ts";
import {
  type CallReply,
  type CallRequest,
  PENDING,
  toWire,
  type WarmRequest,
  WRITING,
  WRITTEN,
} from "./protocol.ts";
import { snapshotRows, writesCache } from "./undo.ts";

/** The cache write step of a call (tests substitute one that fails part-way). */
export type WriteStep = (batch: ForwardBatch, cache: HostKvCache) => void;

/** Sends a reply, transferring the listed buffers. */
export type Post = (reply: CallReply, transfer?: Transferable[]) => void;

/** The part of a worker's global scope this module uses. */
export interface WorkerScope {
  postMessage(message: unknown, transfer: Transferable[]): void;
  onmessage: ((e: MessageEvent) => void) | null;
}

/** Runs one call and posts its replies; throws (having posted nothing final) when it fails. */
export function runCall(req: CallRequest, post: Post, write: WriteStep = writeKv): void {
  const control = new Int32Array(req.control);
  const cache = req.cache ? HostKvCache.attach(req.cache) : null;
  const batch: ForwardBatch = { ...req.batch, cache };
  const t0 = performance.now();
  checkBatch(batch, cache);
  const target = cache !== null && writesCache(batch, cache) ? cache : null;
  if (target) snapshotRows(batch, target, new Uint8Array(req.undo!));
  if (Atomics.compareExchange(control, 0, PENDING, WRITING) !== PENDING) {
    post({ id: req.id, kind: "cancelled" });
    return;
  }
  if (target) write(batch, target);
  Atomics.store(control, 0, WRITTEN);
  post({ id: req.id, kind: "written" });
  const t1 = performance.now();
  const { output, lse } = attend(batch, kvFromCall(batch) ? null : cache);
  const t2 = performance.now();
  const keep = batch.return_lse ? lse : null;
  post(
    { id: req.id, kind: "done", output, lse: keep, timings: { write: t1 - t0, attend: t2 - t1 } },
    (keep ? [output.buffer, keep.buffer] : [output.buffer]) as ArrayBuffer[],
  );
}

/** Serves calls on `scope`: every error of a call comes back as a `failed` reply. */
export function serveCalls(scope: WorkerScope, write: WriteStep = writeKv): void {
  const post: Post = (reply, transfer) => scope.postMessage(reply, transfer ?? []);
  scope.onmessage = (e) => {
    if ((e.data as Partial<WarmRequest>).warm === true) return post({ id: 0, kind: "warm" });
    const req = e.data as CallRequest;
    try {
      runCall(req, post, write);
    } catch (err) {
      post({ id: req.id, kind: "failed", error: toWire(err) });
    }
  };
}

if (import.meta.main) serveCalls(self as unknown as WorkerScope);
