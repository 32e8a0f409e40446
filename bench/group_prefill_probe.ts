/**
 * `deno run -A bench/group_prefill_probe.ts [--runtime deno|dawn] [--cases 4x1024,8x4096]
 * [--small] [--shapes T:KPL,...] [--reps N]`: the token-group prefill probe
 * (bench/group_prefill_wgsl.ts), whether sharing each K/V row between the tokens of a group lifts
 * portable prefill (issue 8's 0.4x of the FMA ceiling) above the split-KV path WEBGPU_FLASH takes
 * without subgroup matrices. Causal f16 prefill over a paged f16 cache (block size 16, blocks
 * shuffled), 32 q / 8 kv heads (`--small`: 16 / 4 and 2 x 256), head 128. Per case and shape:
 * device ms (timestamp-query, median of `--reps` passes after warm-up passes), TFLOP/s (4 S^2 H D
 * / 2 per sequence), x the same run's FMA ceiling (bench/fma.ts), and the largest difference of
 * sampled rows from a float64 reference (`ok` within 2e-3; every row on `--small`).
 * @module
 */
import { parseArgs } from "node:util";
import type { GpuContext } from "../core/types.ts";
import { getComputePipeline } from "../gpu/pipelines.ts";
import { benchDevice } from "./bench_device.ts";
import { fmaBench } from "./fma.ts";
import { groupPrefillWgsl, type GroupShape } from "./group_prefill_wgsl.ts";

const { values: a } = parseArgs({
  options: {
    runtime: { type: "string" },
    cases: { type: "string", default: "4x1024,8x4096" },
    small: { type: "boolean", default: false },
    shapes: { type: "string", default: "2:1,4:1,4:2,8:1" },
    reps: { type: "string", default: "5" },
  },
});

const D = 128, BS = 16;

/** One case's data: f16 q (tokens x HQ x D) and a paged f16 cache, as halves and as f32. */
interface Case {
  seqs: number;
  s: number;
  hq: number;
  hkv: number;
  q: Uint16Array;
  k: Uint16Array;
  v: Uint16Array;
  bt: Int32Array;
  maxBlocks: number;
}

const f16 = (x: number) => {
  const h = new Float16Array(1);
  h[0] = x;
  return new Uint16Array(h.buffer)[0];
};
const half = (u: number) => new Float16Array(new Uint16Array([u]).buffer)[0];

function makeCase(seqs: number, s: number, hq: number, hkv: number): Case {
  const maxBlocks = Math.ceil(s / BS), blocks = seqs * maxBlocks;
  const rnd = (n: number) => Uint16Array.from({ length: n }, () => f16(Math.random() * 2 - 1));
  const q = rnd(seqs * s * hq * D);
  const k = rnd(blocks * BS * hkv * D), v = rnd(blocks * BS * hkv * D);
  const perm = Array.from({ length: blocks }, (_, i) => i).sort(() => Math.random() - 0.5);
  return { seqs, s, hq, hkv, q, k, v, bt: Int32Array.from(perm), maxBlocks };
}

/** Float64 attention of one row (token `tok` of sequence `seq`, query head `h`). */
function refRow(c: Case, seq: number, tok: number, h: number, scale: number): Float64Array {
  const g = c.hq / c.hkv, kvh = Math.floor(h / g), qo = ((seq * c.s + tok) * c.hq + h) * D;
  const row = (p: number) =>
    (c.bt[seq * c.maxBlocks + Math.floor(p / BS)] * BS + p % BS) * c.hkv + kvh;
  const sc = new Float64Array(tok + 1);
  let mx = -Infinity;
  for (let p = 0; p <= tok; p++) {
    let dot = 0;
    const ko = row(p) * D;
    for (let d = 0; d < D; d++) dot += half(c.q[qo + d]) * half(c.k[ko + d]);
    sc[p] = dot * scale;
    mx = Math.max(mx, sc[p]);
  }
  const o = new Float64Array(D);
  let sum = 0;
  for (let p = 0; p <= tok; p++) {
    const w = Math.exp(sc[p] - mx), vo = row(p) * D;
    sum += w;
    for (let d = 0; d < D; d++) o[d] += w * half(c.v[vo + d]);
  }
  return o.map((x) => x / sum);
}

function buffer(gpu: GpuContext, data: ArrayBufferView, usage: number): GPUBuffer {
  const size = Math.ceil(data.byteLength / 16) * 16;
  const b = gpu.device.createBuffer({ size, usage: usage | GPUBufferUsage.COPY_DST });
  gpu.device.queue.writeBuffer(b, 0, data.buffer as ArrayBuffer, data.byteOffset, data.byteLength);
  return b;
}

/** Runs one shape on one case: device ms (median of reps) and the output. */
async function run(gpu: GpuContext, c: Case, sh: GroupShape, reps: number) {
  const dev = gpu.device, scale = 1 / Math.sqrt(D);
  const code = groupPrefillWgsl(sh);
  const pipe = await getComputePipeline(gpu, `group_prefill:t${sh.t}g${sh.g}k${sh.kpl}`, code);
  const ngroups = c.s / sh.t, total = ngroups * c.seqs * c.hkv;
  const nwgX = Math.min(total, 65535), nwgY = Math.ceil(total / nwgX);
  const params = new ArrayBuffer(32), pu = new Uint32Array(params);
  pu.set([c.s, c.hq, c.hkv, c.maxBlocks, ngroups, c.seqs, nwgX]);
  new Float32Array(params)[7] = scale;
  const S = GPUBufferUsage.STORAGE;
  const outBytes = c.seqs * c.s * c.hq * D * 4;
  const out = dev.createBuffer({ size: outBytes, usage: S | GPUBufferUsage.COPY_SRC });
  const bufs = [
    buffer(gpu, new Uint8Array(params), GPUBufferUsage.UNIFORM),
    buffer(gpu, c.q, S),
    buffer(gpu, c.k, S),
    buffer(gpu, c.v, S),
    buffer(gpu, c.bt, S),
    out,
  ];
  const bind = dev.createBindGroup({
    layout: pipe.getBindGroupLayout(0),
    entries: bufs.map((buffer, binding) => ({ binding, resource: { buffer } })),
  });
  const n = reps + 3, qs = dev.createQuerySet({ type: "timestamp", count: 2 * n });
  const enc = dev.createCommandEncoder();
  for (let i = 0; i < n; i++) {
    const pass = enc.beginComputePass({
      timestampWrites: {
        querySet: qs,
        beginningOfPassWriteIndex: 2 * i,
        endOfPassWriteIndex: 2 * i + 1,
      },
    });
    pass.setPipeline(pipe);
    pass.setBindGroup(0, bind);
    pass.dispatchWorkgroups(nwgX, nwgY);
    pass.end();
  }
  const res = dev.createBuffer({
    size: 16 * n,
    usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
  });
  const rb = dev.createBuffer({
    size: 16 * n,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const orb = dev.createBuffer({
    size: outBytes,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  enc.resolveQuerySet(qs, 0, 2 * n, res, 0);
  enc.copyBufferToBuffer(res, 0, rb, 0, 16 * n);
  enc.copyBufferToBuffer(out, 0, orb, 0, outBytes);
  dev.queue.submit([enc.finish()]);
  await Promise.all([rb.mapAsync(GPUMapMode.READ), orb.mapAsync(GPUMapMode.READ)]);
  const t = new BigInt64Array(rb.getMappedRange());
  const ms =
    Array.from({ length: reps }, (_, i) => Number(t[2 * (i + 3) + 1] - t[2 * (i + 3)]) / 1e6)
      .sort((x, y) => x - y)[Math.floor(reps / 2)];
  const o = new Float32Array(orb.getMappedRange().slice(0));
  for (const b of [...bufs, res, rb, orb]) b.destroy();
  qs.destroy();
  return { ms, o };
}

/** Largest difference from float64 over `rows` sampled (token, head) rows (every row if null). */
function check(c: Case, o: Float32Array, sample: number | null): number {
  let worst = 0;
  const scale = 1 / Math.sqrt(D);
  const all = c.seqs * c.s * c.hq, n = sample ?? all;
  for (let i = 0; i < n; i++) {
    const flat = sample === null ? i : Math.floor(Math.random() * all);
    const pick = i === 0 && sample !== null ? all - 1 : flat; // the longest row, always
    const h = pick % c.hq, tokAll = Math.floor(pick / c.hq);
    const seq = Math.floor(tokAll / c.s), tok = tokAll % c.s;
    const ref = refRow(c, seq, tok, h, scale);
    for (let d = 0; d < D; d++) worst = Math.max(worst, Math.abs(o[pick * D + d] - ref[d]));
  }
  return worst;
}

const { gpu } = await benchDevice(a.runtime);
const fma = await fmaBench(gpu, a.small ? 150 : 20, a.small ? 2 : 5);
console.log(`FMA ceiling ${fma.tflops.toFixed(3)} TFLOP/s (same run)`);
const heads = a.small ? [16, 4] : [32, 8];
const cases = (a.small ? "2x256" : a.cases!).split(",").map((x) => x.split("x").map(Number));
const shapes = a.shapes!.split(",").map((x) => x.split(":").map(Number));
for (const [seqs, s] of cases) {
  const c = makeCase(seqs, s, heads[0], heads[1]);
  for (const [t, kpl] of shapes) {
    const sh: GroupShape = { t, g: heads[0] / heads[1], kpl, d: D, bs: BS };
    const { ms, o } = await run(gpu, c, sh, Number(a.reps));
    const tflops = 4 * seqs * s * s * heads[0] * D / 2 / (ms * 1e9);
    const err = check(c, o, a.small ? null : 48);
    console.log(
      `${seqs}x${s} t${t} g${sh.g} kpl${kpl}: ${ms.toFixed(3)} ms, ${tflops.toFixed(3)} TFLOP/s, ` +
        `${(tflops / fma.tflops).toFixed(3)}x FMA, max diff ${err.toExponential(2)} ` +
        (err < 2e-3 ? "ok" : "WRONG"),
    );
  }
}
