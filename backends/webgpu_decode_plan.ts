/**
 * Plan building for WEBGPU_DECODE: {@link planDecode} validates a decode batch, picks the
 * kernel shape and the slice length from the context lengths and a target workgroup count,
 * builds the metadata table and uniforms, and compiles (cached) the split, reduce and cache
 * write pipelines.
 * @module
 */
import { DeviceUnavailableError, invalidBatch, type Issue, ServiceError } from "../core/errors.ts";
import type { BackendContext, ForwardBatch, GpuContext, KvCacheSpec } from "../core/types.ts";
import { dispatchSize, UniformBuilder } from "../gpu/batch_buffers.ts";
import { cacheWritePipeline, validateCacheWrite } from "../gpu/cache_write.ts";
import { DECODERS, generateDecodeSplit } from "../gpu/decode_codegen.ts";
import { GpuKvCache } from "../gpu/kv_cache.ts";
import { getComputePipeline } from "../gpu/pipelines.ts";
import { dtypeTag, elementsPerWord, kvAccessors, loadWgsl, specialize } from "../gpu/wgsl.ts";
import type { DecodeTuning } from "./webgpu_decode_tuning.ts";

/** Head sizes compiled and tested. */
export const DECODE_HEAD_SIZES = [64, 80, 96, 112, 128, 192, 256];

/** What {@link planDecode} prepares for the backend's `run`. */
export interface DecodePlan {
  gpu: GpuContext;
  cache: GpuKvCache;
  split: GPUComputePipeline;
  reduce: GPUComputePipeline;
  /** The split pipeline's key, e.g. `decode[f16]:hd128:bs16:g4:kh1:lpk16:u4:wg128:NHD:c1:q16:sg`. */
  key: string;
  params: UniformBuilder;
  meta: Uint32Array;
  splitGrid: [number, number];
  reduceGrid: [number, number];
  partBytes: number;
  num_items: number;
  /** The query is uploaded as f16 (float16 batches). */
  q16: boolean;
  /** Keys per slice. */
  split_keys: number;
  plan_ms: number;
}

/** The backend's name, used in its error messages. */
export const DECODE_NAME = "WEBGPU_DECODE";
const NAME = DECODE_NAME;

function isSoftware(gpu: GpuContext): boolean {
  const a = gpu.adapter_info;
  return a.is_fallback_adapter === true ||
    /llvmpipe|lavapipe|swiftshader|warp/i.test(a.description);
}

/** Checks that `batch` is a decode batch this backend can run on `cache`; throws 422. */
function checkBatch(batch: ForwardBatch, cache: KvCacheSpec): void {
  const L = batch.layer, md = batch.metadata;
  const is: Issue[] = [];
  const add = (path: (string | number)[], message: string) =>
    is.length < 50 && is.push({ path, message });
  if (L.attn_type !== "decoder" && L.attn_type !== "encoder_decoder") {
    add(["layer", "attn_type"], `${NAME} runs decoder and encoder_decoder, got ${L.attn_type}`);
  }
  if (L.num_kv_heads < 1 || L.num_heads % L.num_kv_heads !== 0) {
    add(
      ["layer", "num_heads"],
      `${L.num_heads} is not a multiple of num_kv_heads ${L.num_kv_heads}`,
    );
  }
  if (!DECODE_HEAD_SIZES.includes(L.head_size)) {
    add(["layer", "head_size"], `${L.head_size} not supported (${DECODE_HEAD_SIZES.join(", ")})`);
  }
  if (cache.num_kv_heads !== L.num_kv_heads || cache.head_size !== L.head_size) {
    add(
      ["kv_cache"],
      `is [.., ${cache.num_kv_heads} kv heads, head ${cache.head_size}] but the layer has ` +
        `${L.num_kv_heads} kv heads, head ${L.head_size}`,
    );
  }
  if (![16, 32, 64].includes(cache.block_size)) {
    add(["kv_cache", "block_size"], `${cache.block_size} not supported (16, 32, 64)`);
  }
  const T = batch.num_tokens;
  if (batch.query.length !== T * L.num_heads * L.head_size) {
    add(
      ["query"],
      `has ${batch.query.length} elements, expected ${T}x${L.num_heads}x${L.head_size}`,
    );
  }
  const qsl = md.query_start_loc;
  if (qsl.length !== md.num_reqs + 1 || qsl[0] !== 0 || qsl[md.num_reqs] !== T) {
    add(["metadata", "query_start_loc"], `must run from 0 to num_tokens ${T}`);
  }
  for (let i = 0; i < md.num_reqs; i++) {
    const ql = qsl[i + 1] - qsl[i], S = md.seq_lens[i];
    if (ql < 0 || ql > 1) {
      add(
        ["metadata", "query_start_loc", i + 1],
        `query length ${ql} > 1 not supported (decode-only backend)`,
      );
    }
    if (S < ql || (L.attn_type === "decoder" && S < 1 && ql > 0)) {
      add(["metadata", "seq_lens", i], `${S} is too short for query length ${ql}`);
    }
    const need = Math.ceil(S / cache.block_size);
    if (need > md.max_blocks_per_req) {
      add(
        ["metadata", "block_table", i],
        `has ${md.max_blocks_per_req} blocks, seq_len ${S} needs ${need}`,
      );
    }
    for (let b = 0; b < Math.min(need, md.max_blocks_per_req); b++) {
      const id = md.block_table[i * md.max_blocks_per_req + b];
      if (!(id >= 0 && id < cache.num_blocks)) {
        add(
          ["metadata", "block_table", i, b],
          `block id ${id} out of range [0, ${cache.num_blocks})`,
        );
      }
    }
  }
  if (is.length) throw invalidBatch(is);
}

/** The largest divisor of `g` not above `max`. */
function headTile(g: number, max: number): number {
  for (let d = Math.min(g, max); d > 1; d--) if (g % d === 0) return d;
  return 1;
}

/** Prepares `batch` for `run` of WEBGPU_DECODE with `tuning`; throws 422 / 503. */
export async function planDecode(
  tuning: DecodeTuning,
  batch: ForwardBatch,
  bctx: BackendContext,
): Promise<DecodePlan> {
  const t0 = performance.now();
  const gpu = bctx.gpu;
  if (!gpu || gpu.lost) throw new DeviceUnavailableError(`${NAME} needs a live WebGPU device`);
  const cache = batch.cache;
  if (!(cache instanceof GpuKvCache)) {
    throw new ServiceError(
      `${NAME} needs a webgpu KV cache, got storage "${cache?.storage ?? "none"}"`,
      {
        status: 422,
        code: "cache_storage_mismatch",
        extra: { storage: cache?.storage ?? null },
      },
    );
  }
  cache.assertUsable(gpu);
  checkBatch(batch, cache.spec);
  const writes = batch.key !== null && batch.value !== null &&
    batch.metadata.slot_mapping.length > 0;
  if (writes) {
    validateCacheWrite(cache, {
      key: batch.key!,
      value: batch.value!,
      slot_mapping: batch.metadata.slot_mapping,
    });
  }
  const L = batch.layer, md = batch.metadata, T = batch.num_tokens;
  const H = L.num_heads, Hkv = L.num_kv_heads, D = L.head_size, bs = cache.spec.block_size;
  const g = cache.geometry, st = g.storage_dtype;
  const epw = elementsPerWord(st), rw = D / epw, rv = rw / 4;
  const sg = tuning.subgroups && gpu.features.has("subgroups") &&
    (gpu.adapter_info.subgroup_min_size ?? 0) >= 4;
  // Lanes per row: a power of two dividing the row's vec4 count (butterfly sums).
  const lpk = Math.min(
    rv & -rv,
    tuning.max_lanes,
    sg ? gpu.adapter_info.subgroup_min_size! : tuning.fallback_lanes,
  );
  const group = H / Hkv, hg = headTile(group, tuning.max_heads), tiles = group / hg;
  const cpu = isSoftware(gpu);
  // Flat heads of a workgroup are hq0 + f only when the GQA group is not tiled.
  const kh = tiles > 1 ? 1 : headTile(
    Hkv,
    tuning.kv_heads_per_group || (cpu ? Math.max(1, Math.floor(tuning.max_flat_heads / hg)) : 1),
  );
  const F = kh * hg;
  const u = Math.min(tuning.keys_per_iter || (cpu ? 1 : 4), bs);
  // Workgroup size: a multiple of lpk, shrunk until its workgroup memory fits.
  const wsLimit = gpu.limits.maxComputeWorkgroupStorageSize ?? 16384;
  let wg = Math.max(
    lpk,
    Math.floor((tuning.workgroup_size || (cpu ? Math.max(8, lpk) : 128)) / lpk) * lpk,
  );
  const shared = (w: number) =>
    (sg ? 4 : w * u * F * 4) + (w / lpk) * F * 8 + (w > lpk ? F * D * 4 : 16);
  while (wg > lpk && shared(wg) > wsLimit) wg = Math.max(lpk, (wg / 2 / lpk | 0) * lpk);
  const nkg = wg / lpk, step = nkg * u;
  const earlyV = tuning.early_values;

  // Key ranges, then the slice length from the total work and the workgroup target.
  const w = L.sliding_window;
  const ranges: [number, number, number, number][] = []; // req, token, begin, end
  let keys = 0;
  for (let i = 0; i < md.num_reqs; i++) {
    if (md.query_start_loc[i + 1] - md.query_start_loc[i] !== 1) continue;
    const S = md.seq_lens[i], b = w === null ? 0 : Math.max(0, S - w);
    ranges.push([i, md.query_start_loc[i], b, S]);
    keys += S - b;
  }
  const target = tuning.target_workgroups ||
    (cpu ? 4 * Math.max(1, navigator.hardwareConcurrency ?? 2) : 2048);
  const perItem = (Hkv / kh) * tiles;
  let split = Math.max(tuning.min_split_keys, Math.ceil(keys / Math.max(1, target / perItem)));
  const partLimit = Math.min(
    gpu.limits.maxStorageBufferBindingSize ?? 2 ** 27,
    gpu.limits.maxBufferSize ?? 2 ** 28,
  );
  const countItems = (s: number) => ranges.reduce((n, r) => n + Math.ceil((r[3] - r[2]) / s), 0);
  split = Math.ceil(split / step) * step;
  while (countItems(split) * H * (D + 4) * 4 > partLimit && split < 2 ** 30) split *= 2;
  const items: number[] = [];
  const tokTable = new Uint32Array(2 * T);
  for (const [i, t, b, e] of ranges) {
    tokTable[2 * t] = items.length / 8;
    for (let k = b; k < e; k += split) {
      items.push(i, t, k, Math.min(e, k + split), 0, e - 1, 0, 0);
    }
    tokTable[2 * t + 1] = items.length / 8 - tokTable[2 * t];
  }
  const n = items.length / 8;
  for (let s = 0; s < n; s++) items[8 * s + 4] = s;
  const outFloats = T * H * D;
  if ((outFloats + H * T) * 4 > partLimit) {
    throw new ServiceError(`${NAME}: the output of ${T} tokens exceeds one storage binding`, {
      status: 422,
      code: "batch_too_large",
      extra: { num_tokens: T },
    });
  }
  // meta: items | block table | slopes | token table | sinks
  const btOff = items.length, slopeOff = btOff + md.block_table.length;
  const tokOff = slopeOff + H, sinkOff = tokOff + 2 * T;
  const meta = new Uint32Array(sinkOff + H);
  meta.set(items);
  meta.set(
    new Uint32Array(md.block_table.buffer, md.block_table.byteOffset, md.block_table.length),
    btOff,
  );
  if (L.alibi_slopes) {
    meta.set(new Uint32Array(Float32Array.from(L.alibi_slopes).buffer), slopeOff);
  }
  meta.set(tokTable, tokOff);
  if (L.sinks) meta.set(new Uint32Array(Float32Array.from(L.sinks).buffer), sinkOff);

  const fp8 = st === "fp8_e4m3" || st === "fp8_e5m2";
  const splitGrid = dispatchSize(gpu, n * perItem);
  const reduceGrid = dispatchSize(gpu, T * H);
  const params = new UniformBuilder()
    .u32(T).u32(H).u32(Hkv).u32(group).u32(n).u32(tiles).u32(md.max_blocks_per_req).u32(bs)
    .u32(btOff).u32(slopeOff).u32(tokOff).u32(sinkOff)
    .u32(n * H * D / 4).u32(outFloats).u32(splitGrid[0]).u32(reduceGrid[0])
    .u32(g.block_words).u32(g.blocks_per_chunk)
    .f32(L.scale * (fp8 ? L.k_scale : 1)).f32(L.logits_soft_cap ?? 1).f32(fp8 ? L.v_scale : 1)
    .u32(L.sinks ? 1 : 0).f32(-Infinity).u32(0);

  const cap = L.logits_soft_cap !== null, alibi = L.alibi_slopes !== null;
  const q16 = batch.dtype === "float16"; // exact in f16: half the query bytes
  const key = `decode[${dtypeTag(st)}]:hd${D}:bs${bs}:g${hg}:kh${kh}:lpk${lpk}:u${u}:wg${wg}:` +
    `${earlyV ? "ev:" : ""}` +
    `${cache.spec.layout}:c${g.nchunk}${q16 ? ":q16" : ""}${sg ? ":sg" : ""}${cap ? ":cap" : ""}` +
    `${alibi ? ":alibi" : ""}`;
  const [splitSrc, reduceSrc] = await Promise.all([
    loadWgsl("decode_split.wgsl"),
    loadWgsl("decode_reduce.wgsl"),
  ]);
  const code = specialize(splitSrc, {
    D,
    BS: bs,
    RW: rw,
    EPW: epw,
    LPK: lpk,
    U: u,
    WG: wg,
    HG: hg,
    KH: kh,
    QT: q16 ? "f16" : "f32",
    NHD: cache.spec.layout === "NHD",
    CAP: cap,
    ALIBI: alibi,
    RED: sg ? 1 : wg * u * F,
    WACC: nkg > 1 ? F * D / 4 : 1,
    ...generateDecodeSplit({
      hg,
      kh,
      u,
      lpk,
      cpl: rv / lpk,
      epw,
      nkg,
      sg,
      alibi,
      early_v: earlyV,
      dec: DECODERS[st],
    }),
    KV: kvAccessors({
      nchunk: g.nchunk,
      blocksPerChunk: "P.blocks_per_chunk",
      blockWords: "P.block_words",
      firstBinding: 4,
      vec4: true,
    }),
  });
  const [split_p, reduce_p] = await Promise.all([
    getComputePipeline(gpu, key, code),
    getComputePipeline(gpu, `decode_reduce:hd${D}`, specialize(reduceSrc, { D })),
    writes ? cacheWritePipeline(gpu, cache) : null, // compiled here, not in run
  ]);
  return {
    gpu,
    cache,
    split: split_p,
    reduce: reduce_p,
    key,
    params,
    meta,
    splitGrid,
    reduceGrid,
    partBytes: Math.max(16, n * H * (D + 4) * 4),
    num_items: n,
    split_keys: split,
    q16,
    plan_ms: performance.now() - t0,
  };
}
