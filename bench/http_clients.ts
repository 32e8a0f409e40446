/**
 * The concurrent decode clients of the HTTP bench: one Web Worker per client
 * (bench/http_client_worker.ts), each with its own thread, event loop and keep-alive
 * connection, so the clients' own JS does not share one thread. All build their bodies first;
 * the clock starts when the last is ready and stops when the last is done.
 * @module
 */
import type { DecodeJob, DecodeResult } from "./http_client.ts";

/** Runs each job in its own worker: all build their bodies, then start together. */
export async function concurrently(
  jobs: DecodeJob[],
): Promise<{ results: DecodeResult[]; wall_ms: number }> {
  const workers = jobs.map(() =>
    new Worker(new URL("./http_client_worker.ts", import.meta.url).href, { type: "module" })
  );
  try {
    const ready: Promise<void>[] = [], done: Promise<DecodeResult>[] = [];
    for (const w of workers) {
      let onReady = () => {}, onDone = (_: DecodeResult) => {};
      ready.push(new Promise<void>((resolve) => onReady = resolve));
      done.push(new Promise<DecodeResult>((resolve) => onDone = resolve));
      w.onmessage = (e) => e.data.kind === "ready" ? onReady() : onDone(e.data.result);
      w.onerror = (e) => {
        e.preventDefault();
        onReady();
        onDone({ calls: [], error: `client worker failed: ${e.message}` });
      };
    }
    workers.forEach((w, i) => w.postMessage({ kind: "job", job: jobs[i] }));
    await Promise.all(ready);
    const t0 = performance.now();
    for (const w of workers) w.postMessage({ kind: "go" });
    const results = await Promise.all(done);
    return { results, wall_ms: performance.now() - t0 };
  } finally {
    for (const w of workers) w.terminate();
  }
}
