/**
 * Ceiling probe of Dawn's subgroup matrices (`chromium-experimental-subgroup-matrix`): what
 * f16 x f16 -> f32 multiply-accumulate loops reach on this device in several arrangements
 * (bench/mma_ceiling_wgsl.ts names them): accumulators per subgroup (1x1 .. 4x4 fragments),
 * fragments from storage vs staged in workgroup memory (f16 stores or matrix stores; double or
 * triple buffered), k-step unrolling, A held in registers as attention holds Q (`flash`), and no
 * loads at all (`reg`). Device time by timestamp-query (median of `--iters` passes after ~0.5 s
 * of warm-up); every arrangement's output is poisoned first and 48 sampled elements are checked
 * against a float64 product of the same f16 inputs (|diff| <= 1e-3 sum|a b| + 1e-3), so a fast
 * but wrong arrangement says WRONG.
 *
 * The ladder (`ladder-qk`, `-s`, `-pv`, `-sm`, `-pg`: bench/mma_ladder_wgsl.ts) grows the QK^T
 * loop into attention step by step; its outputs are checked the same way against its own float64
 * reference (TFLOP/s count QK^T, + PV from `ladder-pv` on). The v0.7 ladder
 * (`ladder-{sm|pg}-k{BK}-w{NSG}[-r1][-sb|-sl|-2b|-nb]`: bench/mma_ladder2_wgsl.ts) reshapes L4 / L5:
 * longer key tiles, fewer subgroups, the softmax over every lane, other barrier schedules.
 *
 * Usage: deno run -A bench/mma_ceiling.ts [--small] [--iters N] [--only name,name] [--json]
 *   [--flash-rows N] [--flash-keys N]
 * @module
 */
import { parseArgs } from "node:util";
import { acquireMmaDevice, type MmaContext } from "../gpu/flash_mma_device.ts";
import {
  type Ceiling,
  ceilingFlops,
  ceilingGrid,
  ceilingLayout,
  ceilingProblem,
  type CeilingSize,
  ceilingSource,
  type MatrixDims,
  parseCeiling,
} from "./mma_ceiling_wgsl.ts";
import {
  fillBlockTable,
  ladderBytes,
  ladderExpected,
  ladderExtents,
  ladderFlops,
  ladderSource,
  parseLadder,
} from "./mma_ladder_wgsl.ts";
import {
  isLadder2,
  ladder2Bytes,
  ladder2Problem,
  ladder2Source,
  parseLadder2,
} from "./mma_ladder2_wgsl.ts";
import { compile, passTimes } from "./mma_probe_gpu.ts";

/** The arrangements run without --only (bench/NOTES.md, "v0.6 tensor-core variants"). */
export const CEILING_DEFAULTS = [
  "reg-st-1x1-w4x1",
  "reg-st-2x2-w4x1",
  "reg-st-2x4-w4x1",
  "reg-st-4x4-w4x1",
  "gemm-st-1x1-w2x2",
  "gemm-st-2x2-w2x2",
  "gemm-st-2x4-w2x2",
  "gemm-st-4x4-w2x2",
  "gemm-st-2x4-w2x2-k2",
  "gemm-st-2x2-w2x2-bn",
  "gemm-wg-2x2-w2x2",
  "gemm-wg-2x4-w2x2",
  "gemm-wg-4x4-w2x2",
  "gemm-wg-2x4-w2x2-k2",
  "gemm-wg-2x4-w2x2-b3",
  "gemm-wg-2x4-w2x2-bn",
  "gemm-wx-2x4-w2x2",
  "gemm-wx-4x4-w2x2",
  "gemm-wx-2x4-w2x2-k2",
  "flash-st-1x1-w8x1",
  "flash-st-1x2-w8x1",
  "flash-st-1x4-w8x1",
  "flash-st-2x2-w4x1",
  "flash-st-2x4-w4x1",
  "flash-wg-1x1-w8x1",
  "flash-wg-1x2-w8x1",
  "flash-wg-1x4-w8x1",
  "flash-wg-2x2-w4x1",
  "flash-wg-2x4-w4x1",
  "flash-wg-1x4-w4x2",
  "flash-wg-1x2-w8x1-b3",
  "flash-wx-1x4-w8x1",
  "flash-wx-2x2-w4x1",
];

const args = parseArgs({
  args: Deno.args,
  options: {
    small: { type: "boolean", default: false },
    iters: { type: "string", default: "20" },
    only: { type: "string", default: "" },
    json: { type: "boolean", default: false },
    "flash-rows": { type: "string", default: "" },
    "flash-keys": { type: "string", default: "" },
  },
});

/** Problem sizes per loop: GPUs, and software adapters (`--small`). */
const SIZES: Record<"gpu" | "small", Record<Ceiling["loop"], CeilingSize>> = {
  gpu: {
    gemm: { m: 4096, n: 4096, k: 4096 },
    flash: { m: 32768, n: 4096, k: 128 }, // rows, keys, head: one GQA group's K is 1 MB
    reg: { m: 8192, n: 2048, k: 0 }, // subgroups, iterations
  },
  small: {
    gemm: { m: 64, n: 64, k: 64 },
    flash: { m: 64, n: 128, k: 32 }, // 128 keys: the v0.7 ladder's k64 still loops
    reg: { m: 8, n: 16, k: 0 },
  },
};

// `--flash-rows` / `--flash-keys` resize the flash loops' problem (both size classes): with rows a
// multiple of 128, e.g. 132, 264 and 396 workgroups of 128 rows at equal keys, the time says how
// many workgroups an SM keeps resident (flat while they all fit at once).
for (const [flag, key] of [["flash-rows", "m"], ["flash-keys", "n"]] as const) {
  const v = args.values[flag];
  if (!v) continue;
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 1) throw new Error(`--${flag} must be a positive integer`);
  for (const size of Object.values(SIZES)) size.flash[key] = n;
}

/** Element counts of A, B and C for one arrangement. */
function extents(v: Ceiling, d: MatrixDims, s: CeilingSize) {
  if (v.loop === "reg") {
    const rows = s.m * v.tm * d.m;
    return { a: rows * d.k, b: v.tn * d.n * d.k, c: rows * v.tn * d.n, ldc: v.tn * d.n };
  }
  const ldc = v.loop === "flash" ? ceilingLayout(v, d, s).bn : s.n;
  return { a: s.m * s.k, b: s.n * s.k, c: s.m * ldc, ldc };
}

/** The float64 value of C[r, col] and the sum of |terms| (the tolerance's scale). */
function expected(
  v: Ceiling,
  d: MatrixDims,
  s: CeilingSize,
  a: Float16Array,
  b: Float16Array,
  r: number,
  col: number,
): [number, number] {
  let sum = 0, mag = 0;
  const add = (x: number, y: number) => {
    sum += x * y;
    mag += Math.abs(x * y);
  };
  if (v.loop === "reg") {
    for (let k = 0; k < d.k; k++) add(a[r * d.k + k], b[col * d.k + k]);
    const times = s.n * v.ku;
    return [sum * times, mag * times];
  }
  if (v.loop === "flash") {
    const bn = ceilingLayout(v, d, s).bn;
    for (let key = col; key < s.n; key += bn) {
      for (let k = 0; k < s.k; k++) add(a[r * s.k + k], b[key * s.k + k]);
    }
    return [sum, mag];
  }
  for (let k = 0; k < s.k; k++) add(a[r * s.k + k], v.bn ? b[k * s.n + col] : b[col * s.k + k]);
  return [sum, mag];
}

function randomF16(n: number): Float16Array {
  const x = new Float16Array(n);
  for (let i = 0; i < n; i++) x[i] = Math.random() * 2 - 1;
  return x;
}

/** Compiles, runs, checks and times one arrangement; a table row (and its JSON). */
async function probe(ctx: MmaContext, v: Ceiling, s: CeilingSize, iters: number) {
  const dev = ctx.device, d: MatrixDims = ctx.mma, lad = (v.step ?? 0) > 1;
  const ext = lad ? ladderExtents(v, d, s) : extents(v, d, s);
  const a = randomF16(ext.a), b = randomF16(ext.b);
  fillBlockTable(v, s, b);
  const buf = (bytes: number, usage: number) =>
    dev.createBuffer({ size: Math.ceil(bytes / 16) * 16, usage });
  const st = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
  const ab = buf(a.byteLength, st), bb = buf(b.byteLength, st);
  const cb = buf(4 * ext.c, st | GPUBufferUsage.COPY_SRC);
  const rb = buf(4 * ext.c, GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST);
  try {
    dev.queue.writeBuffer(ab, 0, a.buffer as ArrayBuffer);
    dev.queue.writeBuffer(bb, 0, b.buffer as ArrayBuffer);
    dev.queue.writeBuffer(cb, 0, new Uint32Array(ext.c).fill(0xffffffff)); // NaN poison
    const entry = (binding: number, type: GPUBufferBindingType) => ({
      binding,
      visibility: GPUShaderStage.COMPUTE,
      buffer: { type },
    });
    const layout = dev.createBindGroupLayout({
      entries: [
        entry(0, "read-only-storage"),
        entry(1, "read-only-storage"),
        entry(2, "storage"),
        entry(3, "read-only-storage"),
        entry(4, "read-only-storage"),
      ],
    });
    const t0 = performance.now();
    const code = isLadder2(v)
      ? ladder2Source(v, d, s)
      : v.step
      ? ladderSource(v, d, s)
      : ceilingSource(v, d, s);
    const pipe = await compile(dev, code, layout);
    const compileMs = performance.now() - t0;
    const bg = dev.createBindGroup({
      layout,
      entries: [ab, bb, cb, ab, bb].map((buffer, binding) => ({ binding, resource: { buffer } })),
    });
    const grid = ceilingGrid(v, d, s);
    const e = dev.createCommandEncoder();
    const ps = e.beginComputePass();
    ps.setPipeline(pipe);
    ps.setBindGroup(0, bg);
    ps.dispatchWorkgroups(grid[0], grid[1]);
    ps.end();
    e.copyBufferToBuffer(cb, 0, rb, 0, rb.size);
    dev.queue.submit([e.finish()]);
    await rb.mapAsync(GPUMapMode.READ);
    const c = new Float32Array(rb.getMappedRange().slice(0));
    rb.unmap();
    let worst = 0;
    const rows = lad ? s.m : ext.c / ext.ldc, sums = (v.step ?? 0) >= 4 ? 1 : 0; // L4: + row sums
    for (let i = 0; i < 48; i++) {
      const r = Math.floor(Math.random() * rows);
      const col = Math.floor(Math.random() * (ext.ldc + sums));
      const [want, mag] = lad
        ? ladderExpected(v, d, s, a, b, r, col)
        : expected(v, d, s, a, b, r, col);
      const got = col < ext.ldc ? c[r * ext.ldc + col] : c[rows * ext.ldc + r];
      const err = Math.abs(got - want) / (1e-3 * mag + 1e-3);
      worst = Number.isNaN(err) ? Infinity : Math.max(worst, err);
    }
    const timed = ctx.features.has("timestamp-query");
    const first = timed ? await passTimes(dev, pipe, bg, grid, 3, 1) : [NaN];
    const once = first[1];
    const warm = Math.min(2000, Math.max(3, Math.ceil(500 / (once > 0 ? once : 1))));
    const times = timed ? await passTimes(dev, pipe, bg, grid, iters, warm) : [NaN];
    const med = times[Math.floor(times.length / 2)];
    const flops = lad ? ladderFlops(v, s) : ceilingFlops(v, d, s);
    const tflops = flops / (med * 1e-3) / 1e12;
    return { compileMs, med, min: times[0], tflops, worst, ok: worst <= 1 };
  } finally {
    for (const x of [ab, bb, cb, rb]) x.destroy();
  }
}

const acquired = await acquireMmaDevice();
if (!acquired.ctx) {
  console.log(`mma ceiling probe skipped: ${acquired.reason}`);
  Deno.exit(0);
}
const ctx = acquired.ctx, info = ctx.adapter_info;
const limit = ctx.limits.maxComputeWorkgroupStorageSize;
const small = args.values.small || info.vendor === "mesa" || /llvmpipe/.test(info.description);
console.log(
  `adapter: ${info.vendor} ${info.description || info.device}; subgroup ${ctx.mma.sg}; ` +
    `matrices ${ctx.mma.m}x${ctx.mma.n}x${ctx.mma.k} f16->f32; workgroup memory ${limit} B; ` +
    `sizes ${small ? "small" : "gpu"}: ${JSON.stringify(SIZES[small ? "small" : "gpu"])}`,
);
console.log(
  "arrangement".padEnd(24) + " acc  wgmem  compile ms  median ms    min ms   TFLOP/s  check",
);
const iters = Math.max(1, Number(args.values.iters));
const names = args.values.only ? args.values.only.split(",") : CEILING_DEFAULTS;
const results: Record<string, unknown>[] = [];
for (const name of names) {
  const v = parseLadder(name) ?? parseLadder2(name, ctx.mma) ?? parseCeiling(name);
  if (!v) throw new Error(`unknown arrangement ${name} (bench/mma_ceiling_wgsl.ts's grammar)`);
  const s = SIZES[small ? "small" : "gpu"][v.loop], lay = ceilingLayout(v, ctx.mma, s);
  const bytes = isLadder2(v)
    ? ladder2Bytes(v, ctx.mma, s)
    : (v.step ?? 0) > 1
    ? ladderBytes(v, ctx.mma, s)
    : lay.bytes;
  const problem = ceilingProblem(v, ctx.mma, s) ??
    (isLadder2(v) ? ladder2Problem(v, ctx.mma) : null) ??
    (bytes > limit ? `needs ${bytes} B of workgroup memory` : null);
  if (problem) {
    console.log(`${name.padEnd(24)} skipped: ${problem}`);
    continue;
  }
  try {
    const r = await probe(ctx, v, s, iters);
    console.log(
      name.padEnd(24) + String(v.tm * v.tn).padStart(4) + String(bytes).padStart(7) +
        r.compileMs.toFixed(0).padStart(12) + r.med.toFixed(3).padStart(11) +
        r.min.toFixed(3).padStart(10) + (" " + r.tflops.toPrecision(4)).padStart(10) +
        `  ${r.ok ? "ok" : "WRONG"} (${r.worst.toFixed(3)})`,
    );
    results.push({ ...v, wgmem: bytes, ...r });
  } catch (err) {
    console.log(`${name.padEnd(24)} failed: ${err instanceof Error ? err.message : err}`);
  }
}
if (args.values.json) console.log(JSON.stringify(results));
Deno.exit(0);
