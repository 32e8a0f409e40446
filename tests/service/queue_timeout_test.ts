/**
 * A forward's queue timeout (core/queue_timeout.ts): a call that waited past it behind another
 * call on its cache does not run and writes nothing; one that starts in time runs; a bad option
 * is a 400 naming it.
 */
import assert from "node:assert/strict";
import { ServiceError } from "../../core/errors.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { AttentionService } from "../../service/service.ts";
import { FakeNoDevice } from "../server/helpers.ts";
import { decodeInput, deferred, type FakeBackend, fakeBackend } from "./helpers.ts";

const decode = decodeInput;

const CACHE = { num_blocks: 4, block_size: 4, num_kv_heads: 1, head_size: 4, dtype: "float32" };

function setup(): { svc: AttentionService; be: FakeBackend } {
  const be = fakeBackend();
  const svc = new AttentionService({
    backends: [be as AttentionBackend],
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 20,
  });
  return { svc, be };
}

/** A cache whose first call (slot 4) runs and is held until `release`. */
async function gatedFirst() {
  const { svc, be } = setup();
  const a = await svc.createCache(CACHE as never);
  const gate = deferred(), started = deferred();
  be.gate = gate.promise;
  be.onRunStart = () => started.resolve();
  const first = svc.forward(decode(a.id, 4));
  await started.promise;
  return { svc, be, a, first, release: () => gate.resolve() };
}

/** Sum of the cache's K bytes the fake backend writes (1 per slot a run wrote). */
const written = (be: FakeBackend) => be.created[0].key.reduce((n, x) => n + x, 0);

Deno.test("queue timeout: a call past it behind its cache's call is answered at once and never runs", async () => {
  const { svc, be, a, first, release } = await gatedFirst();
  const queued = svc.forward(decode(a.id, 6), { queueTimeoutMs: 5 }).then(() => null, (x) => x);
  // Answered once the timeout passes, while the first call still holds the cache.
  const e = await queued;
  release();
  await first;
  await new Promise((r) => setTimeout(r, 10)); // its turn came: it must still do nothing
  assert.ok(e instanceof ServiceError, `expected a ServiceError, got ${e}`);
  assert.equal(e.status, 503);
  assert.equal(e.code, "queue_timeout");
  assert.equal(e.extra?.queue_timeout_ms, 5);
  assert.ok((e.extra?.waited_ms as number) > 5, `waited_ms ${e.extra?.waited_ms}`);
  assert.equal(e.extra?.retryable, true);
  assert.match(e.message, /did not run: nothing was written/);
  assert.equal(be.runs, 1, "the timed-out call reached no backend");
  assert.equal(written(be), 1, "only the first call wrote");
});

Deno.test("queue timeout: a call that starts within it runs and writes", async () => {
  const { svc, be, a, first, release } = await gatedFirst();
  const queued = svc.forward(decode(a.id, 6), { queueTimeoutMs: 60_000 });
  await new Promise((r) => setTimeout(r, 10));
  release();
  await first;
  await queued;
  assert.equal(be.runs, 2);
  assert.equal(written(be), 2);
});

Deno.test("queue timeout: a bad library option is a 400 naming queueTimeoutMs, and nothing runs", async () => {
  const { svc, be } = setup();
  const a = await svc.createCache(CACHE as never);
  for (const bad of [0, -1, NaN, Infinity, 2 ** 31, "5", null]) {
    await assert.rejects(
      svc.forward(decode(a.id, 4), { queueTimeoutMs: bad as number }),
      (e) =>
        e instanceof ServiceError && e.status === 400 && e.code === "invalid_request" &&
        JSON.stringify(e.issues?.[0]?.path) === '["queueTimeoutMs"]' &&
        e.message.includes(`got ${typeof bad === "string" ? '"5"' : String(bad)}`),
      `queueTimeoutMs ${String(bad)}`,
    );
  }
  assert.equal(be.runs, 0);
  assert.equal(written(be), 0);
});
