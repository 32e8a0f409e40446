/**
 * Faulty CPU workers for tests/backends/cpu/pool_test.ts: the real protocol and computation
 * (backends/cpu/worker.ts) with a cache write step that fails part-way. {@link faultyWorkerUrl}
 * gives a worker module URL for a pool's `workerUrl`.
 *
 * - `throw`: writes the first key row, then throws a TypeError (caught: a `failed` reply).
 * - `crash`: on calls with `return_lse: false`, writes the first key row, then throws out of
 *   the message handler: the worker dies with an uncaught error. Other calls run normally.
 * - `slow`: writes the first key row, sleeps `SLOW_WRITE_MS`, then writes everything.
 * @module
 */
import type { HostKvCache } from "../../../backends/cpu/host_cache.ts";
import { writeKv } from "../../../backends/cpu/reference.ts";
import type { ForwardBatch } from "../../../core/types.ts";
import type { CallRequest } from "../../../backends/cpu/protocol.ts";
import { type Post, runCall, serveCalls, type WorkerScope } from "../../../backends/cpu/worker.ts";

/** How long the `slow` write sleeps between its first row and the rest. */
export const SLOW_WRITE_MS = 400;

/** Which fault. */
export type Fault = "throw" | "crash" | "slow";

/** Writes only the call's first key row (its first token), as a write cut short would. */
function writeFirstRow(b: ForwardBatch, c: HostKvCache): void {
  const row = b.layer.num_kv_heads * b.layer.head_size;
  writeKv({
    ...b,
    key: b.key!.subarray(0, row),
    value: b.value!.subarray(0, row),
    metadata: { ...b.metadata, slot_mapping: b.metadata.slot_mapping.subarray(0, 1) },
  }, c);
}

/** Serves calls with `fault` on this worker's scope. */
export function serveFaulty(fault: Fault): void {
  const scope = self as unknown as WorkerScope;
  if (fault === "throw") {
    return serveCalls(scope, (b, c) => {
      writeFirstRow(b, c);
      throw new TypeError("injected fault after the first row");
    });
  }
  if (fault === "slow") {
    return serveCalls(scope, (b, c) => {
      writeFirstRow(b, c);
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, SLOW_WRITE_MS);
      writeKv(b, c);
    });
  }
  const post: Post = (reply, transfer) => scope.postMessage(reply, transfer ?? []);
  scope.onmessage = (e) => {
    if ((e.data as { warm?: boolean }).warm) return post({ id: 0, kind: "warm" });
    const req = e.data as CallRequest;
    if (req.batch.return_lse) return runCall(req, post);
    // No try/catch: the error escapes the handler and kills the worker.
    runCall(req, post, (b, c) => {
      writeFirstRow(b, c);
      throw new Error("injected crash after the first row");
    });
  };
}

/** A module URL that starts a worker with `fault` (revoke it with URL.revokeObjectURL). */
export function faultyWorkerUrl(fault: Fault): URL {
  const src = `import { serveFaulty } from ${JSON.stringify(import.meta.url)};\n` +
    `serveFaulty(${JSON.stringify(fault)});\n`;
  return new URL(URL.createObjectURL(new Blob([src], { type: "application/javascript" })));
}
