/**
 * One-call benchmark of the subgroup-matrix prefill kernel (wgsl/flash_mma.wgsl) on Dawn:
 * causal f16 prefill, 32 q / 8 kv heads, head 128, block 16 (GPU shapes 4 x 1024 and
 * 8 x 4096; `--small` for software adapters), several kernel shapes. Device time by
 * timestamp-query (median of `--iters` dispatches after a warm-up), TFLOP/s =
 * 4 * sum_i(q_i * visible_i) * H * D / time. Every variant is checked: sampled rows against a
 * float64 CPU reference, and every element against the first variant that passed that check,
 * so a fast-but-wrong variant is flagged, not ranked.
 *
 * Usage: deno run -A bench/mma_bench.ts [--small] [--iters N] [--only name,name] [--json]
 * @module
 */
import { parseArgs } from "node:util";
import { mmaLayout, type MmaShape, mmaShapeProblem } from "../gpu/flash_mma_codegen.ts";
import { acquireMmaDevice, type MmaContext } from "../gpu/flash_mma_device.ts";
import {
  encodeFlashMma,
  type MmaLaunch,
  mmaSpecOf,
  prepareFlashMma,
  submitAndRead,
} from "../gpu/flash_mma_launch.ts";
import { GpuKvCache } from "../gpu/kv_cache.ts";
import { checkRows, compareOutputs, type PrefillCase, prefillData } from "./mma_bench_data.ts";

/** Kernel variants: name -> shape (see bench/NOTES.md for what each should reach). */
export const VARIANTS: Record<string, MmaShape> = {
  "w4r1k32": { nsg: 4, rm: 1, bk: 32, tau: 8 },
  "w4r1k32-fa2": { nsg: 4, rm: 1, bk: 32, tau: 0 },
  "w4r1k16": { nsg: 4, rm: 1, bk: 16, tau: 8 },
  "w4r1k64": { nsg: 4, rm: 1, bk: 64, tau: 8 },
  "w8r1k32": { nsg: 8, rm: 1, bk: 32, tau: 8 },
  "w2r1k32": { nsg: 2, rm: 1, bk: 32, tau: 8 },
  "w4r2k32": { nsg: 4, rm: 2, bk: 32, tau: 8 },
  "w2r2k32": { nsg: 2, rm: 2, bk: 32, tau: 8 },
  "w4r2k16": { nsg: 4, rm: 2, bk: 16, tau: 8 },
};

const args = parseArgs({
  args: Deno.args,
  options: {
    small: { type: "boolean", default: false },
    iters: { type: "string", default: "20" },
    only: { type: "string", default: "" },
    json: { type: "boolean", default: false },
  },
});
const iters = Math.max(1, Number(args.values.iters));
const only = args.values.only ? args.values.only.split(",") : Object.keys(VARIANTS);

const GPU_CASES: PrefillCase[] = [
  { reqs: 4, len: 1024, heads: 32, kvHeads: 8, headSize: 128, blockSize: 16 },
  { reqs: 8, len: 4096, heads: 32, kvHeads: 8, headSize: 128, blockSize: 16 },
];
const SMALL_CASES: PrefillCase[] = [
  { reqs: 2, len: 96, heads: 8, kvHeads: 2, headSize: 128, blockSize: 16 },
];

/** Median and min of `iters` timestamped dispatches (ms), after 3 untimed ones. */
async function deviceTimes(ctx: MmaContext, l: MmaLaunch, n: number): Promise<number[]> {
  const dev = ctx.device;
  for (let i = 0; i < 3; i++) {
    const e = dev.createCommandEncoder();
    encodeFlashMma(l, e);
    dev.queue.submit([e.finish()]);
  }
  await dev.queue.onSubmittedWorkDone();
  const qs = dev.createQuerySet({ type: "timestamp", count: 2 * n });
  const resolve = dev.createBuffer({
    size: 16 * n,
    usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
  });
  const read = dev.createBuffer({
    size: 16 * n,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const e = dev.createCommandEncoder();
  for (let i = 0; i < n; i++) {
    encodeFlashMma(l, e, {
      querySet: qs,
      beginningOfPassWriteIndex: 2 * i,
      endOfPassWriteIndex: 2 * i + 1,
    });
  }
  e.resolveQuerySet(qs, 0, 2 * n, resolve, 0);
  e.copyBufferToBuffer(resolve, 0, read, 0, 16 * n);
  dev.queue.submit([e.finish()]);
  await read.mapAsync(GPUMapMode.READ);
  const t = new BigUint64Array(read.getMappedRange().slice(0));
  read.unmap();
  for (const b of [qs, resolve, read]) b.destroy();
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
  `adapter: ${info.vendor} ${info.description || info.device}; subgroup ${ctx.subgroup_size}; ` +
    `matrices ${ctx.mma.m}x${ctx.mma.n}x${ctx.mma.k} f16->f32; workgroup memory ${limit} B; ` +
    `timestamps ${ctx.features.has("timestamp-query")}`,
);
const small = args.values.small || info.vendor === "mesa" || /llvmpipe/.test(info.description);
const results: Record<string, unknown>[] = [];
for (const c of small ? SMALL_CASES : GPU_CASES) {
  const t0 = performance.now();
  const data = prefillData(c);
  const cache = await GpuKvCache.fromBytes(
    ctx,
    data.spec,
    new Uint8Array(data.key.buffer),
    new Uint8Array(data.value.buffer),
  );
  const label = `prefill ${c.reqs}x${c.len} causal f16 ${c.heads}q/${c.kvHeads}kv hd${c.headSize}`;
  console.log(
    `\n${label}: ${(data.flops / 1e9).toFixed(1)} GFLOP (data ${
      (performance.now() - t0).toFixed(0)
    } ms)`,
  );
  console.log(
    "variant        rows  wgmem   median ms    min ms   TFLOP/s  rows-vs-cpu  vs-first      verdict",
  );
  let first: Uint16Array | null = null;
  for (const name of only) {
    const shape = VARIANTS[name];
    if (!shape) {
      throw new Error(`unknown variant ${name}; known: ${Object.keys(VARIANTS).join(", ")}`);
    }
    const spec = mmaSpecOf(ctx, data.batch, cache);
    const problem = mmaShapeProblem(spec, shape, limit);
    if (problem) {
      console.log(`${name.padEnd(14)} skipped: ${problem}`);
      continue;
    }
    const lay = mmaLayout(spec, shape);
    let l: MmaLaunch | null = null;
    try {
      l = await prepareFlashMma(ctx, data.batch, cache, shape);
      const e = ctx.device.createCommandEncoder();
      encodeFlashMma(l, e);
      const r = await submitAndRead(l, e);
      const rows = checkRows(data, r, small ? 24 : 48);
      const agree = first ? compareOutputs(r.output, first) : null;
      const ok = rows.worst <= 1 && rows.lseErr <= 1e-3 && (!agree || agree.bad === 0);
      if (ok && !first) first = r.output;
      const times = ctx.features.has("timestamp-query") ? await deviceTimes(ctx, l, iters) : [NaN];
      const med = times[Math.floor(times.length / 2)];
      const tflops = data.flops / (med * 1e-3) / 1e12;
      const vs = agree ? `${agree.bad} bad` : "(first)";
      console.log(
        `${name.padEnd(14)}${String(lay.rows).padStart(5)}${String(lay.shared_bytes).padStart(7)}` +
          `${med.toFixed(3).padStart(12)}${times[0].toFixed(3).padStart(10)}${
            tflops.toFixed(2).padStart(10)
          }` +
          `${rows.worst.toFixed(3).padStart(13)}  ${vs.padEnd(12)}${ok ? "ok" : "WRONG"}`,
      );
      results.push({
        case: label,
        variant: name,
        shape,
        rows: lay.rows,
        shared_bytes: lay.shared_bytes,
        median_ms: med,
        min_ms: times[0],
        tflops,
        rows_worst: rows.worst,
        lse_err: rows.lseErr,
        agree,
        ok,
      });
    } catch (err) {
      console.log(
        `${name.padEnd(14)} failed: ${err instanceof Error ? err.message.split("\n")[0] : err}`,
      );
    } finally {
      l?.bufs.destroy();
    }
  }
  cache.destroy();
}
if (args.values.json) console.log(JSON.stringify(results));
Deno.exit(0);
