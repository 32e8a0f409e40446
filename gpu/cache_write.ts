/**
 * Writing new K/V rows into a {@link GpuKvCache} (vLLM's reshape_and_cache) with
 * `wgsl/cache_write.wgsl`, described as the kernel entry {@link CACHE_WRITE}: rows uploaded
 * in their data dtype, rounded on the GPU to the storage dtype in integer arithmetic
 * (byte-exact with core/dtype.ts), slot -1 skipped. A backend's plan compiles it and packs its
 * Params ({@link planCacheWrite}); its run dispatches it in the same submission as the
 * attention kernels ({@link cacheWriteCall}), so one submit writes then attends. The batch
 * was validated (service/validate.ts): rows, slots and their range are not re-checked here.
 * @module
 */
import type { DataArray, DType, GpuContext, KvCacheSpec } from "../core/types.ts";
import { type GpuKvCache, type KvChunkGeometry, kvChunkGeometry } from "./kv_cache.ts";
import { getKernel, type KernelDef, packUniforms } from "./kernel.ts";
import { type Bound, type KernelCall, launch } from "./launch.ts";
import { dispatchSize } from "./batch_buffers.ts";
import { poolOf } from "./buffer_pool.ts";
import { elementsPerWord, kvAccessorFns, kvBindingDecls, loadWgsl, specialize } from "./wgsl.ts";
import { dataLoads } from "./wgsl_data.ts";
import { type Section, TableBuilder } from "./plan_table.ts";
import type { StorageDType } from "../core/types.ts";
import { FLAG_CLEAR } from "./finite_check.ts";

/** Workgroup size of the cache-write kernel. */
export const CACHE_WRITE_WG = 64;

/** Compile-time values of one cache-write variant. */
export interface CacheWriteConsts {
  [k: string]: string | number | boolean;
  storage: StorageDType;
  dtype: DType;
  head: number;
  nhd: boolean;
  nchunk: number;
  /**
   * Binds the finiteness flags of the call (gpu/finite_check.ts) and writes nothing unless
   * every one is clear: a direct dispatch behind the check (an indirect one cost Dawn 72 us to
   * record and 383 us more submit on the H200: bench/NOTES.md v0.9).
   */
  gated: boolean;
}

/**
 * `div_rn(x, s)`: x / s rounded to the nearest f32, ties to even, as core's reference divides
 * (backends/cpu/reference.ts `writeKv`: fround(x / fround(scale))). WGSL, like Vulkan, lets `/`
 * be off by up to 2.5 ulp, and NVIDIA's quotient is: where x / s sits by an fp8 rounding edge
 * the cache then held the neighbouring code, one code off the reference's (12.5% of the value in
 * e4m3), which moved a soft-capped batch's output past tolerance (bench/NOTES.md v0.19). So the
 * quotient's mantissa is a long division of the two 24-bit mantissas in integers (subnormal
 * operands normalised first: a device may flush them), 24 steps and a rounding test on the
 * remainder, with a subnormal quotient rounded once from the unrounded bits and an overflow
 * infinite: exact on every device and for every finite x and s > 0 (an fma residual is not:
 * lavapipe does not fuse it). Infinite or NaN operands take the device's `/`.
 */
export const DIV_RN =
  `// The 24-bit mantissa of |b| (leading 1 at bit 23) and its exponent field, subnormals normalised.
fn div_rn_unpack(b: u32) -> vec2<i32> {
  let m = b & 0x7fffffu;
  let e = i32((b >> 23u) & 0xffu);
  if (e != 0) {
    return vec2<i32>(i32(m | 0x800000u), e);
  }
  let z = countLeadingZeros(m) - 8u;
  return vec2<i32>(i32(m << z), 1 - i32(z));
}

fn div_rn(x: f32, s: f32) -> f32 {
  let bx = bitcast<u32>(x);
  let ax = bx & 0x7fffffffu;
  let as_ = bitcast<u32>(s) & 0x7fffffffu;
  if (ax >= 0x7f800000u || as_ >= 0x7f800000u || as_ == 0u) {
    return x / s;
  }
  let sign = bx & 0x80000000u; // s > 0
  if (ax == 0u) {
    return x;
  }
  let ux = div_rn_unpack(ax);
  let us = div_rn_unpack(as_);
  let mx = u32(ux.x);
  let ms = u32(us.x);
  var e = ux.y - us.y + 127;
  var rem = mx;
  if (mx < ms) {
    rem = mx << 1u;
    e -= 1;
  }
  var qm = 0u; // the quotient's top 24 bits, truncated
  for (var i = 0u; i < 24u; i++) {
    qm <<= 1u;
    if (rem >= ms) {
      rem -= ms;
      qm |= 1u;
    }
    rem <<= 1u;
  }
  // rem is twice the remainder: against ms it says below, at or above half an ulp.
  if (e >= 1) {
    if (rem > ms || (rem == ms && (qm & 1u) == 1u)) {
      qm += 1u;
      if (qm == 0x1000000u) {
        qm = 0x800000u;
        e += 1;
      }
    }
    if (e >= 255) {
      return bitcast<f32>(sign | 0x7f800000u);
    }
    return bitcast<f32>(sign | (u32(e) << 23u) | (qm & 0x7fffffu));
  }
  // Below the normal range: the mantissa field is qm >> (1 - e), rounded once here.
  let sh = u32(1 - e);
  if (sh > 24u) {
    return bitcast<f32>(sign);
  }
  let kept = qm >> sh;
  let dropped = qm & ((1u << sh) - 1u);
  let half = 1u << (sh - 1u);
  let up = dropped > half || (dropped == half && (rem != 0u || (kept & 1u) == 1u));
  return bitcast<f32>(sign | (kept + select(0u, 1u, up)));
}`;

function packFn(d: StorageDType): string {
  const head = "fn pack_word(x: vec4<u32>, scale: f32) -> u32 {\n";
  switch (d) {
    case "float32":
      return `${head}  return x.x;\n}\n`;
    case "float16":
      return `${head}  return f16_bits(x.x) | (f16_bits(x.y) << 16u);\n}\n`;
    case "bfloat16":
      return `${head}  return bf16_bits(x.x) | (bf16_bits(x.y) << 16u);\n}\n`;
    case "fp8_e4m3":
    case "fp8_e5m2": {
      const f = d === "fp8_e4m3" ? "e4m3_bits" : "e5m2_bits";
      return `${DIV_RN}
fn scaled(b: u32, scale: f32) -> u32 {
  if (scale == 1.0) {
    return b;
  }
  return bitcast<u32>(div_rn(bitcast<f32>(b), scale));
}
${head}  return ${f}(scaled(x.x, scale)) | (${f}(scaled(x.y, scale)) << 8u) |
    (${f}(scaled(x.z, scale)) << 16u) | (${f}(scaled(x.w, scale)) << 24u);
}
`;
    }
  }
}

/** The cache-write kernel, as data. */
export const CACHE_WRITE: KernelDef<CacheWriteConsts> = {
  name: "cache_write",
  uniforms: [
    ["num_rows", "u32"],
    ["num_kv_heads", "u32"],
    ["block_size", "u32"],
    ["nwg_x", "u32"],
    ["k_scale", "f32"],
    ["v_scale", "f32"],
    ["block_words", "u32"],
    ["blocks_per_chunk", "u32"],
  ],
  bindings: (c) => [
    { name: "P", kind: "uniform" },
    { name: "key_new", kind: "read", type: "array<u32>" },
    { name: "value_new", kind: "read", type: "array<u32>" },
    { name: "slots", kind: "read", type: "array<i32>" },
    ...(c.gated ? [{ name: "flags", kind: "read" as const, type: "array<u32, 4>" }] : []),
    ...kvBindingDecls(c.nchunk, "read_write"),
  ],
  async source(c) {
    const k = dataLoads("key_new", c.dtype, 1), v = dataLoads("value_new", c.dtype, 1);
    return specialize(await loadWgsl("cache_write.wgsl"), {
      WG: CACHE_WRITE_WG,
      HEAD: c.head,
      EPW: elementsPerWord(c.storage),
      NHD: c.nhd,
      GATE: c.gated
        ? `if (${[0, 1, 2].map((i) => `flags[${i}] != ${FLAG_CLEAR}u`).join(" || ")}) {
    return; // a NaN or infinity in the call: the cache stays as it was
  }`
        : "",
      ROUND: await loadWgsl("round.wgsl"),
      SRC: `${k.code}${v.code}fn src_bits(is_v: bool, i: u32) -> u32 {
  if (is_v) {
    return value_new_bits(i);
  }
  return key_new_bits(i);
}
`,
      PACK: packFn(c.storage),
      KV: kvAccessorFns({
        nchunk: c.nchunk,
        blocksPerChunk: "P.blocks_per_chunk",
        blockWords: "P.block_words",
        access: "read_write",
      }),
    });
  },
};

/** The variant for a cache of `spec` laid out as `g`, and rows of data dtype `dtype`. */
export function cacheWriteConsts(
  spec: KvCacheSpec,
  g: KvChunkGeometry,
  dtype: DType,
  gated = false,
): CacheWriteConsts {
  return {
    gated,
    storage: g.storage_dtype,
    dtype,
    head: spec.head_size,
    nhd: spec.layout === "NHD",
    nchunk: g.nchunk,
  };
}

/** A planned cache write: the compiled kernel, its Params and slot sections, its grid. */
export interface CacheWritePlan {
  kernel: Awaited<ReturnType<typeof getKernel>>;
  params: Section;
  slots: Section;
  grid: [number, number];
}

/**
 * Plans the write of key/value rows (one per slot_mapping entry `slots`) into a cache of
 * `spec` on `ctx`'s device, adding its sections to `table`. null when there is nothing to write.
 * `gated`: the write binds the call's finiteness flags and writes only when they are clear.
 */
export async function planCacheWrite(
  ctx: GpuContext,
  spec: KvCacheSpec,
  dtype: DType,
  slots: Int32Array,
  scales: { k_scale: number; v_scale: number },
  table: TableBuilder,
  g: KvChunkGeometry = kvChunkGeometry(ctx, spec),
  gated = false,
): Promise<CacheWritePlan | null> {
  const rows = slots.length;
  if (rows === 0) return null;
  const kernel = await getKernel(ctx, CACHE_WRITE, cacheWriteConsts(spec, g, dtype, gated));
  const wpr = spec.head_size / elementsPerWord(g.storage_dtype);
  const grid = dispatchSize(ctx, Math.ceil((2 * rows * spec.num_kv_heads * wpr) / CACHE_WRITE_WG));
  const fp8 = g.storage_dtype === "fp8_e4m3" || g.storage_dtype === "fp8_e5m2";
  const params = table.add(packUniforms(CACHE_WRITE, {
    num_rows: rows,
    num_kv_heads: spec.num_kv_heads,
    block_size: spec.block_size,
    nwg_x: grid[0],
    k_scale: fp8 ? scales.k_scale : 1,
    v_scale: fp8 ? scales.v_scale : 1,
    block_words: g.block_words,
    blocks_per_chunk: g.blocks_per_chunk,
  }));
  return { kernel, params, slots: table.add(slots), grid };
}

/** The dispatch of a planned write: `table` binds its sections, `key`/`value` the rows. */
export function cacheWriteCall(
  p: CacheWritePlan,
  bindTable: (s: Section) => Bound,
  cache: GpuKvCache,
  key: Bound,
  value: Bound,
): KernelCall {
  return {
    name: "cache_write",
    kernel: p.kernel,
    bind: {
      P: bindTable(p.params),
      key_new: key,
      value_new: value,
      slots: bindTable(p.slots),
      ...cache.bindMap(),
    },
    grid: p.grid,
  };
}

/** Rows to write on their own: key/value `[num_rows, num_kv_heads, head_size]`, one slot each. */
export interface CacheWriteRows {
  key: DataArray;
  value: DataArray;
  /** [num_rows]; -1 = padding, nothing written. Must be in range (validated by the caller). */
  slot_mapping: Int32Array;
  /** fp8 caches store x / scale (default 1). */
  k_scale?: number;
  v_scale?: number;
}

/** Writes `rows` into `cache` in its own submission and waits for the GPU to finish. */
export async function writeCache(
  ctx: GpuContext,
  cache: GpuKvCache,
  rows: CacheWriteRows,
): Promise<void> {
  cache.assertUsable(ctx);
  const table = new TableBuilder();
  const p = await planCacheWrite(
    ctx,
    cache.spec,
    rows.key.dtype,
    rows.slot_mapping,
    {
      k_scale: rows.k_scale ?? 1,
      v_scale: rows.v_scale ?? 1,
    },
    table,
    cache.geometry,
  );
  if (!p) return;
  const t = table.upload(ctx, "cache_write.table");
  const pool = poolOf(ctx);
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
  const k = pool.acquire(rows.key.bytes.byteLength, usage, "cw.key");
  const v = pool.acquire(rows.value.bytes.byteLength, usage, "cw.value");
  try {
    await launch(ctx, {
      label: "cache_write",
      uploads: [{ buffer: k, data: rows.key.bytes }, { buffer: v, data: rows.value.bytes }],
      calls: [cacheWriteCall(p, t.bind, cache, k, v)],
      reads: [],
    });
  } finally {
    pool.release(k, v);
    t.buffer.destroy();
  }
}
