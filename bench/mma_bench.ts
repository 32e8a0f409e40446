/**
 * One-call benchmark of the subgroup-matrix prefill kernel (wgsl/flash_mma.wgsl) on Dawn:
 * causal f16 prefill, 32 q / 8 kv heads, head 128, block 16 (GPU shapes 4 x 1024 and
 * 8 x 4096; `--small` for software adapters), several kernel shapes. Device time by
 * timestamp-query (median of `--iters` dispatches after a warm-up), TFLOP/s =
 * 4 * sum_i(q_i * visible_i) * H * D / time. Every variant is checked: sampled rows against a
 * float64 CPU reference, and every element against the first variant that passed that check,
 * so a fast-but-wrong variant is flagged, not ranked. A name `base~no<stage>` or
 * `base~no<stage>+<stage>` (ABLATIONS below; gpu/flash_mma_ablation.ts MmaAblation) is an
 * ablation of `base` that leaves those stages out: timed, wrong by design, marked "ablation, not
 * checked", never a failure. `--check-ablations` checks them too, for the cuts a case leaves
 * right (e.g. `~nolive` on a non-causal case, `~norescale` where no rescale happens after the
 * first tile): "ablation, right" or "ablation, differs", still never a failure.
 *
 * Usage: deno run -A bench/mma_bench.ts [--small] [--iters N] [--only name,name]
 *   [--cases 4x1024,8x4096,4x4096n,2x1056n-h16k4,4x1024-bf16] [--check-ablations] [--json] (see parseCase:
 *   `n` non-causal, `-h{heads}k{kv}` other head counts)
 * @module
 */
import { parseArgs } from "node:util";
import { mmaConstsOf, MmaRefusal, planFlashMma } from "../backends/flash_mma_plan.ts";
import {
  MMA_VARIANTS,
  type MmaAblation,
  mmaLayout,
  type MmaShape,
} from "../gpu/flash_mma_shape.ts";
import { acquireMmaDevice, type MmaContext } from "../gpu/flash_mma_device.ts";
import { type GpuPlan, runGpuPlan, uploadPlanTable } from "../gpu/gpu_plan.ts";
import {
  checkRows,
  compareOutputs,
  parseCase,
  type PrefillCase,
  type PrefillData,
  prefillData,
} from "./mma_bench_data.ts";

/**
 * The variants run without --only: v0.7's default, the fast softmax and the default shape
 * since v0.8 (fast softmax, late next-tile stores) as the baselines, that shape with D split
 * over pairs of subgroups (8 and 16 subgroups: 64 and 128 rows; 2 row blocks a subgroup: 128), then
 * v0.6's matrix-move staging (`-x`) and split S chains (`-s2`), alone and combined, on 8
 * subgroups, 2 row blocks and 32-key tiles, and the best guess's ablations (bench/NOTES.md,
 * "v0.6 tensor-core variants").
 */
export const DEFAULT_VARIANTS = [
  "w8r1k16",
  "w8r1k16-f",
  "w8r1k16-fl",
  "w8r1k16-fld",
  "w16r1k16-fld",
  "w8r2k16-fld",
  "w8r1k16-fx",
  "w8r1k16-fs2",
  "w8r1k16-fxs2",
  "w4r2k16-fx",
  "w4r2k16-fxs2",
  "w4r1k32-fx",
  "w8r1k16-fx~nosoftmax",
  "w8r1k16-fx~nopv",
];

const ABLATIONS: readonly MmaAblation[] = [
  "softmax",
  "stage",
  "qk",
  "pv",
  "rescale",
  "live",
  "loop",
  "count",
  "epilogue",
  "round",
  "write",
  "specials",
  "qpass",
  "bare",
];

/** The shape a variant name stands for (`base`, `base~no<stage>[+<stage>]`), or null. */
export function variantShape(name: string): MmaShape | null {
  const [base, cut, more] = name.split("~");
  const shape = MMA_VARIANTS[base];
  if (!shape || more !== undefined) return null;
  if (cut === undefined) return shape;
  // `~no<a>`, `~no<a>+<b>` or `~no<a>+<b>+<c>` (stages cut together)
  const stages = cut.startsWith("no") ? cut.slice(2).split("+") : [];
  if (stages.length < 1 || stages.length > 3) return null;
  if (!stages.every((x) => (ABLATIONS as readonly string[]).includes(x))) return null;
  return { ...shape, ablate: stages.join("+") as MmaShape["ablate"] };
}

const args = parseArgs({
  args: Deno.args,
  options: {
    small: { type: "boolean", default: false },
    iters: { type: "string", default: "20" },
    only: { type: "string", default: "" },
    cases: { type: "string", default: "" },
    json: { type: "boolean", default: false },
    "check-ablations": { type: "boolean", default: false },
  },
});
const checkAblations = args.values["check-ablations"];
const iters = Math.max(1, Number(args.values.iters));
const only = args.values.only ? args.values.only.split(",") : DEFAULT_VARIANTS;
const caseNames = args.values.cases ? args.values.cases.split(",") : null;

const GPU_CASES: PrefillCase[] = [
  { reqs: 4, len: 1024, heads: 32, kvHeads: 8, headSize: 128, blockSize: 16 },
  { reqs: 8, len: 4096, heads: 32, kvHeads: 8, headSize: 128, blockSize: 16 },
];
const SMALL_CASES: PrefillCase[] = [
  { reqs: 2, len: 96, heads: 8, kvHeads: 2, headSize: 64, blockSize: 16 },
];

/** Sorted device times (ms) of `n` timestamped dispatches of the plan's attention call. */
async function deviceTimes(
  ctx: MmaContext,
  plan: GpuPlan,
  p: PrefillData,
  n: number,
  warm: number,
) {
  const dev = ctx.device, call = plan.calls.find((c) => c.name === "prefill_mma")!;
  const buf = (size: number, usage: number) => dev.createBuffer({ size, usage });
  const q = buf(p.query.byteLength, GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST);
  dev.queue.writeBuffer(q, 0, p.query as Uint16Array<ArrayBuffer>);
  const io: Record<string, GPUBuffer> = {
    query: q,
    out: buf(plan.out_bytes, GPUBufferUsage.STORAGE),
    lse: buf(plan.lse_bytes, GPUBufferUsage.STORAGE),
  };
  const table = uploadPlanTable(plan);
  const chunks = p.cache.bindMap();
  const entries = call.kernel.bindings.map((b, i) => {
    const r = call.bind[b.name];
    const res = !r
      ? { buffer: chunks[b.name] }
      : "table" in r
      ? table.bind(r.table)
      : "io" in r
      ? { buffer: io[r.io] }
      : null;
    if (!res) throw new Error(`binding ${b.name}: no buffer`);
    return { binding: i, resource: res };
  });
  const bg = dev.createBindGroup({ layout: call.kernel.layout, entries });
  const qs = dev.createQuerySet({ type: "timestamp", count: 2 * n });
  const resolve = buf(16 * n, GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC);
  const read = buf(16 * n, GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST);
  const pass = (e: GPUCommandEncoder, i: number) => {
    const w = i < 0 ? {} : {
      timestampWrites: {
        querySet: qs,
        beginningOfPassWriteIndex: 2 * i,
        endOfPassWriteIndex: 2 * i + 1,
      },
    };
    const ps = e.beginComputePass(w);
    ps.setPipeline(call.kernel.pipeline);
    ps.setBindGroup(0, bg);
    ps.dispatchWorkgroups(call.grid[0], call.grid[1]);
    ps.end();
  };
  const e = dev.createCommandEncoder();
  for (let i = -warm; i < n; i++) pass(e, i); // warm-up passes, then n timed ones
  e.resolveQuerySet(qs, 0, 2 * n, resolve, 0);
  e.copyBufferToBuffer(resolve, 0, read, 0, 16 * n);
  dev.queue.submit([e.finish()]);
  await read.mapAsync(GPUMapMode.READ);
  const t = new BigUint64Array(read.getMappedRange().slice(0));
  read.unmap();
  for (const b of [q, io.out, io.lse, resolve, read, table.buffer]) b.destroy();
  qs.destroy();
  return Array.from({ length: n }, (_, i) => Number(t[2 * i + 1] - t[2 * i]) / 1e6).sort((a, b) =>
    a - b
  );
}

const acquired = await acquireMmaDevice();
if (!acquired.ctx) {
  console.log(`flash_mma bench skipped: ${acquired.reason}`);
  Deno.exit(0);
}
const ctx = acquired.ctx;
const info = ctx.adapter_info;
const limit = ctx.limits.maxComputeWorkgroupStorageSize;
console.log(
  `adapter: ${info.vendor} ${info.description || info.device}; subgroup ${ctx.mma.sg}; ` +
    `matrices ${ctx.mma.m}x${ctx.mma.n}x${ctx.mma.k} f16->f32; workgroup memory ${limit} B; ` +
    `timestamps ${ctx.features.has("timestamp-query")}`,
);
const small = args.values.small || info.vendor === "mesa" || /llvmpipe/.test(info.description);
const results: Record<string, unknown>[] = [];
const timed = ctx.features.has("timestamp-query");
const baseCases = small ? SMALL_CASES : GPU_CASES;
const cases = caseNames?.map((n) => {
  const c = parseCase(n, baseCases[0]);
  if (!c) throw new Error(`--cases: ${n} is not {reqs}x{len}[n][-h{heads}k{kv}][-bf16]`);
  return c;
}) ?? baseCases;
for (const c of cases) {
  const t0 = performance.now();
  const data = await prefillData(ctx, c);
  const label =
    `prefill ${c.reqs}x${c.len} ${c.causal === false ? "non-causal" : "causal"} f16${
      c.cache === "bfloat16" ? " (bf16 cache)" : ""
    } ` +
    `${c.heads}q/${c.kvHeads}kv hd${c.headSize}`;
  const gf = (data.flops / 1e9).toFixed(1), ms = (performance.now() - t0).toFixed(0);
  console.log(`\n${label}: ${gf} GFLOP (data ${ms} ms)`);
  console.log(
    "variant".padEnd(19) + " rows  wgmem    wgs   median ms    min ms   TFLOP/s  check ms" +
      "  rows-vs-cpu  vs-first  verdict",
  );
  let first: Uint16Array | null = null;
  for (const name of only) {
    const shape = variantShape(name);
    if (!shape) {
      throw new Error(
        `unknown variant ${name}; known: ${Object.keys(MMA_VARIANTS)}, each optionally with ` +
          ABLATIONS.map((a) => `~no${a}`).join(" / "),
      );
    }
    const ablation = Boolean(shape.ablate);
    const consts = mmaConstsOf(ctx, data.batch, ctx.mma, shape);
    if (consts instanceof MmaRefusal) {
      console.log(`${name.padEnd(19)} skipped: ${consts.detail}`);
      continue;
    }
    const lay = mmaLayout(consts, consts);
    let plan: GpuPlan | null = null;
    try {
      plan = await planFlashMma(ctx, data.batch, ctx.mma, shape);
      const r = await runGpuPlan(plan, data.batch, ctx);
      const o = r.output.bytes, out = new Uint16Array(o.buffer, o.byteOffset, o.byteLength / 2);
      // An ablation computes something else by design: checked only when asked, never a failure.
      const checked = !ablation || checkAblations;
      const rows = checked ? checkRows(data, out, r.lse!, small ? 24 : 48) : null;
      const agree = first && checked ? compareOutputs(out, first) : null;
      const right = !rows ||
        (rows.worst <= 1 && rows.lseErr <= 1e-3 && (!agree || agree.bad === 0));
      const ok = ablation || right;
      if (right && rows && !first && !ablation) first = out;
      const verdict = !ablation
        ? ok ? "ok" : "WRONG"
        : checked
        ? right ? "ablation, right" : "ablation, differs"
        : "ablation, not checked";
      // Warm up for ~0.5 s of device time: the H200 idles at 345 MHz, and a few ms of work
      // do not bring it to its 1980 MHz boost (4 x 1024 read 5-8x slow that way).
      const once = r.timings?.gpu_prefill_mma ?? r.timings?.gpu ?? NaN;
      const warm = Math.min(2000, Math.max(3, Math.ceil(500 / (once > 0 ? once : 1))));
      const times = timed ? await deviceTimes(ctx, plan, data, iters, warm) : [NaN];
      const med = times[Math.floor(times.length / 2)];
      const tflops = data.flops / (med * 1e-3) / 1e12;
      const wgs = (plan.info.prefill_tiles ?? 0) * c.kvHeads; // workgroups: (tile, kv head)
      console.log(
        name.padEnd(19) + String(lay.rows).padStart(5) + String(lay.shared_bytes).padStart(7) +
          String(wgs).padStart(7) + med.toFixed(3).padStart(12) + times[0].toFixed(3).padStart(10) +
          tflops.toPrecision(4).padStart(10) + once.toPrecision(4).padStart(10) +
          (rows ? rows.worst.toFixed(3) : "-").padStart(13) +
          (agree ? `${agree.bad} bad` : "-").padStart(10) + `  ${verdict}`,
      );
      results.push({
        case: label,
        variant: name,
        shape,
        layout: lay,
        workgroups: wgs,
        median_ms: med,
        times,
        tflops,
        rows,
        agree,
        ok,
        verdict,
      });
    } catch (err) {
      console.log(
        `${name.padEnd(19)} failed: ${err instanceof Error ? err.message.split("\n")[0] : err}`,
      );
    }
  }
  data.cache.destroy();
}
if (args.values.json) console.log(JSON.stringify(results));
Deno.exit(0);
