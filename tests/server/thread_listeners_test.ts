/**
 * The device threads' listeners (server/thread_listeners.ts, `--device-threads-http`) as the
 * server main.ts drains, in process (`gpu: false`: CPU_REFERENCE): they serve the port; their
 * `finished` stays pending until `shutdown()`, which closes every thread's listener (the port
 * then refuses connections) and settles it; a drain after that gets the same result without
 * asking the threads again; a thread that never answers a drain (stand-in threads) counts as not
 * drained once the deadline and a grace have passed, so it cannot hold the process's shutdown.
 */
import assert from "node:assert/strict";
import type { HttpListenerMessage } from "../../server/device_thread.ts";
import { type ListeningThread, threadListeners } from "../../server/thread_listeners.ts";
import { startNoGpuThreads } from "./no_gpu_threads.ts";

const PENDING = Symbol("pending");

/** `p`'s value, or PENDING when it has not settled within `ms`. */
async function settledWithin<T>(p: Promise<T>, ms: number): Promise<T | typeof PENDING> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<typeof PENDING>((r) => timer = setTimeout(() => r(PENDING), ms));
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

Deno.test("thread listeners: finished settles once shutdown closed every listener", async () => {
  const front = await startNoGpuThreads(2);
  try {
    const server = await front.listen({ port: 0, hostname: "127.0.0.1", handler: front.handler });
    const url = `http://127.0.0.1:${server.addr.port}`;
    const health = await fetch(`${url}/healthz`, { headers: { connection: "close" } });
    assert.equal(health.status, 200);
    await health.body?.cancel();
    assert.equal(await settledWithin(server.finished, 200), PENDING, "pending while serving");
    await server.shutdown();
    assert.equal(await settledWithin(server.finished, 1000), undefined, "settled by shutdown");
    await assert.rejects(
      Deno.connect({ hostname: "127.0.0.1", port: server.addr.port }),
      Deno.errors.ConnectionRefused,
      "no thread listens any more",
    );
    await server.shutdown(); // again: nothing left to stop
    assert.deepEqual(await server.drain(1000), { drained: true, unfinished: 0, silent: 0 });
  } finally {
    await front.close();
  }
});

/** A stand-in thread: answers a drain with `answer`, or never (a stuck event loop). */
function fakeThread(index: number, answer: HttpListenerMessage | null): ListeningThread {
  let reply: (m: HttpListenerMessage) => void = () => {};
  return {
    index,
    lost: null,
    worker: {
      postMessage: (m: { type: string }) => {
        if (m.type === "http-drain" && answer) queueMicrotask(() => reply(answer));
      },
    } as unknown as Worker,
    nextListenerMessage: () => new Promise((r) => (reply = r)),
  };
}

Deno.test("thread listeners: a thread silent past the drain's deadline cannot hold shutdown", async () => {
  const threads = [
    fakeThread(0, { type: "http-drained", drained: true, unfinished: 0 }),
    fakeThread(1, null),
    fakeThread(2, { type: "http-drained", drained: false, unfinished: 2 }),
  ];
  const l = threadListeners(threads, { hostname: "127.0.0.1", port: 1 }, 50);
  const t0 = performance.now();
  const r = await settledWithin(l.drain(100), 5000);
  const ms = performance.now() - t0;
  assert.deepEqual(r, { drained: false, unfinished: 2, silent: 1 });
  assert.ok(ms >= 140 && ms < 2000, `answered after ${ms.toFixed(0)} ms (deadline 100 + grace 50)`);
  assert.equal(await settledWithin(l.finished, 100), undefined, "finished settles");
  // Every thread answering: drained, nothing silent, no wait for the grace.
  const ok = threadListeners([
    fakeThread(0, { type: "http-drained", drained: true, unfinished: 0 }),
  ], {
    hostname: "127.0.0.1",
    port: 1,
  }, 10_000);
  const t1 = performance.now();
  assert.deepEqual(await ok.drain(60_000), { drained: true, unfinished: 0, silent: 0 });
  assert.ok(performance.now() - t1 < 1000, "no wait for a deadline when all answer");
});
