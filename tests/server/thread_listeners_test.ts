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
import { ORIGIN_HEADER } from "../../server/thread_http.ts";
import { startNoGpuThreads } from "./no_gpu_threads.ts";
import { HeldSeq } from "./held_seq.ts";
import { answerOn, rawRequest } from "./raw_http.ts";

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
    assert.deepEqual(await server.drain(1000), {
      drained: true,
      unfinished: 0,
      refused: 0,
      silent: 0,
    });
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
    stopped: new Promise(() => {}),
    calls: new Int32Array(1),
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
    fakeThread(0, { type: "http-drained", drained: true, unfinished: 0, refused: 3 }),
    fakeThread(1, null),
    fakeThread(2, { type: "http-drained", drained: false, unfinished: 2, refused: 4 }),
  ];
  const l = threadListeners(threads, { hostname: "127.0.0.1", port: 1 }, 50);
  const t0 = performance.now();
  const r = await settledWithin(l.drain(100), 5000);
  const ms = performance.now() - t0;
  assert.deepEqual(r, { drained: false, unfinished: 2, refused: 7, silent: 1 });
  assert.ok(ms >= 140 && ms < 2000, `answered after ${ms.toFixed(0)} ms (deadline 100 + grace 50)`);
  assert.equal(await settledWithin(l.finished, 100), undefined, "finished settles");
  // Every thread answering: drained, nothing silent, no wait for the grace.
  const ok = threadListeners([
    fakeThread(0, { type: "http-drained", drained: true, unfinished: 0, refused: 0 }),
  ], {
    hostname: "127.0.0.1",
    port: 1,
  }, 10_000);
  const t1 = performance.now();
  assert.deepEqual(await ok.drain(60_000), { drained: true, unfinished: 0, refused: 0, silent: 0 });
  assert.ok(performance.now() - t1 < 1000, "no wait for a deadline when all answer");
});

/** A call a thread passed to the front's handler: the thread (creates name it), the answer. */
interface Passed {
  thread: number | undefined;
  answer: Promise<Response>;
}

/**
 * A call passed to the front whose body stops after its first bytes (its thread posts the head
 * at once, the body once its read ends: the body timeout, 60 s), then its thread stops: the
 * front's handler must end it at once, a 503. `path`: where it goes, given a cache of the other
 * thread (a create ends in the front's own read, a cache's call in the read of its send on).
 */
async function lostBeforeTheBody(method: string, path: (other: string) => string) {
  const front = await startNoGpuThreads(2);
  const waits = new Map<string, (p: Passed) => void>();
  const passedOn = (key: string) => new Promise<Passed>((r) => waits.set(key, r));
  const handler = (req: Request) => {
    const answer = front.handler(req);
    const copy = answer.then((r) => r.clone()); // the original goes back to the thread
    const origin = req.headers.get(ORIGIN_HEADER);
    const thread = origin === null ? undefined : Number(origin.split(" ")[0]);
    waits.get(`${req.method} ${new URL(req.url).pathname}`)?.({ thread, answer: copy });
    return answer.then(async (r) => (await copy, r));
  };
  const server = await front.listen({ port: 0, hostname: "127.0.0.1", handler });
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
  try {
    // A create over `conn` says which thread serves it (and puts a cache there); one made on
    // the front then goes to the other thread (the fewest caches).
    const spec = JSON.stringify(HeldSeq.cacheSpec());
    const json = { "content-type": "application/json" };
    const created = passedOn("POST /v1/kv-caches");
    await conn.write(rawRequest("POST", "/v1/kv-caches", {
      ...json,
      "content-length": String(new TextEncoder().encode(spec).length),
      connection: "keep-alive",
    }, spec));
    const thread = (await created).thread!;
    assert.equal((await answerOn(conn)).status, 201);
    const elsewhere = await front.handler(
      new Request("http://127.0.0.1/v1/kv-caches", { method: "POST", headers: json, body: spec }),
    );
    assert.equal(elsewhere.status, 201);
    const other: string = (await elsewhere.json()).id;
    const stalled = passedOn(`${method} ${path(other)}`);
    await conn.write(rawRequest(method, path(other), {
      ...json,
      "content-length": "1000",
    }, '{"num_blocks":'));
    const { answer } = await stalled;
    front.fault(thread);
    const res = await settledWithin(answer, 2000);
    assert.notEqual(res, PENDING, `the front still waits for the body thread ${thread} never sent`);
    const r = res as Response;
    assert.equal(r.status, 503);
    const doc = await r.json();
    assert.equal(doc.code, "device_thread_lost");
    assert.match(doc.detail, new RegExp(`^device thread ${thread} stopped: .*; a call it took`));
    assert.equal(doc.device_thread, thread);
    assert.equal(doc.error_id, undefined, "not logged again (the crash was)");
  } finally {
    conn.close();
    await server.shutdown();
    await front.close();
  }
}

Deno.test(
  "thread listeners: a thread that stops before the body of a create it passed on: 503",
  () => lostBeforeTheBody("POST", () => "/v1/kv-caches"),
);

Deno.test(
  "thread listeners: a thread that stops before the body of another's cache call: 503",
  () => lostBeforeTheBody("POST", (other) => `/v1/kv-caches/${other}/forward`),
);
