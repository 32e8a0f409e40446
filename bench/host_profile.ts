/**
 * The server-side host cost of one forward call, in process and reproducibly: builds the
 * service on the chosen WebGPU runtime, creates a server-held f16 cache at the issue-7 shape
 * (32 requests x 2048 context, 32 q / 8 kv heads, head 128, block 16; bench/http_workload.ts),
 * and times decode steps (every step new seq_lens and slots, so the plan misses, as in an
 * engine's first layer) and 4 x 2048 prefill calls through `AttentionService.forward`, phase
 * by phase as the service reports them: validate (with the backend's selection), plan, bind,
 * encode (upload, record, submit), gpu_and_readback (map, copy), total.
 *
 * By default the kernels are not dispatched (every planned call gets a 0 x 0 grid: the
 * backends plan, bind, upload, encode, submit and read back exactly as they would, the GPU
 * only copies), so what is timed is the host's share even on a software adapter. `--kernels`
 * dispatches them (the GPU's time then shows in `map`, and `gpu` reports it).
 *
 * Run: `deno run -A bench/host_profile.ts [--runtime deno|dawn] [--case decode|prefill|all]
 * [--iters N] [--prefill-iters N] [--layers N] [--kernels] [--gap-ms MS] [--separate] [--json]`.
 * `--layers N` calls each decode step's input N times, each time on a cache of its own (an
 * engine's layers: one plan, N caches).
 * The query, key and value of a call lie back to back in one buffer, as in a request body;
 * `--separate` gives each its own (each then goes up in a write of its own). `--gap-ms`
 * idles between calls (with `--kernels`: does the GPU's share grow when calls are sparse?). On
 * this project's CPU machines Dawn runs in the trixie chroot (see the team guide). `ATTN_UPLOAD_STAGING=0|1`
 * forces large uploads through writeBuffer or mapped staging (gpu/upload_staging.ts),
 * `ATTN_GPU_TIMING=calls` times each dispatch in its own pass, `total` every call, the default
 * `sampled` a call list's first call and one in 16 (gpu/gpu_plan.ts). Each result is
 * released after its call, as the server does once an answer was delivered, so read-backs reuse
 * the host pool's memory (gpu/host_pool.ts). The last line says what was reused (bind groups,
 * buffers, host memory, staging, plans).
 * @module
 */
import { parseArgs } from "node:util";
import { AttentionService, builtinBackends } from "../mod.ts";
import type { AttentionBackend } from "../core/types.ts";
import { bindStats, type GpuPlan, gpuTiming } from "../gpu/gpu_plan.ts";
import { bindGroupsOf } from "../gpu/bind_groups.ts";
import { poolOf } from "../gpu/buffer_pool.ts";
import { hostPool } from "../gpu/host_pool.ts";
import { stagedUploads, stagingOf } from "../gpu/upload_staging.ts";
import { benchDevice } from "./bench_device.ts";
import { deviceSummary } from "../gpu/runtime_report.ts";
import { completionRoundTrip } from "../gpu/runtime_device.ts";
import type { ForwardInput } from "../service/validate.ts";
import { BIG_SHAPE, layoutOf } from "./http_workload.ts";
import { callInput } from "./host_inputs.ts";

const { values: a } = parseArgs({
  options: {
    runtime: { type: "string" },
    case: { type: "string", default: "all" },
    iters: { type: "string", default: "60" },
    "prefill-iters": { type: "string", default: "6" },
    layers: { type: "string", default: "1" },
    kernels: { type: "boolean", default: false },
    "gap-ms": { type: "string", default: "0" },
    json: { type: "boolean", default: false },
    separate: { type: "boolean", default: false },
  },
});

/** Phases printed, in order (the service's timings keys). */
const PHASES = [
  "validate",
  "plan",
  "bind",
  "encode_upload",
  "encode_record",
  "submit",
  "encode",
  "readback_map",
  "readback_copy",
  "gpu_and_readback",
  "gpu",
  "total",
  "wall",
];

/**
 * A backend whose plans dispatch nothing (each call's grid 0 x 0): host work only. Plans that
 * share a call list (gpu/plan_builder.ts) share its host-only copy too, as they would the list.
 */
function hostOnly(b: AttentionBackend): AttentionBackend {
  if (!b.requires.needs_device) return b;
  const g = b as AttentionBackend<GpuPlan>;
  const copies = new WeakMap<GpuPlan["calls"], GpuPlan["calls"]>();
  return {
    ...g,
    plan: async (s, ctx) => {
      const p = await g.plan(s, ctx);
      let calls = copies.get(p.calls);
      if (!calls) {
        calls = p.calls.map((c) => ({ ...c, grid: [0, 0] as const, indirect: undefined }));
        copies.set(p.calls, calls);
      }
      return { ...p, calls };
    },
  } as AttentionBackend;
}

const median = (x: number[]) => {
  const s = [...x].sort((p, q) => p - q);
  return s.length === 0 ? NaN : s[Math.floor(s.length / 2)];
};
const pct = (x: number[], p: number) => {
  const s = [...x].sort((u, v) => u - v);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
};

type Samples = Record<string, number[]>;

/** Idle time between calls (`--gap-ms`): sparse calls, as a server between requests sees them. */
const gapMs = Number(a["gap-ms"]);

async function timeCalls(
  service: AttentionService,
  inputs: () => ForwardInput,
  n: number,
  layers: number,
): Promise<Samples> {
  const out: Samples = {};
  for (let i = 0; i < n; i++) {
    const input = inputs();
    for (let layer = 0; layer < layers; layer++) {
      const t0 = performance.now();
      const r = await service.forward({ ...input, kv_cache: caches[layer].id });
      const wall = performance.now() - t0;
      r.result.release?.(); // as the server does once the answer was delivered
      if (i === 0) continue; // compiles and pools fill on the first call
      const t: Record<string, number> = { ...r.result.timings, wall };
      for (const k of PHASES) if (t[k] !== undefined) (out[k] ??= []).push(t[k]);
      // ATTN_GPU_TIMING=calls: each dispatch's device time (gpu_<call name>).
      for (const k in t) {
        if (k.startsWith("gpu_") && k !== "gpu_and_readback") (out[k] ??= []).push(t[k]);
      }
      if (gapMs > 0) await new Promise((r) => setTimeout(r, gapMs));
    }
  }
  return out;
}

function report(
  name: string,
  s: Samples,
): Record<string, { p50: number; p10: number; p90: number }> {
  const rows: Record<string, { p50: number; p10: number; p90: number }> = {};
  for (const k of [...PHASES, ...Object.keys(s).filter((k) => !PHASES.includes(k))]) {
    if (!s[k]) continue;
    rows[k] = { p50: median(s[k]), p10: pct(s[k], 0.1), p90: pct(s[k], 0.9) };
  }
  if (!a.json) {
    console.log(`== ${name} (${s.total?.length ?? 0} calls; ms p50 [p10, p90])`);
    for (const [k, v] of Object.entries(rows)) {
      console.log(
        `  ${k.padEnd(18)} ${v.p50.toFixed(3).padStart(9)}  [${v.p10.toFixed(3)}, ${
          v.p90.toFixed(3)
        }]`,
      );
    }
  }
  return rows;
}

const { device, gpu } = await benchDevice(a.runtime);
const shape = BIG_SHAPE;
const layout = layoutOf(shape, 7);
const backends = a.kernels ? builtinBackends() : builtinBackends().map(hostOnly);
const service = new AttentionService({ backends, device, memoryBudgetBytes: 2 ** 32 });
const rt = median((await completionRoundTrip(gpu.device, 20)).ms);
const head = {
  runtime: deviceSummary(device.report()),
  machine: `${Deno.build.os} ${Deno.build.arch}, ${navigator.hardwareConcurrency} cores`,
  kernels: a.kernels,
  completion_round_trip_ms: rt,
};
if (!a.json) {
  console.log(`runtime: ${head.runtime}`);
  console.log(
    `machine: ${head.machine}; kernels ${a.kernels ? "dispatched" : "skipped (host only)"}`,
  );
  console.log(`completion round trip (empty submit + 16 B mapAsync): ${rt.toFixed(3)} ms`);
}
// One cache per layer, as an engine holds them: a step's layers share the plan, not the cache.
const caches: { id: string }[] = [];
for (let i = 0; i < Math.max(1, Number(a.layers)); i++) {
  caches.push(
    await service.createCache({
      num_blocks: layout.num_blocks,
      block_size: shape.block_size,
      num_kv_heads: shape.num_kv_heads,
      head_size: shape.head_size,
      dtype: "float16",
    }),
  );
}
const cache = caches[0];
const results: Record<string, unknown> = { ...head };
try {
  if (a.case === "decode" || a.case === "all") {
    // Positions cycle through the 2 x steps the layout reserves, so any --iters fits the cache.
    let step = 0;
    const pos = () => shape.ctx + (step++ % (2 * shape.steps));
    const s = await timeCalls(
      service,
      () => callInput(shape, layout, cache.id, 1000 + step, 0, shape.reqs, pos(), 1, !a.separate),
      Number(a.iters),
      Number(a.layers),
    );
    results.decode = report(`decode ${shape.reqs} x ${shape.ctx}, layers ${a.layers}`, s);
  }
  if (a.case === "prefill" || a.case === "all") {
    const n = shape.prefill_reqs, len = shape.prefill_tokens;
    let k = 0;
    const s = await timeCalls(
      service,
      () => callInput(shape, layout, cache.id, 5000 + 10 * k++, 0, n, 0, len, !a.separate),
      Number(a["prefill-iters"]),
      1,
    );
    results.prefill = report(`prefill ${n} x ${len}`, s);
  }
  results.reuse = {
    bind_groups: bindGroupsOf(gpu.device).stats(),
    bound_calls: bindStats(),
    buffers: poolOf(gpu).stats(),
    host_memory: hostPool.stats(),
    upload_staging: { on: stagedUploads(gpu), ...stagingOf(gpu).stats() },
    plans: service.plans.stats(),
    gpu_timing: gpuTiming(),
  };
  if (!a.json) console.log(`reuse: ${JSON.stringify(results.reuse)}`);
} finally {
  await service.close();
  device.close();
}
if (a.json) console.log(JSON.stringify(results));
