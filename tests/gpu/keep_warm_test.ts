/**
 * gpu/keep_warm.ts: knob checks, the start-up decision from the measured completion round trip,
 * the spin window (spins while used, stops after `hold_ms`, never after close) and the report.
 * @module
 */
import assert from "node:assert/strict";
import {
  checkKeepWarmOptions,
  KEEP_WARM_DEFAULTS,
  KeepWarmProvider,
  MAX_ROUND_TRIP_MS,
} from "../../gpu/keep_warm.ts";
import { GPU_TEST } from "./helpers.ts";
import { MANAGER } from "../support/gpu.ts";

const until = async (f: () => boolean, ms: number) => {
  const t0 = performance.now();
  while (!f() && performance.now() - t0 < ms) await new Promise((r) => setTimeout(r, 5));
  return f();
};

Deno.test("keep-warm knobs out of range are refused, naming the knob and value", () => {
  assert.throws(
    () => checkKeepWarmOptions({ ...KEEP_WARM_DEFAULTS, depth: 9 }),
    { message: "keep-warm depth must be an integer in [1, 8], got 9" },
  );
  assert.throws(
    () => checkKeepWarmOptions({ ...KEEP_WARM_DEFAULTS, spin_iters: 0 }),
    /keep-warm spin_iters must be an integer in \[1, 10000000\], got 0/,
  );
  assert.throws(() => checkKeepWarmOptions({ ...KEEP_WARM_DEFAULTS, hold_ms: 1.5 }), /got 1\.5/);
});

Deno.test("keep-warm with hold 0 stays off and never spins", GPU_TEST, async () => {
  const w = new KeepWarmProvider(MANAGER, { ...KEEP_WARM_DEFAULTS, hold_ms: 0 });
  const st = await w.start();
  assert.deepEqual([st.enabled, st.reason], [false, "hold_ms is 0"]);
  assert(w.current() === MANAGER.current());
  await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(w.stats().dispatches, 0);
});

Deno.test(
  "keep-warm turns on only where the completion round trip is short",
  GPU_TEST,
  async () => {
    const w = new KeepWarmProvider(MANAGER, { ...KEEP_WARM_DEFAULTS, hold_ms: 50 });
    const st = await w.start();
    const rt = st.round_trip_ms!;
    assert(rt > 0, `round trip ${rt}`);
    assert.deepEqual(st.enabled, rt <= MAX_ROUND_TRIP_MS);
    if (!st.enabled) assert.match(st.reason!, /completion round trip is \d+\.\d\d ms \(over 1 ms/);
    await w.close();
  },
);

Deno.test(
  "keep-warm spins while the device is used, stops after the hold, never after close",
  GPU_TEST,
  async () => {
    const w = new KeepWarmProvider(
      MANAGER,
      { hold_ms: 150, spin_iters: 64, workgroups: 2, depth: 2 },
      { max_round_trip_ms: Infinity },
    );
    assert((await w.start()).enabled);
    assert.deepEqual(w.stats().dispatches, 0);
    const ctx = w.current(); // a use of the device opens the window
    assert(ctx !== null && ctx === MANAGER.current());
    assert(
      await until(() => w.stats().dispatches >= 2, 3000),
      `dispatches ${w.stats().dispatches}`,
    );
    assert(await until(() => !w.stats().spinning, 10_000), "still spinning after the hold");
    const n = w.stats().dispatches;
    await new Promise((r) => setTimeout(r, 60));
    assert.deepEqual(w.stats().dispatches, n, "spun after the hold");
    const rep = w.report();
    assert.deepEqual(rep.runtime, MANAGER.report().runtime);
    assert.deepEqual(rep.keep_warm?.options, {
      hold_ms: 150,
      spin_iters: 64,
      workgroups: 2,
      depth: 2,
    });
    await w.close();
    w.current();
    await new Promise((r) => setTimeout(r, 60));
    assert.deepEqual(w.stats().dispatches, n, "spun after close");
  },
);
