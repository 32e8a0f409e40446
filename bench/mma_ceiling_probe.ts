/**
 * One arrangement of the subgroup-matrix ceiling probe (bench/mma_ceiling.ts) run on the device
 * ({@link probe}): random f16 inputs, the output poisoned with NaN, compiled (timed), dispatched
 * once and 48 sampled elements checked against a float64 product of the same inputs (the ladder's
 * against its own reference, bench/mma_ladder_wgsl.ts), then timed by timestamp-query.
 * @module
 */
import type { MmaContext } from "../gpu/flash_mma_device.ts";
import {
  type Ceiling,
  ceilingFlops,
  ceilingGrid,
  ceilingLayout,
  type CeilingSize,
  ceilingSource,
  type MatrixDims,
} from "./mma_ceiling_wgsl.ts";
import {
  fillBlockTable,
  ladderExpected,
  ladderExtents,
  ladderFlops,
  ladderSource,
} from "./mma_ladder_wgsl.ts";
import { isLadder2, ladder2Source } from "./mma_ladder2_wgsl.ts";
import { compile, passTimes } from "./mma_probe_gpu.ts";

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
export async function probe(ctx: MmaContext, v: Ceiling, s: CeilingSize, iters: number) {
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
