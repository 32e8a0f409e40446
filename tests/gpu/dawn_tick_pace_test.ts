/**
 * Dawn's poll loop paced (gpu/dawn_tick_pace.ts; bench/NOTES.md "v0.7 Dawn stalls"): the
 * pacer on a fake host (no GPU), and on Dawn where it has an adapter a wait of about a second
 * (one long dispatch) makes a bounded number of poll ticks: unpaced, lavapipe made ~12 per ms
 * of wait (the H200 many more), each a native function whose release costs Deno O(n).
 */
import assert from "node:assert/strict";
import {
  DEFAULT_TICK_PACE,
  installDawnTickPacing,
  tickPaceFromEnv,
  wakeDawnPoll,
} from "../../gpu/dawn_tick_pace.ts";
import { WebGpuDeviceManager } from "../../gpu/device.ts";
import { EnvValueError } from "../../core/env.ts";
import { loadDawnRuntime } from "../../gpu/runtime_dawn.ts";
import { DEFAULT_DAWN_FLAGS } from "../../gpu/runtime_options.ts";
import { withEnv } from "../support/env.ts";

type Cb = (...a: unknown[]) => void;

/** Dawn's poll every turn within the spin (the tests of spin and pacing alone). */
const NO_GAP = { spin_gap_ms: Infinity };

/** A host whose setImmediate runs callbacks as macrotasks (setTimeout 0) and counts them. */
function fakeHost() {
  const host = {
    calls: 0,
    setImmediate(cb: Cb, ...args: unknown[]) {
      host.calls++;
      return setTimeout(() => cb(...args), 0);
    },
  };
  return host;
}

/** Runs a chain of `n` immediates, each queued from the one before; resolves with its ms. */
function chain(host: { setImmediate?: (cb: Cb) => unknown }, n: number): Promise<number> {
  const t0 = performance.now();
  return new Promise((done) => {
    let left = n;
    const tick = () => (--left > 0 ? host.setImmediate!(tick) : done(performance.now() - t0));
    host.setImmediate!(tick);
  });
}

Deno.test("tick pace: a chain runs unpaced for spin_ms, then as timers", async () => {
  const host = fakeHost();
  const stats = installDawnTickPacing({ ...NO_GAP, spin_ms: 0, max_delay_ms: 4 }, host);
  await chain(host, 20);
  // spin_ms 0: every tick is a timer (none reaches the host's setImmediate)
  assert.deepEqual(stats, { immediate: 0, paced: 20, gap_turns: 0 });
  assert.equal(host.calls, 0);
  // a later install updates the knobs of the same wrapper
  assert.equal(
    installDawnTickPacing({ ...NO_GAP, spin_ms: Infinity, max_delay_ms: 4 }, host),
    stats,
  );
  await chain(host, 10);
  assert.deepEqual(stats, { immediate: 10, paced: 20, gap_turns: 0 });
  assert.equal(host.calls, 10);
});

Deno.test("tick pace: a new chain starts unpaced again; arguments pass through", async () => {
  const host = fakeHost();
  const stats = installDawnTickPacing({ ...NO_GAP, spin_ms: 20, max_delay_ms: 4 }, host);
  const ms = await chain(host, 100);
  assert.ok(stats.paced > 0 && stats.immediate > 0, JSON.stringify(stats));
  // paced ticks are at most max_delay_ms apart
  assert.ok(ms < 20 + stats.paced * 4 + 500, `${ms} ms`);
  const before = { ...stats };
  const got = await new Promise((r) => host.setImmediate((a: unknown) => r(a), "x"));
  assert.equal(got, "x");
  assert.equal(stats.immediate, before.immediate + 1); // from outside a tick: unpaced
});

Deno.test("tick pace: a wake runs the paced tick now, once", async () => {
  const host = fakeHost();
  const stats = installDawnTickPacing({ ...NO_GAP, spin_ms: 0, max_delay_ms: 1000 }, host);
  let ran = 0;
  host.setImmediate(() => ran++); // spin_ms 0: paced, a timer
  assert.deepEqual([stats.paced, host.calls], [1, 0]);
  wakeDawnPoll(host);
  assert.equal(host.calls, 1); // handed to the host's setImmediate
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(ran, 1); // and its timer cleared
  wakeDawnPoll(host); // nothing queued: nothing happens
  assert.equal(host.calls, 1);
});

/** A host whose setImmediate is the real one (a turn every few µs), counting the calls. */
function turningHost() {
  const host = {
    calls: 0,
    setImmediate(cb: Cb, ...args: unknown[]) {
      host.calls++;
      return setImmediate(() => cb(...args));
    },
  };
  return host;
}

/** A chain as Dawn's poll makes it, for `ms`: each poll's time (ms from the start). */
function pollFor(host: { setImmediate?: (cb: Cb) => unknown }, ms: number): Promise<number[]> {
  const t0 = performance.now(), at: number[] = [];
  return new Promise((done) => {
    const poll = () => {
      const t = performance.now() - t0;
      at.push(t);
      if (t < ms) host.setImmediate!(poll);
      else done(at);
    };
    host.setImmediate!(poll);
  });
}

// v0.31: 8 clients on Dawn made ~150 polls a call within the spin (one a turn), and Deno's
// release of their native functions held the thread 2-3 s at a time (bench/NOTES.md v0.31).
Deno.test("tick pace: within the spin, Dawn's poll runs max(spin_gap_ms, elapsed / 16) apart", async () => {
  const host = turningHost();
  // Slowed 50x against the defaults (a 100 ms spin, 0.5 ms gaps), so that a gap spans many
  // turns on a loaded machine too.
  const stats = installDawnTickPacing({ spin_ms: 100, max_delay_ms: 16, spin_gap_ms: 0.5 }, host);
  const at = await pollFor(host, 95);
  for (let i = 2; i < at.length; i++) {
    const gap = at[i] - at[i - 1];
    // each poll waited out its gap, measured from the poll before (timing slack: the clock)
    assert.ok(gap >= Math.max(0.5, at[i - 1] / 16) - 0.002, `poll ${i}: ${gap} ms after`);
  }
  // a 95 ms spin: ~ 8 / 0.5 + 16 ln(95 / 8) ~ 56 polls, not one a turn
  assert.ok(at.length <= 60, `${at.length} polls`);
  assert.equal(stats.immediate, at.length);
  assert.equal(stats.paced, 0);
  assert.ok(stats.gap_turns > 0, JSON.stringify(stats)); // the loop kept turning meanwhile
  assert.equal(host.calls, stats.immediate + stats.gap_turns);
});

Deno.test("tick pace: off, Dawn's poll runs every turn; a wake cuts a gap short", async () => {
  const host = turningHost();
  const stats = installDawnTickPacing({
    spin_ms: Infinity,
    max_delay_ms: 16,
    spin_gap_ms: Infinity,
  }, host);
  const at = await pollFor(host, 1);
  assert.deepEqual(stats, { immediate: at.length, paced: 0, gap_turns: 0 });
  assert.equal(host.calls, at.length); // one a turn
  // A gap of a second: the second poll waits on turns until a wake.
  installDawnTickPacing({ spin_ms: Infinity, max_delay_ms: 16, spin_gap_ms: 1000 }, host);
  const t0 = performance.now();
  let polls = 0;
  const done = new Promise<number>((resolve) => {
    const poll = () => ++polls < 2 ? host.setImmediate(poll) : resolve(performance.now() - t0);
    host.setImmediate(poll);
  });
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(polls, 1);
  wakeDawnPoll(host);
  const ms = await done;
  assert.ok(ms < 500, `${ms} ms`);
});

/** Each variable, the field it sets, and values its rule refuses. */
const PACE_VARIABLES = [
  // Was the default 2 ms, unsaid (or 0 for " ", 1000 for "1e3"): now the error names it.
  ["ATTN_DAWN_TICK_SPIN_MS", "spin_ms", ["nonsense", " ", "1e3", "OFF", ".5", "-1"]],
  ["ATTN_DAWN_TICK_GAP_MS", "spin_gap_ms", ["1e-2", ".01", "-1", "OFF"]],
] as const;

Deno.test("tick pace: ATTN_DAWN_TICK_SPIN_MS and _GAP_MS set their ms, off is Infinity, else refused", async () => {
  for (const [name, field, refused] of PACE_VARIABLES) {
    // The other variable emptied (its default), whatever the suite's environment sets.
    const others = Object.fromEntries(PACE_VARIABLES.map(([n]) => [n, ""]));
    const pace = (v: string) => withEnv({ ...others, [name]: v }, tickPaceFromEnv);
    assert.equal((await pace("off"))[field], Infinity, name);
    assert.deepEqual(await pace("5"), { ...DEFAULT_TICK_PACE, [field]: 5 }, name);
    assert.deepEqual(await pace("0.5"), { ...DEFAULT_TICK_PACE, [field]: 0.5 }, name);
    assert.deepEqual(await pace(""), { ...DEFAULT_TICK_PACE }, name);
    for (const bad of refused) {
      await assert.rejects(
        () => pace(bad),
        (e) =>
          e instanceof EnvValueError &&
          e.message === `${name} must be a number of ms >= 0, or off, got ${JSON.stringify(bad)}`,
        `${name}=${bad}`,
      );
    }
  }
});

const FLAGS = [...DEFAULT_DAWN_FLAGS];
const DAWN = await loadDawnRuntime(FLAGS);
const NO_DAWN =
  (await DAWN.requestAdapter({ powerPreference: "high-performance" })).adapter === null;
const selection = { runtime: DAWN, requested: "dawn" as const, because: "test", others: {} };

const SPIN_WGSL = `@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<uniform> n: vec4u;
@compute @workgroup_size(1) fn main() {
  var x = 1u;
  for (var i = 0u; i < n.x; i++) { x = x * 1664525u + 1013904223u; }
  out[0] = x;
}`;

/** One dispatch of `iters` dependent steps, then mapAsync; the wait's ms and the LCG result. */
async function longWait(device: GPUDevice, pipeline: GPUComputePipeline, iters: number) {
  const use = GPUBufferUsage;
  const out = device.createBuffer({ size: 16, usage: use.STORAGE | use.COPY_SRC });
  const uni = device.createBuffer({ size: 16, usage: use.UNIFORM | use.COPY_DST });
  const rb = device.createBuffer({ size: 16, usage: use.MAP_READ | use.COPY_DST });
  device.queue.writeBuffer(uni, 0, new Uint32Array([iters, 0, 0, 0]));
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(pipeline);
  pass.setBindGroup(
    0,
    device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: [{ binding: 0, resource: { buffer: out } }, {
        binding: 1,
        resource: { buffer: uni },
      }],
    }),
  );
  pass.dispatchWorkgroups(1);
  pass.end();
  enc.copyBufferToBuffer(out, 0, rb, 0, 16);
  const t0 = performance.now();
  device.queue.submit([enc.finish()]);
  await rb.mapAsync(GPUMapMode.READ);
  const ms = performance.now() - t0;
  const word = new Uint32Array(rb.getMappedRange())[0];
  for (const b of [out, uni, rb]) b.destroy();
  return { ms, word };
}

function lcg(iters: number): number {
  let x = 1;
  for (let i = 0; i < iters; i++) x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
  return x;
}

Deno.test({
  name: "tick pace: a one-second Dawn wait makes a bounded number of poll ticks",
  ignore: NO_DAWN,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const mgr = new WebGpuDeviceManager({ selection: { ...selection, dawnFlags: FLAGS } });
    const device = (await mgr.acquire())!.device;
    try {
      const pipeline = await device.createComputePipelineAsync({
        layout: "auto",
        compute: { module: device.createShaderModule({ code: SPIN_WGSL }), entryPoint: "main" },
      });
      let iters = 1 << 20, wait = await longWait(device, pipeline, iters);
      while (wait.ms < 250 && iters < 2 ** 31) wait = await longWait(device, pipeline, iters *= 2);
      iters = Math.min(2 ** 32 - 1, Math.ceil(iters * Math.max(1, 1000 / wait.ms)));
      const g = globalThis as unknown as { setImmediate: (cb: Cb) => unknown };
      const paced = g.setImmediate;
      let ticks = 0;
      g.setImmediate = (cb: Cb) => (ticks++, paced(cb));
      try {
        wait = await longWait(device, pipeline, iters);
      } finally {
        g.setImmediate = paced;
      }
      if (iters <= 2 ** 27) assert.equal(wait.word, lcg(iters)); // the kernel really ran
      // paced: the 2 ms spin, then >= 1 ms apart (~T/16 apart, at most 16 ms): ~100 a second
      const bound = 2000 + wait.ms;
      console.log(`${ticks} poll ticks in a ${wait.ms.toFixed(0)} ms wait (${iters} steps)`);
      assert.ok(ticks < bound, `${ticks} ticks in a ${wait.ms.toFixed(0)} ms wait (< ${bound})`);
    } finally {
      mgr.close();
    }
  },
});

/** Runs `code` (a module importing from the repository root) in a fresh Deno; its stdout. */
async function freshDeno(code: string): Promise<string> {
  const root = new URL("../../", import.meta.url);
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--ext=ts", code.replaceAll("ROOT/", root.href)],
    stdout: "piped",
    stderr: "piped",
    cwd: root.pathname, // deno.json maps the bare "webgpu"
    env: { DENO_NO_UPDATE_CHECK: "1" },
  }).output();
  const err = new TextDecoder().decode(out.stderr);
  assert.ok(out.success, `fresh Deno failed: ${err}`);
  return new TextDecoder().decode(out.stdout).trim();
}

// Session 16 on the H200: the tensor-core tests still stalled (a compile's wait sat 190 s with
// no "paced" line in the trace), because acquireMmaDevice loaded Dawn without the pacer.
Deno.test("tick pace: every way of loading Dawn installs the pacer (the mma device too)", async () => {
  const said = await freshDeno(`
    import { acquireMmaDevice } from "ROOT/gpu/flash_mma_device.ts";
    import { dawnTickPacing } from "ROOT/gpu/dawn_tick_pace.ts";
    const before = dawnTickPacing() !== undefined;
    const got = await acquireMmaDevice();
    const loaded = !/did not load/.test(got.reason ?? "");
    got.ctx?.device.destroy();
    console.log(JSON.stringify({ before, loaded, after: dawnTickPacing() !== undefined }));
  `);
  const r = JSON.parse(said.split("\n").at(-1)!);
  assert.equal(r.before, false);
  assert.equal(r.loaded, true, "npm:webgpu did not load in the fresh process");
  assert.equal(r.after, true, "acquireMmaDevice loaded Dawn without the poll pacer");
});
