/**
 * A forward's queue timeout counts from when the server had its body, also where another thread
 * read it (an HTTP worker, a device thread's listener, the device-threads front): that thread
 * stamps the body it passes on (request_arrival.ts), and the thread that runs the call counts its
 * own delay in reading the message (on Deno's runtime a device thread waiting for its GPU reads
 * none) as queue time. Before, the timeout counted from the running thread's decode, so a call
 * held up for seconds behind a busy thread ran, past a 20 ms timeout. And the library option
 * `queueSince` that carries it.
 */
import assert from "node:assert/strict";
import { builtinBackends } from "../../backends/index.ts";
import { ServiceError } from "../../core/errors.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { createHandler } from "../../server/handler.ts";
import { RequestOwner } from "../../server/request_owner.ts";
import { RequestSender } from "../../server/request_sender.ts";
import { checkFromWorker } from "../../server/worker_protocol.ts";
import { AttentionService } from "../../service/service.ts";
import { QUEUE_TIMEOUT_HEADER } from "../../wire/names.ts";
import { decodeInput, fakeBackend } from "../service/helpers.ts";
import { FakeNoDevice, prefillBody } from "./helpers.ts";

/** A handler on a CPU_REFERENCE service, reached through a thread hop whose messages arrive `delayMs` late. */
function hop(delayMs: number) {
  const service = new AttentionService({
    backends: builtinBackends(),
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 24,
  });
  const ends: { owner?: RequestOwner } = {};
  const sender = new RequestSender(
    (m, t) => {
      const o = structuredClone(m, { transfer: t ?? [] });
      setTimeout(() => { // the receiving thread is busy this long before it reads its messages
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
    createHandler(service),
    () => {},
  );
  return { service, sender };
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
    // A time after now counts as now: the call runs (a timeout no scheduling delay reaches).
    await svc.forward(decodeInput(a.id, 5), {
      queueTimeoutMs: 60_000,
      queueSince: performance.now() + 1e6,
    });
    assert.equal(be.runs, 1);
  } finally {
    await svc.close();
  }
});

Deno.test("worker protocol: a body's sentAt is a finite number when given", () => {
  const body = { type: "body", id: 1, bytes: new ArrayBuffer(0), end: "complete" };
  assert.equal(typeof checkFromWorker({ ...body, sentAt: 1.5e12 }), "object");
  assert.equal(typeof checkFromWorker(body), "object");
  assert.equal(checkFromWorker({ ...body, sentAt: "now" }), "body: sentAt");
  assert.equal(checkFromWorker({ ...body, sentAt: Number.NaN }), "body: sentAt");
});
