/**
 * A queue timeout's timer (core/queue_timeout.ts atDeadline, used by StartGate.race and the CPU
 * pool's queue): a timer that fires early is set again, so a 503 `queue_timeout` never says it
 * waited less than its timeout. Deno's `setTimeout(5)` once fired after 4.62 ms, and the answer read
 * "waited 4.6 ms, past its queue timeout of 5 ms" (tests/server/queue_timeout_http_test.ts, now
 * and then).
 */
import assert from "node:assert/strict";
import {
  atDeadline,
  checkQueueTimeoutMs,
  queueSinceOf,
  StartGate,
} from "../../core/queue_timeout.ts";
import { QueueTimeoutError, ServiceError } from "../../core/errors.ts";

/** Runs `body` with setTimeout firing its first timer at a fifth of its delay. */
async function withEarlyTimer<T>(body: () => Promise<T>): Promise<T> {
  const real = globalThis.setTimeout;
  let first = true;
  globalThis.setTimeout = ((fn: () => void, ms?: number) => {
    const early = first ? (ms ?? 0) / 5 : ms;
    first = false;
    return real(fn, early);
  }) as typeof setTimeout;
  try {
    return await body();
  } finally {
    globalThis.setTimeout = real;
  }
}

Deno.test("atDeadline: an early timer is set again; it fires once the deadline passed", async () => {
  const since = performance.now();
  const now = await withEarlyTimer(() =>
    new Promise<number>((resolve) => atDeadline({ since, timeoutMs: 50 }, resolve))
  );
  assert.ok(now - since > 50, `fired after ${(now - since).toFixed(2)} ms of 50`);
  assert.ok(performance.now() - since > 50);
});

Deno.test("atDeadline: cancelled, it never fires (the first timer or a later one)", async () => {
  let fired = false;
  const cancel = atDeadline({ since: performance.now(), timeoutMs: 10 }, () => fired = true);
  cancel();
  await withEarlyTimer(async () => {
    const again = atDeadline({ since: performance.now(), timeoutMs: 30 }, () => fired = true);
    await new Promise((r) => setTimeout(r, 12)); // past the early first timer (6 ms)
    again();
  });
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(fired, false);
});

Deno.test("StartGate.race: its 503 never says less than the timeout was waited", async () => {
  const gate = new StartGate(50, performance.now());
  const e = await withEarlyTimer(() => gate.race(new Promise<never>(() => {})).catch((x) => x));
  assert.ok(e instanceof QueueTimeoutError, String(e));
  assert.ok((e.extra?.waited_ms as number) > 50, `waited_ms ${e.extra?.waited_ms}`);
});

Deno.test("queue timeout options: any value is refused as a 400 naming it, never a TypeError", () => {
  const cycle: Record<string, unknown> = {};
  cycle.self = cycle;
  for (const bad of [10n, cycle, Object.create(null), [1, 2], "5", Symbol("s")]) {
    for (const check of [() => checkQueueTimeoutMs(bad), () => queueSinceOf(bad, 0)]) {
      assert.throws(check, (e: unknown) => {
        assert.ok(e instanceof ServiceError, `${String(e)}`);
        assert.equal(e.status, 400);
        assert.equal(e.code, "invalid_request");
        return true;
      });
    }
  }
  assert.match(
    (() => {
      try {
        checkQueueTimeoutMs(10n);
      } catch (e) {
        return (e as Error).message;
      }
      return "";
    })(),
    /got 10$/,
  );
});
