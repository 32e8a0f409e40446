/**
 * gpu/keep_warm.ts: knob checks, the start-up decision from the measured completion round trip,
 * the spin window in both modes (spins while used, stops after `hold_ms`, never after close), the
 * timer mode's lack of pending waits and its queue bound, and the report.
 * @module
 */
import assert from "node:assert/strict";
import {
  checkKeepWarmOptions,
  KEEP_WARM_DEFAULTS,
  type KeepWarmMode,
  KeepWarmProvider,
  MAX_ROUND_TRIP_MS,
} from "../../gpu/keep_warm.ts";
import {
  CALIBRATION_MARGIN,
  MAX_TICKS_QUEUED,
  MIN_SPIN_MS,
  SLOW_CLOCK_FACTOR,
  SpinPacer,
} from "../../gpu/keep_warm_pace.ts";
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
  assert.throws(
    () => checkKeepWarmOptions({ ...KEEP_WARM_DEFAULTS, period_ms: 0 }),
    { message: "keep-warm period_ms must be an integer in [1, 1000], got 0" },
  );
  assert.throws(
    () => checkKeepWarmOptions({ ...KEEP_WARM_DEFAULTS, mode: "busy" as KeepWarmMode }),
    { message: "keep-warm mode must be one of timer, await, process, got busy" },
  );
  assert.deepEqual(
    [KEEP_WARM_DEFAULTS.mode, KEEP_WARM_DEFAULTS.period_ms, KEEP_WARM_DEFAULTS.depth],
    ["timer", 1, 8],
  );
});

Deno.test("keep-warm's pacer submits while under 2 periods are believed queued", () => {
  // spin 0.1 ms, believed 0.6 until calibrated; depth 2: 1.2 ms a tick; bound 2 x 2 ms
  const p = new SpinPacer(0.1, 2, 2, 100);
  assert.equal(p.unit, 0.1 * SLOW_CLOCK_FACTOR);
  assert.deepEqual([0, 0, 0, 0, 0].map(() => p.tick(0)), [true, true, true, true, false]);
  assert.equal(p.skipped, 1);
  assert(Math.abs(p.queued(0) - 4.8) < 1e-9, `queued ${p.queued(0)}`);
  assert.equal(p.tick(0.7), false); // 4.1 ms believed
  assert.equal(p.tick(1), true); // 3.8
  assert.equal(MAX_TICKS_QUEUED, 2);
});

Deno.test("keep-warm's pacer calibrates from one wait a sync_ms, within its clamp", () => {
  const p = new SpinPacer(0.1, 2, 2, 100);
  assert.equal(p.wantSync(0), false); // the first a sync_ms after the start
  assert.equal(p.wantSync(99), false);
  p.tick(100);
  p.tick(100); // 2.4 ms believed
  assert.equal(p.wantSync(100), true);
  p.syncIssued(100);
  assert.equal(p.wantSync(300), false, "a second wait while one is pending");
  p.tick(101); // after the wait: 2 spins
  p.syncDone(100.4); // the 2.4 believed took 0.4: spins 6x faster than believed
  assert.equal(p.syncs, 1);
  const unit = 0.6 * (0.4 / 2.4) * CALIBRATION_MARGIN;
  assert(Math.abs(p.unit - unit) < 1e-9, `unit ${p.unit}, want ${unit}`);
  assert(Math.abs(p.queued(100.4) - 2 * unit) < 1e-9, `queued ${p.queued(100.4)}`);
  // a slow wait raises it, never over spin x factor
  for (let i = 0; i < 4; i++) p.tick(200); // 1.2 ms believed
  p.syncIssued(200);
  p.syncDone(300);
  assert(Math.abs(p.unit - 0.1 * SLOW_CLOCK_FACTOR) < 1e-9, `unit ${p.unit}`);
  // a wait issued with under 1 ms believed queued says only the round trip: no change
  const q = new SpinPacer(0.1, 2, 1, 100);
  q.wantSync(0);
  q.syncIssued(100);
  q.syncDone(100.5);
  assert.deepEqual([q.unit, q.syncs], [0.1 * SLOW_CLOCK_FACTOR, 1]);
});

Deno.test(
  "keep-warm's timer mode calibrates with one short wait a sync_ms, and keeps spinning",
  GPU_TEST,
  async () => {
    const o = { hold_ms: 500, spin_iters: 256, workgroups: 1, depth: 2, period_ms: 2 };
    const w = new KeepWarmProvider(MANAGER, { ...o, mode: "timer" }, {
      max_round_trip_ms: Infinity,
      sync_ms: 40,
    });
    const spin = (await w.start()).spin_ms!;
    w.current();
    const seen: number[] = [];
    while (w.stats().spinning || seen.length === 0) {
      seen.push(w.stats().pending_waits);
      await new Promise((r) => setTimeout(r, 3));
    }
    const st = w.stats();
    await w.close();
    assert(st.syncs >= 3, `syncs ${st.syncs} over ${o.hold_ms} ms at 40`);
    assert(Math.max(...seen) <= 1, `pending ${seen}`);
    assert(st.dispatches >= 20, `dispatches ${st.dispatches}`);
    const unit = st.spin_unit_ms!;
    // The pacer works from the measured spin, floored at MIN_SPIN_MS (a coarse clock measured
    // 0 in CI once, and the bounds [0, 0] failed a correct unit of 0.006).
    const base = Math.max(spin, MIN_SPIN_MS);
    assert(
      unit >= base / SLOW_CLOCK_FACTOR - 1e-9 && unit <= base * SLOW_CLOCK_FACTOR + 1e-9,
      `unit ${unit} outside [${base} / 6, ${base} x 6]`,
    );
  },
);

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

for (const mode of ["timer", "await"] as const) {
  Deno.test(
    `keep-warm (${mode}) spins while the device is used, stops after the hold, never after close`,
    GPU_TEST,
    async () => {
      const o = { hold_ms: 150, spin_iters: 64, workgroups: 2, depth: 2, mode, period_ms: 3 };
      const w = new KeepWarmProvider(MANAGER, o, { max_round_trip_ms: Infinity });
      assert((await w.start()).enabled);
      assert.deepEqual(w.stats().dispatches, 0);
      const ctx = w.current(); // a use of the device opens the window
      assert(ctx !== null && ctx === MANAGER.current());
      assert(
        await until(() => w.stats().dispatches >= 4, 3000),
        `dispatches ${w.stats().dispatches}`,
      );
      assert(await until(() => !w.stats().spinning, 10_000), "still spinning after the hold");
      const n = w.stats().dispatches;
      await new Promise((r) => setTimeout(r, 60));
      assert.deepEqual(w.stats().dispatches, n, "spun after the hold");
      const rep = w.report();
      assert.deepEqual(rep.runtime, MANAGER.report().runtime);
      assert.deepEqual(rep.keep_warm?.options, o);
      await w.close();
      assert.deepEqual(w.stats().pending_waits, 0, "a wait left pending after close");
      w.current();
      await new Promise((r) => setTimeout(r, 60));
      assert.deepEqual(w.stats().dispatches, n, "spun after close");
    },
  );
}

Deno.test(
  "keep-warm's timer mode leaves no completion wait pending while it spins; await mode does",
  GPU_TEST,
  async () => {
    const base = { hold_ms: 400, spin_iters: 64, workgroups: 1, depth: 1, period_ms: 2 };
    const pendingWhileSpinning = async (mode: KeepWarmMode) => {
      const w = new KeepWarmProvider(MANAGER, { ...base, mode }, {
        max_round_trip_ms: Infinity,
        sync_ms: Infinity, // no calibrating wait: the test below has them
      });
      await w.start();
      w.current();
      const seen: number[] = [];
      for (let i = 0; i < 20; i++) {
        await new Promise((r) => setTimeout(r, 5));
        w.current();
        seen.push(w.stats().pending_waits);
      }
      const dispatches = w.stats().dispatches;
      await w.close();
      return { seen, dispatches };
    };
    const timer = await pendingWhileSpinning("timer");
    assert(timer.dispatches >= 10, `timer dispatches ${timer.dispatches} in ~100 ms`);
    assert.deepEqual(timer.seen, timer.seen.map(() => 0), `timer pending ${timer.seen}`);
    const awaited = await pendingWhileSpinning("await");
    assert(awaited.dispatches >= 10, `await dispatches ${awaited.dispatches}`);
    assert(awaited.seen.some((p) => p > 0), `await pending ${awaited.seen}`);
  },
);

Deno.test(
  "keep-warm's timer mode skips ticks while more than its bound is believed queued",
  GPU_TEST,
  async () => {
    // spins long enough that depth 8 at the slow-clock factor exceed MAX_TICKS_QUEUED periods
    const o = { hold_ms: 300, spin_iters: 20_000, workgroups: 1, depth: 8, period_ms: 1 };
    const w = new KeepWarmProvider(MANAGER, { ...o, mode: "timer" }, {
      max_round_trip_ms: Infinity,
      sync_ms: Infinity, // the start-up belief throughout
    });
    const st = await w.start();
    const spin = st.spin_ms!;
    assert(spin > 0, `spin_ms ${spin}`);
    const perTick = o.depth * spin * SLOW_CLOCK_FACTOR;
    w.current();
    assert(await until(() => !w.stats().spinning, 10_000), "still spinning after the hold");
    const { dispatches, skipped_ticks } = w.stats();
    await w.close();
    assert(dispatches >= o.depth && dispatches % o.depth === 0, `dispatches ${dispatches}`);
    // believed queue: each submitting tick adds perTick ms; it never starts above the bound
    const maxTicks = Math.ceil(o.hold_ms / (perTick - MAX_TICKS_QUEUED * o.period_ms)) + 2;
    if (perTick > MAX_TICKS_QUEUED * o.period_ms) {
      assert(skipped_ticks > 0, `no tick skipped (spin ${spin} ms, ${perTick} ms a tick)`);
      assert(
        dispatches / o.depth <= Math.max(maxTicks, 3),
        `${dispatches / o.depth} submitting ticks over ${o.hold_ms} ms at ${perTick} ms a tick`,
      );
    }
  },
);
