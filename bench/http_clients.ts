/**
 * The concurrent decode clients of the HTTP bench: one Web Worker per client
 * (bench/http_client_worker.ts), each with its own thread, event loop and keep-alive
 * connection, so the clients' own JS does not share one thread. All build their bodies first;
 * the clock starts when the last is ready and stops when the last is done.
 * @module
 */
import type { DecodeJob, DecodeResult } from "./http_client.ts";

/**
 * The start barrier of concurrent client workers: posts each worker its job message, waits
 * until every one answers `{kind: "ready"}` (its requests built), then posts `{kind: "go"}` to
 * all at once and collects each one's next message. `wall_ms` runs from the go to the last
 * answer. A worker that fails answers `failed(its error message)`, ready or not. The workers
 * are the caller's to terminate. `beforeGo` runs once all are ready, before the go.
 */
export async function startTogether<D>(
  workers: Worker[],
  jobs: unknown[],
  failed: (message: string) => D,
  beforeGo: () => Promise<void> = () => Promise.resolve(),
): Promise<{ done: D[]; wall_ms: number }> {
  const ready: Promise<void>[] = [], done: Promise<D>[] = [];
  for (const w of workers) {
    let onReady = () => {}, onDone = (_: D) => {};
    ready.push(new Promise<void>((resolve) => onReady = resolve));
    done.push(new Promise<D>((resolve) => onDone = resolve));
    // A worker that failed before it was ready answers at once: that counts as ready too.
    w.onmessage = (e) => {
      onReady();
      if (e.data?.kind !== "ready") onDone(e.data);
    };
    w.onerror = (e) => {
      e.preventDefault();
      onReady();
      onDone(failed(`client worker failed: ${e.message}`));
    };
  }
  workers.forEach((w, i) => w.postMessage(jobs[i]));
  await Promise.all(ready);
  await beforeGo();
  const t0 = performance.now();
  for (const w of workers) w.postMessage({ kind: "go" });
  const answers = await Promise.all(done);
  return { done: answers, wall_ms: performance.now() - t0 };
}

/**
 * Runs each job in its own worker: all build their bodies, then start together (`beforeGo`
 * just before the start).
 */
export async function concurrently(
  jobs: DecodeJob[],
  beforeGo?: () => Promise<void>,
): Promise<{ results: DecodeResult[]; wall_ms: number }> {
  const workers = jobs.map(() =>
    new Worker(new URL("./http_client_worker.ts", import.meta.url).href, { type: "module" })
  );
  try {
    const { done, wall_ms } = await startTogether<{ result: DecodeResult }>(
      workers,
      jobs.map((job) => ({ kind: "job", job })),
      (error) => ({ result: { calls: [], error } }),
      beforeGo,
    );
    return { results: done.map((d) => d.result), wall_ms };
  } finally {
    for (const w of workers) w.terminate();
  }
}
