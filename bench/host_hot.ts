/**
 * The host's per-call work on a decode step, without the GPU: in a tight loop over fresh
 * decode steps (32 x 2048, new seq_lens and slots every step, as an engine's first layer of a
 * step sees them), each phase as the service runs it: `validate` (validateForward, the NaN
 * scan included), `select` (the registry), `plan_miss` (the plan cache's miss: the key
 * compare and copy, then the backend's plan), `bind` (pooled buffers and every binding of the
 * plan, released again). Nothing is submitted, so the numbers hold still on a loaded machine
 * where bench/host_profile.ts's (the same phases between real submits) do not; they are the
 * floor those can reach.
 *
 * The clock is this thread's CPU time (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)` through FFI, on
 * Linux), so time the thread spends preempted by other processes does not count; `--wall`
 * uses `performance.now()` instead.
 *
 * Run: `deno run -A bench/host_hot.ts [--runtime deno|dawn] [--backend NAME] [--iters N]
 * [--wall]`.
 * @module
 */
import { parseArgs } from "node:util";
import { builtinBackends, WebGpuDeviceManager } from "../mod.ts";
import type { AttentionBackend } from "../core/types.ts";
import { BackendRegistry } from "../backends/registry.ts";
import { selectRuntime } from "../gpu/runtime.ts";
import { resolveRuntimeOptions, runtimeEnv } from "../gpu/runtime_options.ts";
import { deviceSummary } from "../gpu/runtime_report.ts";
import { GpuKvCache } from "../gpu/kv_cache.ts";
import { bindGpuPlan, type GpuPlan } from "../gpu/gpu_plan.ts";
import { attachCache, validateForward } from "../service/validate.ts";
import { PlanCache } from "../service/plan_cache.ts";
import { BIG_SHAPE, layoutOf } from "./http_workload.ts";
import { callInput } from "./host_inputs.ts";

const { values: a } = parseArgs({
  options: {
    runtime: { type: "string" },
    backend: { type: "string" },
    iters: { type: "string", default: "300" },
    wall: { type: "boolean", default: false },
  },
});

/** Milliseconds of this thread's CPU time, or null where the clock is not reachable. */
function threadCpuClock(): (() => number) | null {
  if (Deno.build.os !== "linux") return null;
  try {
    const libc = Deno.dlopen("libc.so.6", {
      clock_gettime: { parameters: ["i32", "buffer"], result: "i32" },
    });
    const ts = new BigInt64Array(2);
    const CLOCK_THREAD_CPUTIME_ID = 3;
    return () => {
      libc.symbols.clock_gettime(CLOCK_THREAD_CPUTIME_ID, ts);
      return Number(ts[0]) * 1e3 + Number(ts[1]) / 1e6;
    };
  } catch {
    return null;
  }
}
const cpu = a.wall ? null : threadCpuClock();
const now = cpu ?? (() => performance.now());
const device = new WebGpuDeviceManager({
  selection: await selectRuntime(
    resolveRuntimeOptions({ runtime: a.runtime }, runtimeEnv(), "--runtime"),
  ),
});
const gpu = await device.acquire();
if (!gpu) {
  console.error(`no WebGPU device: ${device.report().reason}`);
  Deno.exit(2);
}
const s = BIG_SHAPE, layout = layoutOf(s, 7);
const spec = {
  num_blocks: layout.num_blocks,
  block_size: s.block_size,
  num_kv_heads: s.num_kv_heads,
  head_size: s.head_size,
  dtype: "float16" as const,
  kv_cache_dtype: "auto" as const,
  layout: "NHD" as const,
};
const cache = await GpuKvCache.create(gpu, spec);
const held = { spec, storage: "webgpu" as const };
const registry = new BackendRegistry(builtinBackends(), () => gpu);
const plans = new PlanCache();
const n = Math.min(Number(a.iters), s.ctx - 1);
// Steps stay within the layout's blocks: positions ctx - n .. ctx - 1.
const input = (i: number) => callInput(s, layout, "hot", 1000 + i, 0, s.reqs, s.ctx - n + i, 1);
const t: Record<string, number[]> = {};
const rec = (k: string, ms: number) => (t[k] ??= []).push(ms);
let backendName = "";
for (let i = 0; i < n; i++) {
  const step = input(i); // not timed
  const t0 = now();
  const v = validateForward(step, held, undefined, { deferFinite: true });
  const t1 = now();
  const chosen = registry.select(v.selector, { backend: a.backend }).backend;
  const t2 = now();
  const batch = attachCache(v.batch, cache);
  const hp = await plans.get(chosen as AttentionBackend<GpuPlan>, batch, { gpu });
  const t3 = now();
  bindGpuPlan(hp.plan, batch, gpu).release();
  const t4 = now();
  hp.release();
  backendName = chosen.name;
  rec("validate", t1 - t0);
  rec("select", t2 - t1);
  rec("plan_miss", t3 - t2);
  rec("bind", t4 - t3);
  rec("total", t4 - t0);
}
const q = (x: number[], p: number) => x[Math.min(x.length - 1, Math.floor(p * x.length))];
console.log(`runtime: ${deviceSummary(device.report())}`);
console.log(
  `hot host loop, decode ${s.reqs} x ${s.ctx} on ${backendName}, ${n} steps, ` +
    `${cpu ? "thread CPU time" : "wall time"} (first ${
      Math.floor(n / 5)
    } dropped); ms p50 [p10, p90]; plan cache ${JSON.stringify(plans.stats())}`,
);
for (const [k, v] of Object.entries(t)) {
  const x = v.slice(Math.floor(n / 5)).sort((p, r) => p - r);
  console.log(
    `  ${k.padEnd(10)} ${q(x, 0.5).toFixed(4)}  [${q(x, 0.1).toFixed(4)}, ${q(x, 0.9).toFixed(4)}]`,
  );
}
cache.destroy();
device.close();
