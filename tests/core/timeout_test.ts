/** core/timeout.ts: the value when the promise wins, "timeout" when the timer does, no timer left. */
import assert from "node:assert/strict";
import { raceTimeout } from "../../core/timeout.ts";

Deno.test("raceTimeout: the promise's value when it settles first", async () => {
  assert.equal(await raceTimeout(Promise.resolve(7), 1000), 7);
  const late = new Promise<string>((r) => setTimeout(() => r("late"), 5));
  assert.equal(await raceTimeout(late, 1000), "late");
});

Deno.test('raceTimeout: "timeout" when the timer fires first; a rejection still rejects', async () => {
  const never = new Promise<number>(() => {});
  const t0 = performance.now();
  assert.equal(await raceTimeout(never, 20), "timeout");
  assert.ok(performance.now() - t0 >= 15, "waited for the timer");
  await assert.rejects(raceTimeout(Promise.reject(new Error("no")), 1000), /no/);
});
