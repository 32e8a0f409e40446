/**
 * A forward's queue timeout counts the time its body waited between threads (an HTTP worker, a
 * device thread's listener or the device-threads front read it, another thread runs it): each
 * thread that passes a body on stamps it (request_arrival.ts), and the one that takes it measures
 * the hop as its event loop reads the message (on Deno's runtime a device thread waiting for its
 * GPU reads none). Before, a call held up for seconds behind a busy thread ran, past a 40 ms
 * timeout. Reading and decoding a body are not waits (a first version counted a JSON decode on
 * the running thread: a large body through HTTP workers timed out on an idle server). And the
 * library option `queueSince` that carries it.
 */
import assert from "node:assert/strict";
import { builtinBackends } from "../../backends/index.ts";
import { ServiceError } from "../../core/errors.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { createHandler } from "../../server/handler.ts";
import { RequestOwner } from "../../server/request_owner.ts";
import { RequestSender } from "../../server/request_sender.ts";
import { waitedBetweenThreads } from "../../server/request_arrival.ts";
import { raceTimeout } from "../../core/timeout.ts";
import { checkFromWorker } from "../../server/worker_protocol.ts";
import { AttentionService } from "../../service/service.ts";
import { QUEUE_TIMEOUT_HEADER } from "../../wire/names.ts";
import { decodeInput, deferred, fakeBackend } from "../service/helpers.ts";
import { FakeNoDevice, prefillBody } from "./helpers.ts";

/**
 * A thread hop in one isolate: a RequestSender whose messages reach a RequestOwner running
 * `handler` `delayMs` late (the receiving thread busy that long before it reads them).
 */
function link(delayMs: number, handler: (req: Request) => Promise<Response>): RequestSender {
  const ends: { owner?: RequestOwner } = {};
  const sender = new RequestSender(
    (m, t) => {
      const o = structuredClone(m, { transfer: t ?? [] });
      setTimeout(() => {
        if (o.type === "head") ends.owner!.head(o);
        else if (o.type === "body") ends.owner!.body(o);
        else if (o.type === "abort") ends.owner!.abort(o.id);
      }, delayMs);
    },
    1 << 26,
    () => true,
  );
  ends.owner = new RequestOwner(
    (m, t) => queueMicrotask(() => sender.receive(structuredClone(m, { transfer: t }))),
    handler,
    () => {},
  );
  return sender;
}

/** A handler on a CPU_REFERENCE service, reached through a hop `delayMs` late. */
function hop(delayMs: number) {
  const service = new AttentionService({
    backends: builtinBackends(),
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 24,
  });
  return { service, sender: link(delayMs, createHandler(service)) };
}

const SPEC = { num_blocks: 2, block_size: 16, num_kv_heads: 2, head_size: 32, dtype: "float32" };

async function forwardThrough(delayMs: number, timeoutMs: string) {
  const { service, sender } = hop(delayMs);
  const info = await service.createCache(SPEC as never);
  const body = { ...prefillBody({ h: 4, hkv: 2, d: 32, bs: 16, t: 3 }), kv_cache: info.id };
  const res = await sender.send(
    new Request(`http://127.0.0.1/v1/kv-caches/${info.id}/forward`, {
      method: "POST",
      headers: { "content-type": "application/json", [QUEUE_TIMEOUT_HEADER]: timeoutMs },
      body: JSON.stringify(body),
    }),
  );
  const doc = await res.json();
  const data = await service.cacheData(info.id);
  const keys = new Float32Array(data.key.slice().buffer, 0, 3 * 2 * 32);
  await service.close();
  return { status: res.status, doc, written: keys.some((x) => x !== 0) };
}

Deno.test("queue timeout across a thread hop: the receiving thread's delay counts", async () => {
  const late = await forwardThrough(150, "40");
  assert.equal(late.status, 503, `answered ${late.status} ${late.doc.code ?? ""}`);
  assert.equal(late.doc.code, "queue_timeout");
  assert.equal(late.doc.queue_timeout_ms, 40);
  assert.ok(late.doc.waited_ms >= 100, `waited_ms ${late.doc.waited_ms}: the hop's 150 ms count`);
  assert.equal(late.written, false, "the timed-out call wrote nothing");
  const inTime = await forwardThrough(150, "60000");
  assert.equal(inTime.status, 200, `answered ${inTime.status} ${inTime.doc.code ?? ""}`);
  assert.equal(inTime.written, true);
});

/** What a handler behind the hops saw as the body's wait between threads, ms. */
async function waitSeen(delays: number[]): Promise<number> {
  let seen = -1;
  let next: (req: Request) => Promise<Response> = async (req) => {
    await req.arrayBuffer(); // the body read (and decoded) first, as the forward route does
    seen = waitedBetweenThreads(req);
    return new Response("ok");
  };
  // Built from the last hop back: each earlier hop's handler passes the request on.
  for (const d of delays.toReversed()) {
    const sender = link(d, next);
    next = (req) => sender.send(req);
  }
  const res = await next(
    new Request("http://h/v1/attention/forward", {
      method: "POST",
      body: new Uint8Array(1 << 20),
    }),
  );
  assert.equal(await res.text(), "ok");
  return seen;
}

Deno.test("queue timeout across hops: each hop's wait counts once, reading never", async () => {
  const one = await waitSeen([150]);
  assert.ok(one >= 140 && one < 1000, `one hop 150 ms late: ${one} ms`);
  // The front passes a listener's call on: the first hop's wait is carried, the second's added.
  const two = await waitSeen([150, 0]);
  assert.ok(two >= 140 && two < 1000, `first of two hops 150 ms late: ${two} ms`);
  const both = await waitSeen([150, 100]);
  assert.ok(both >= 240 && both < 1000, `150 + 100 ms: ${both} ms`);
  // Hops read at once count (about) nothing: the read of a 1 MiB body is not a wait.
  const none = await waitSeen([0, 0]);
  assert.ok(none <= 20, `no hop late: ${none} ms`);
});

Deno.test("queueSince: the library's timeout counts from it; a bad one is a 400 naming it", async () => {
  const be = fakeBackend();
  const svc = new AttentionService({
    backends: [be as AttentionBackend],
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 20,
  });
  try {
    const a = await svc.createCache(
      { num_blocks: 4, block_size: 4, num_kv_heads: 1, head_size: 4, dtype: "float32" } as never,
    );
    const past = await svc.forward(decodeInput(a.id, 4), {
      queueTimeoutMs: 10,
      queueSince: performance.now() - 50,
    }).then(() => null, (e) => e);
    assert.ok(past instanceof ServiceError && past.code === "queue_timeout", String(past));
    assert.ok((past.extra?.waited_ms as number) >= 50, `waited_ms ${past.extra?.waited_ms}`);
    assert.equal(be.runs, 0, "it reached no backend");
    for (const bad of [Number.NaN, Infinity, "1"]) {
      const e = await svc.forward(decodeInput(a.id, 4), { queueSince: bad as number })
        .then(() => null, (x) => x);
      assert.ok(e instanceof ServiceError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.code, "invalid_request");
      assert.deepEqual(e.issues?.[0]?.path, ["queueSince"]);
    }
    // A time after now counts as now: behind a call that holds the cache, a 20 ms timeout from
    // a queueSince 1,000 s ahead passes 20 ms from now, not in 1,000 s.
    const gate = deferred(), started = deferred();
    be.gate = gate.promise;
    be.onRunStart = () => started.resolve();
    const first = svc.forward(decodeInput(a.id, 5));
    await started.promise;
    const ahead = svc.forward(decodeInput(a.id, 6), {
      queueTimeoutMs: 20,
      queueSince: performance.now() + 1e6,
    }).then(() => null, (e) => e);
    const got = await raceTimeout(ahead, 10_000);
    gate.resolve();
    await first;
    assert.ok(got instanceof ServiceError && got.code === "queue_timeout", String(got));
    assert.equal(be.runs, 1, "only the first call ran");
  } finally {
    await svc.close();
  }
});

Deno.test("worker protocol: a body's sentAt, waitedMs and readMs are finite numbers when given", () => {
  const body = { type: "body", id: 1, bytes: new ArrayBuffer(0), end: "complete" };
  assert.equal(typeof checkFromWorker({ ...body, sentAt: 1.5e12 }), "object");
  assert.equal(typeof checkFromWorker(body), "object");
  assert.equal(checkFromWorker({ ...body, sentAt: "now" }), "body: sentAt");
  assert.equal(checkFromWorker({ ...body, sentAt: Number.NaN }), "body: sentAt");
  assert.equal(typeof checkFromWorker({ ...body, waitedMs: 0 }), "object");
  for (const bad of [-1, Infinity, Number.NaN, "3"]) {
    assert.equal(checkFromWorker({ ...body, waitedMs: bad }), "body: waitedMs");
  }
  // readMs (what an earlier thread spent reading the body) by the same rule.
  assert.equal(typeof checkFromWorker({ ...body, readMs: 2.5 }), "object");
  for (const bad of [-1, Infinity, Number.NaN, "3"]) {
    assert.equal(checkFromWorker({ ...body, readMs: bad }), "body: readMs");
  }
});
