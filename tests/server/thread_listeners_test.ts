/**
 * The device threads' listeners (server/thread_listeners.ts, `--device-threads-http`) as the
 * server main.ts drains, in process (`gpu: false`: CPU_REFERENCE): they serve the port; their
 * `finished` stays pending until `shutdown()`, which closes every thread's listener (the port
 * then refuses connections) and settles it; a drain after that gets the same result without
 * asking the threads again.
 */
import assert from "node:assert/strict";
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
    assert.deepEqual(await server.drain(1000), { drained: true, unfinished: 0 });
  } finally {
    await front.close();
  }
});
