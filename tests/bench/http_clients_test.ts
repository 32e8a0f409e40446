/**
 * The concurrent clients' start barrier (bench/http_clients.ts startTogether): every worker
 * builds its bodies (and, from v0.36, makes its untimed warm-up calls) before it says it is
 * ready; one that fails first answers `done` without `ready`, which must not hold the others
 * at the barrier forever.
 * @module
 */
import assert from "node:assert/strict";
import { startTogether } from "../../bench/http_clients.ts";

/** A module worker from source text. */
function worker(source: string): Worker {
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  return new Worker(url, { type: "module" });
}

const READY_THEN_DONE = `
self.onmessage = (e) => {
  if (e.data.kind === "go") { self.postMessage({ kind: "done", ok: self.job }); return; }
  self.job = e.data.job;
  self.postMessage({ kind: "ready" });
};`;
const FAILS_BEFORE_READY = `
self.onmessage = (e) => {
  if (e.data.kind !== "go") self.postMessage({ kind: "done", error: "warm-up failed" });
};`;

Deno.test("startTogether: a worker that fails before it is ready does not hold the barrier", async () => {
  const ws = [worker(READY_THEN_DONE), worker(FAILS_BEFORE_READY), worker(READY_THEN_DONE)];
  try {
    const run = startTogether(
      ws,
      [0, 1, 2].map((job) => ({ kind: "job", job })),
      (error) => ({ kind: "done", error }),
    );
    const timeout = new Promise<never>((_, reject) => {
      const id = setTimeout(() => reject(new Error("the barrier never opened")), 10_000);
      run.finally(() => clearTimeout(id));
    });
    const { done } = await Promise.race([run, timeout]);
    assert.deepEqual(done, [
      { kind: "done", ok: 0 },
      { kind: "done", error: "warm-up failed" },
      { kind: "done", ok: 2 },
    ]);
  } finally {
    for (const w of ws) w.terminate();
  }
});
