/**
 * One check of the tensor-core prefill kernel against CPU_REFERENCE ({@link checkMma}): a
 * fresh random batch from a {@link BatchSpec}, validated as the service validates
 * (service/host_input.ts), planned on the kernel alone (backends/flash_mma_plan.ts: cache
 * write, poison, attention) and run through the shared launch path (`runGpuPlan`); output
 * (f16/bf16 bits), LSE and the cache after the call compared with the reference's. With
 * `plant`, a few visible context elements of K and V hold a value beyond f16's range: the
 * kernel reads the cache dtype's value, the reference (an f32 cache) the value clamped to
 * +-65504, which is what the kernel's staging does.
 * @module
 */
import { trace } from "../../core/trace.ts";
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { planFlashMma } from "../../backends/flash_mma_plan.ts";
import { toFloat32 } from "../../core/data.ts";
import { decode, encode } from "../../core/dtype.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import type { GpuContext, KvCache } from "../../core/types.ts";
import { fullShape, type MmaShape, type MmaTarget } from "../../gpu/flash_mma_shape.ts";
import { flashMmaSource } from "../../gpu/flash_mma_codegen.ts";
import { acquireMmaDevice, type MmaContext } from "../../gpu/flash_mma_device.ts";
import { runGpuPlan } from "../../gpu/gpu_plan.ts";
import { GpuKvCache, MAX_KV_CHUNK_BYTES } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, cacheIndex, generateBatch, smallSpec } from "./batches.ts";
import { assertClose, firstNonFinite } from "./compare.ts";

export { freshSeed } from "./rng.ts";
import { freshSeed } from "./rng.ts";

/** The tensor-core tests' batch: f16, hd64, 8 q / 2 kv heads, one 29-token prefill, with LSE. */
export const base = (o: Partial<BatchSpec>): BatchSpec =>
  smallSpec({ num_heads: 8, requests: [{ query_len: 29, seq_len: 29 }], ...o });

/** Hostile bf16 batch: bf16 data and cache, HND, block 32, window, soft cap, sinks, ALiBi. */
export const BF16_HND_ALL: BatchSpec = base({
  dtype: "bfloat16",
  kv_cache_dtype: "bfloat16",
  layout: "HND",
  block_size: 32,
  sliding_window: 70,
  logits_soft_cap: 5,
  sinks: true,
  alibi: true,
  requests: [{ query_len: 20, seq_len: 150 }, { query_len: 3, seq_len: 40 }],
});

/** Non-causal prefill over a scaled fp8 e4m3 cache. */
export const FP8_NON_CAUSAL: BatchSpec = base({
  kv_cache_dtype: "fp8_e4m3",
  k_scale: 0.5,
  v_scale: 2,
  causal: false,
  requests: [{ query_len: 24, seq_len: 120 }],
});

/** Causal f16 GQA 4 over 8-slot blocks: a long context, a one-token request, padding. */
export const LONG_CONTEXT_8_SLOT: BatchSpec = base({
  block_size: 8,
  requests: [
    { query_len: 40, seq_len: 230 },
    { query_len: 1, seq_len: 33 },
    { query_len: 17, seq_len: 17, pad: 2 },
  ],
});

/**
 * The hostile batches a form of the key loop (`form`: e.g. `{ pipe: true }`) is checked on:
 * `named` (a full shape of that form) over {@link LONG_CONTEXT_8_SLOT}; then at tau 0 (a rescale
 * on nearly every tile) context, partial and single tiles, every feature over a bf16 HND cache
 * with the generic softmax, and two row blocks a subgroup at GQA 8; a scaled fp8 cache with 32-key
 * tiles.
 */
export function loopFormCases(
  label: string,
  form: Partial<MmaShape>,
  named: MmaShape,
): [string, BatchSpec, MmaShape][] {
  const fast = { rm: 1, bk: 16, fast: true, ...form };
  return [
    [
      `${label}, the default's other fields: causal f16 GQA4, long context over 8-slot blocks`,
      LONG_CONTEXT_8_SLOT,
      named,
    ],
    [
      `${label} + fast, tau 0: a rescale on nearly every tile, context, partial and single tiles`,
      base({
        requests: [
          { query_len: 40, seq_len: 100 },
          { query_len: 1, seq_len: 1 },
          { query_len: 5, seq_len: 12 },
          { query_len: 23, seq_len: 61 },
        ],
      }),
      { ...named, nsg: 4, tau: 0 },
    ],
    [
      `${label}, generic softmax, tau 0: HND bs32 bf16 cache, window, soft cap, sinks, ALiBi`,
      BF16_HND_ALL,
      { nsg: 2, rm: 1, bk: 16, tau: 0, ...form },
    ],
    [
      `${label} + fast: non-causal fp8 e4m3 cache, 32-key tiles`,
      FP8_NON_CAUSAL,
      { ...fast, nsg: 2, bk: 32, tau: 8, opack: true },
    ],
    [
      `${label} + fast: GQA 8, two row blocks a subgroup, tau 0`,
      GQA8_TWO_BLOCKS,
      { ...fast, nsg: 4, rm: 2, tau: 0 },
    ],
  ];
}

/** GQA 8 (16 q / 2 kv heads): a 33-token prefill over context, and a 2-token one. */
export const GQA8_TWO_BLOCKS: BatchSpec = base({
  num_heads: 16,
  requests: [{ query_len: 33, seq_len: 90 }, { query_len: 2, seq_len: 50 }],
});

/** The Dawn subgroup-matrix device for a test file, or null with why `what` is skipped. */
export async function mmaTestDevice(what: string): Promise<MmaContext | null> {
  const acquired = await acquireMmaDevice();
  if (!acquired.ctx) console.warn(`${what} skipped: ${acquired.reason}`);
  return acquired.ctx;
}

/** Options of {@link checkMma}. */
export interface MmaCaseOptions {
  /** Kernel shape (default: the first that fits). */
  shape?: MmaShape;
  /** Cap cache chunks at this many blocks (a multi-chunk cache). */
  maxBlocksPerChunk?: number;
  /** Plant +-plant in a few visible context elements of K and V. */
  plant?: number;
}

/** Output tolerance of the f16 path: f16/bf16 data; fp8 caches looser. */
export function mmaTolerance(s: BatchSpec): { atol: number; rtol: number } {
  const fp8 = ["fp8", "fp8_e4m3", "fp8_e5m2"].includes(s.kv_cache_dtype);
  return fp8 ? { atol: 6e-2, rtol: 1e-1 } : { atol: 1e-2, rtol: 1e-2 };
}

/** Sets three context elements of request 0 (kv head 0) in K and V to +-v0. */
function plantValues(s: BatchSpec, k: Float32Array, v: Float32Array, bt: Int32Array, v0: number) {
  const r = s.requests[0], ctxLen = Math.max(1, r.seq_len - r.query_len);
  for (let j = 0; j < 3; j++) {
    const pos = (5 * j) % ctxLen, o = pos % s.block_size;
    const block = bt[Math.floor(pos / s.block_size)];
    const at = cacheIndex(s.layout, s.block_size, s.num_kv_heads, s.head_size, block, o, 0);
    k[at + j] = j % 2 ? -v0 : v0;
    v[at + 2 * j] = j % 2 ? v0 : -v0;
  }
}

/** Runs one case on a fresh batch from `seed`; throws an AssertionError naming the seed. */
export async function checkMma(
  ctx: MmaContext,
  s: BatchSpec,
  seed: number,
  o: MmaCaseOptions = {},
): Promise<void> {
  const g = generateBatch(s, seed);
  let gctx: GpuContext = ctx;
  let key = g.key_cache, value = g.value_cache;
  let ref: KvCache | null = null, cache: GpuKvCache | null = null, refBatch = g.batch;
  if (g.cache_spec) {
    if (o.maxBlocksPerChunk) {
      const bytes = o.maxBlocksPerChunk * (key.byteLength / g.cache_spec.num_blocks);
      gctx = { ...ctx, limits: { ...ctx.limits, [MAX_KV_CHUNK_BYTES]: bytes } };
    }
    if (o.plant !== undefined) {
      const st = g.storage!, kv = decode(st, key), vv = decode(st, value);
      plantValues(s, kv, vv, g.batch.metadata.block_table, o.plant);
      [key, value] = [encode(st, kv), encode(st, vv)];
      const clamped = (x: Float32Array) =>
        encode(
          "float32",
          decode(st, encode(st, x)).map((y) => Math.max(-65504, Math.min(65504, y))),
        );
      const spec = { ...g.cache_spec, dtype: "float32" as const, kv_cache_dtype: "auto" as const };
      ref = HostKvCache.fromBytes(spec, clamped(kv), clamped(vv));
      // The call's new K/V as the cache write stores them (rounded to the storage dtype): the
      // f32 reference cache would keep them exact, and with a bf16 cache that alone put the LSE
      // of rows far from the planted values 1.5x over tolerance for some seeds (sid lavapipe).
      const stored = (x: Float32Array | null) => x && decode(st, encode(st, x));
      refBatch = {
        ...g.batch,
        dtype: "float32",
        key: stored(g.batch.key),
        value: stored(g.batch.value),
      };
    } else ref = HostKvCache.fromBytes(g.cache_spec, key, value);
    trace(`checkMma seed ${seed}: cache upload`);
    cache = await GpuKvCache.fromBytes(gctx, g.cache_spec, key, value);
    if (o.maxBlocksPerChunk) assert.ok(cache.geometry.nchunk > 1, "a multi-chunk cache");
  }
  try {
    trace(`checkMma seed ${seed}: reference`);
    const want = await CPU_REFERENCE.run({}, validHostBatch(refBatch, ref), { gpu: null });
    const batch = validHostBatch(g.batch, cache);
    trace(`checkMma seed ${seed}: plan`);
    const plan = await planFlashMma(gctx, batch, ctx.mma, o.shape);
    const what = `${plan.kernels.join(" + ")}, seed ${seed}`;
    assert.ok(plan.kernels.some((k) => k.startsWith("flash_mma(")), `planned ${what}`);
    trace(`checkMma seed ${seed}: run ${what}`);
    const got = await runGpuPlan(plan, batch, gctx);
    trace(`checkMma seed ${seed}: checks`);
    assert.equal(got.output.dtype, s.dtype, `output dtype (${what})`);
    const out = toFloat32(got.output);
    assert.equal(firstNonFinite(out), -1, `output has a non-finite element (${what})`);
    assertClose(out, toFloat32(want.output), {
      ...mmaTolerance(s),
      shape: g.output_shape,
      label: `output (${what})`,
    });
    // The denominator sums f16-rounded p (as PV uses them): within 2^-11 relative.
    assertClose(got.lse!, want.lse!, { atol: 1e-3, rtol: 1e-4, label: `lse (${what})` });
    if (cache && o.plant === undefined) {
      trace(`checkMma seed ${seed}: cache read`);
      const [a, b] = await Promise.all([cache.read(), ref!.read()]);
      trace(`checkMma seed ${seed}: done`);
      assert.deepEqual(a.key, b.key, `key cache after the call (${what})`);
      assert.deepEqual(a.value, b.value, `value cache after the call (${what})`);
    }
  } finally {
    cache?.destroy();
  }
}

/** An H200-like target (f16 cache and data, head 128, NHD, 16x16x16 matrices, subgroup 32):
 * what the shape-refusal tests start from. */
export const H200_F16_TARGET: Readonly<MmaTarget> = Object.freeze({
  kv: "float16",
  dtype: "float16",
  enc: false,
  d: 128,
  bs: 16,
  nhd: true,
  nchunk: 1,
  m: 16,
  n: 16,
  k: 16,
  sg: 32,
  causal: true,
  window: false,
  softcap: false,
  alibi: false,
  sinks: false,
});

/** `shape`'s source for {@link H200_F16_TARGET} (causal, no window), comment lines dropped. */
export async function mmaSourceText(shape: MmaShape): Promise<string> {
  const t = { ...H200_F16_TARGET, causal: true, window: false };
  return (await flashMmaSource({ ...t, ...fullShape(shape) } as never))
    .split("\n").filter((x) => !x.trimStart().startsWith("//")).join("\n");
}

/** The key loop of a kernel source: from `var par = 0u;` (before its `for`) to the epilogue. */
export function keyLoopOf(src: string): string {
  return src.slice(src.indexOf("var par = 0u;"), src.indexOf("var inv:"));
}

/** One Deno.test per named case against CPU_REFERENCE (skipped without a device). */
export function mmaCaseTests(
  ctx: MmaContext | null,
  cases: readonly (readonly [string, BatchSpec, MmaShape])[],
): void {
  for (const [name, spec, shape] of cases) {
    Deno.test({
      name: `flash_mma vs reference: ${name}`,
      ignore: ctx === null,
      sanitizeOps: false,
      sanitizeResources: false,
      fn: () => checkMma(ctx!, spec, freshSeed(), { shape }),
    });
  }
}
