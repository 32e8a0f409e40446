/**
 * WEBGPU_FLASH: the general GPU backend. A FlashAttention-2 style varlen kernel
 * (`wgsl/flash_attention.wgsl`) for mixed prefill + decode batches over the paged GPU cache:
 * the host builds a tile table (request, first query token, count, q heads of one GQA group),
 * one workgroup per (tile, kv head) reads each K/V tile once into workgroup memory, online
 * softmax in f32, causal early exit, sliding-window tile skipping. Encoder types read K/V from
 * the call (a compile-time variant); encoder_decoder attends over the cache, non-causal.
 * New K/V are written by the cache-write kernel in the same submission; one readback per call.
 * @module
 */
import { roundArray } from "../core/dtype.ts";
import { DeviceUnavailableError, invalidBatch, ServiceError } from "../core/errors.ts";
import {
  type AttentionBackend,
  ATTN_TYPES,
  type BackendContext,
  DTYPES,
  type ForwardBatch,
  type ForwardResult,
  type GpuContext,
  KV_CACHE_DTYPES,
  KV_LAYOUTS,
  type SelectorConfig,
} from "../core/types.ts";
import { BatchBuffers, dispatchSize, UniformBuilder } from "../gpu/batch_buffers.ts";
import { PassTimer } from "../gpu/timer.ts";
import { cacheWritePipeline, encodeCacheWrite } from "../gpu/cache_write.ts";
import { GpuKvCache } from "../gpu/kv_cache.ts";
import { getComputePipeline } from "../gpu/pipelines.ts";
import {
  decodeHelpers,
  dtypeTag,
  elementsPerWord,
  kvAccessors,
  loadWgsl,
  specialize,
} from "../gpu/wgsl.ts";

/** Head sizes compiled and tested. */
export const FLASH_HEAD_SIZES = [32, 64, 80, 96, 112, 128, 160, 192, 256];

/** A kernel shape: query rows and keys per tile, threads per row, workgroup size. */
export interface FlashConfig {
  rows: number;
  bk: number;
  tpr: number;
  wg: number;
  /** Workgroup memory it needs, in bytes. */
  shared_bytes: number;
}

/** Workgroup memory of a kernel shape for head size `d`. */
function sharedBytes(d: number, rows: number, bk: number): number {
  const d4 = d / 4;
  return 16 * (rows * d4 + bk * (d4 + 1) + bk * d4) + 4 * rows * bk + 12 * rows + 8;
}

/** The largest kernel shape for head size `d` that fits the device's limits, or null. */
export function flashConfig(
  d: number,
  limits: Readonly<Record<string, number>>,
): FlashConfig | null {
  if (d % 16 !== 0 || d < 16) return null;
  const d4 = d / 4;
  const tpr = d4 % 8 === 0 ? 8 : 4;
  const maxShared = limits.maxComputeWorkgroupStorageSize ?? 16384;
  const maxInv = Math.min(
    limits.maxComputeInvocationsPerWorkgroup ?? 256,
    limits.maxComputeWorkgroupSizeX ?? 256,
  );
  for (const [rows, bk] of [[16, 32], [16, 16], [8, 16], [16, 8], [8, 8]]) {
    const wg = rows * tpr;
    if (wg > maxInv || wg % bk !== 0 || bk % tpr !== 0) continue;
    const shared_bytes = sharedBytes(d, rows, bk);
    if (shared_bytes <= maxShared) return { rows, bk, tpr, wg, shared_bytes };
  }
  return null;
}

/** What plan() prepares for run(). */
export interface FlashPlan {
  ctx: GpuContext;
  cache: GpuKvCache | null;
  pipeline: GPUComputePipeline;
  key: string;
  cfg: FlashConfig;
  meta: Uint32Array;
  params: UniformBuilder;
  workgroups: number;
  nwg_x: number;
  nwg_y: number;
  plan_ms: number;
}

const isEncoder = (b: ForwardBatch) =>
  b.layer.attn_type === "encoder" || b.layer.attn_type === "encoder_only";

function requireGpu(ctx: BackendContext): GpuContext {
  const gpu = ctx.gpu;
  if (!gpu || gpu.lost) {
    throw new DeviceUnavailableError("WEBGPU_FLASH needs a WebGPU device; none is available");
  }
  return gpu;
}

async function flashPipeline(
  ctx: GpuContext,
  b: ForwardBatch,
  cfg: FlashConfig,
  cache: GpuKvCache | null,
) {
  const d = b.layer.head_size;
  const enc = cache === null;
  const storage = enc ? "float32" : cache.geometry.storage_dtype;
  const epw = elementsPerWord(storage);
  const bs = enc ? 16 : cache.spec.block_size;
  const source = enc
    ? `@group(0) @binding(5) var<storage, read> k_in: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> v_in: array<vec4<f32>>;
fn src_k(key: u32, h: u32, c: u32, rbase: u32) -> vec4<u32> {
  return bitcast<vec4<u32>>(k_in[((rbase + key) * U.num_kv_heads + h) * D4 + c]);
}
fn src_v(key: u32, h: u32, c: u32, rbase: u32) -> vec4<u32> {
  return bitcast<vec4<u32>>(v_in[((rbase + key) * U.num_kv_heads + h) * D4 + c]);
}
`
    : `${
      kvAccessors({
        nchunk: cache.geometry.nchunk,
        blocksPerChunk: "U.blocks_per_chunk",
        blockWords: "U.block_words",
        firstBinding: 5,
        vec4: true,
      })
    }
fn kv_row(key: u32, h: u32, rbase: u32) -> vec2<u32> {
  let block = mdw[U.off_bt + rbase + key / BS];
  let off = key % BS;
  if (NHD) {
    return vec2<u32>(block, (off * U.num_kv_heads + h) * WPR);
  }
  return vec2<u32>(block, (h * BS + off) * WPR);
}
fn src_k(key: u32, h: u32, c: u32, rbase: u32) -> vec4<u32> {
  let br = kv_row(key, h, rbase);
  return load_k4(br.x, br.y + 4u * c);
}
fn src_v(key: u32, h: u32, c: u32, rbase: u32) -> vec4<u32> {
  let br = kv_row(key, h, rbase);
  return load_v4(br.x, br.y + 4u * c);
}
`;
  const code = specialize(await loadWgsl("flash_attention.wgsl"), {
    WG: cfg.wg,
    ROWS: cfg.rows,
    BK: cfg.bk,
    TPR: cfg.tpr,
    D: d,
    BS: bs,
    NHD: enc || cache.spec.layout === "NHD",
    V4R: (d * 4) / epw / 16,
    EPW: epw,
    DECODE: decodeHelpers(storage),
    SOURCE: source,
  });
  const key = enc
    ? `flash[enc]:hd${d}:r${cfg.rows}k${cfg.bk}:wg${cfg.wg}`
    : `flash[${dtypeTag(storage)}]:hd${d}:bs${bs}:${cache.spec.layout}:c${cache.geometry.nchunk}:` +
      `r${cfg.rows}k${cfg.bk}:wg${cfg.wg}`;
  return { key, pipeline: await getComputePipeline(ctx, key, code) };
}

/** Checks what the kernel indexes: shapes, query_start_loc, seq_lens, block ids. */
function validate(b: ForwardBatch, cache: GpuKvCache | null): void {
  const L = b.layer, md = b.metadata, T = b.num_tokens;
  if (L.num_kv_heads < 1 || L.num_heads % L.num_kv_heads !== 0) {
    throw invalidBatch([{
      path: ["layer", "num_heads"],
      message: `${L.num_heads} is not a multiple of num_kv_heads ${L.num_kv_heads}`,
    }]);
  }
  if (b.query.length !== T * L.num_heads * L.head_size) {
    throw invalidBatch([{
      path: ["query"],
      message: `has ${b.query.length} elements, expected ${T}x${L.num_heads}x${L.head_size}`,
    }]);
  }
  for (let i = 0; i <= md.num_reqs; i++) {
    const q = md.query_start_loc[i], prev = i === 0 ? 0 : md.query_start_loc[i - 1];
    if (q < prev || (i === 0 && q !== 0) || (i === md.num_reqs && q !== T)) {
      throw invalidBatch([{
        path: ["metadata", "query_start_loc", i],
        message: `is ${q}: must run non-decreasing from 0 to num_tokens ${T}`,
      }]);
    }
  }
  if (!cache) {
    for (const f of ["key", "value"] as const) {
      if (b[f]?.length !== T * L.num_kv_heads * L.head_size) {
        throw invalidBatch([{
          path: [f],
          message: `has ${
            b[f]?.length ?? "no"
          } elements, expected ${T}x${L.num_kv_heads}x${L.head_size}`,
        }]);
      }
    }
    return;
  }
  const s = cache.spec;
  if (s.num_kv_heads !== L.num_kv_heads || s.head_size !== L.head_size) {
    throw invalidBatch([{
      path: ["kv_cache"],
      message:
        `has num_kv_heads ${s.num_kv_heads}, head_size ${s.head_size}; the layer has ${L.num_kv_heads}, ${L.head_size}`,
    }]);
  }
  for (let i = 0; i < md.num_reqs; i++) {
    const n = md.seq_lens[i], qlen = md.query_start_loc[i + 1] - md.query_start_loc[i];
    if (!(n >= 0) || (L.attn_type === "decoder" && n < qlen)) {
      throw invalidBatch([{
        path: ["metadata", "seq_lens", i],
        message: `is ${n}, below query length ${qlen}`,
      }]);
    }
    const need = Math.ceil(n / s.block_size);
    if (need > md.max_blocks_per_req) {
      throw invalidBatch([{
        path: ["metadata", "block_table", i],
        message: `has ${md.max_blocks_per_req} blocks, seq_len ${n} needs ${need}`,
      }]);
    }
    for (let j = 0; j < need; j++) {
      const id = md.block_table[i * md.max_blocks_per_req + j];
      if (!(id >= 0 && id < s.num_blocks)) {
        throw invalidBatch([{
          path: ["metadata", "block_table", i, j],
          message: `block ${id} is outside the cache (${s.num_blocks} blocks)`,
        }]);
      }
    }
  }
}

/** Tiles (4 words each), per-request words, block table, ALiBi slopes and sinks in one array. */
function buildMeta(b: ForwardBatch, cfg: FlashConfig, enc: boolean) {
  const L = b.layer, md = b.metadata, G = L.num_heads / L.num_kv_heads;
  const tpt = G <= cfg.rows ? Math.floor(cfg.rows / G) : 1;
  const hchunk = Math.min(G, cfg.rows);
  const causal = L.attn_type === "encoder_decoder" ? false : L.causal;
  const w = L.sliding_window ?? 0;
  const tiles: { t: number[]; cost: number }[] = [];
  const reqs = new Int32Array(md.num_reqs * 4);
  for (let i = 0; i < md.num_reqs; i++) {
    const q0 = md.query_start_loc[i], qlen = md.query_start_loc[i + 1] - q0;
    const kvLen = enc ? qlen : md.seq_lens[i];
    const base = enc ? 0 : md.seq_lens[i] - qlen;
    reqs.set([kvLen, base - q0, 0, enc ? q0 : i * md.max_blocks_per_req], i * 4);
    for (let a = 0; a < qlen; a += tpt) {
      const cnt = Math.min(tpt, qlen - a);
      const pf = base + a, pl = pf + cnt - 1;
      const ks = w > 0 ? Math.max(0, pf - w + 1) : 0;
      const ke = causal ? Math.min(kvLen, pl + 1) : w > 0 ? Math.min(kvLen, pl + w) : kvLen;
      for (let h0 = 0; h0 < G; h0 += hchunk) {
        const hc = Math.min(hchunk, G - h0);
        tiles.push({ t: [i, q0 + a, cnt | (hc << 16), h0], cost: Math.max(0, ke - ks) });
      }
    }
  }
  tiles.sort((x, y) => y.cost - x.cost); // longest first: shorter tail
  const H = L.num_heads;
  const offReqs = tiles.length * 4, offBt = offReqs + reqs.length;
  const offAlibi = offBt + md.block_table.length, offSinks = offAlibi + H;
  const meta = new Uint32Array(offSinks + H);
  tiles.forEach((x, k) => meta.set(x.t, k * 4));
  meta.set(new Uint32Array(reqs.buffer), offReqs);
  meta.set(
    new Uint32Array(md.block_table.buffer, md.block_table.byteOffset, md.block_table.length),
    offBt,
  );
  const f = new Float32Array(meta.buffer);
  if (L.alibi_slopes) f.set(L.alibi_slopes, offAlibi);
  if (L.sinks) f.set(L.sinks, offSinks);
  return { meta, numTiles: tiles.length, causal, w, offReqs, offBt, offAlibi, offSinks };
}

async function plan(b: ForwardBatch, bctx: BackendContext): Promise<FlashPlan> {
  const t0 = performance.now();
  const ctx = requireGpu(bctx);
  const enc = isEncoder(b);
  let cache: GpuKvCache | null = null;
  if (!enc) {
    if (b.cache === null) {
      throw invalidBatch([{ path: ["kv_cache"], message: `is required for ${b.layer.attn_type}` }]);
    }
    if (!(b.cache instanceof GpuKvCache)) {
      throw new ServiceError(
        `WEBGPU_FLASH needs a WebGPU KV cache, got one with storage "${b.cache.storage}"`,
        {
          status: 422,
          code: "cache_storage_mismatch",
          extra: { storage: b.cache.storage },
        },
      );
    }
    cache = b.cache;
    cache.assertUsable(ctx);
  }
  const cfg = flashConfig(b.layer.head_size, ctx.limits);
  if (!cfg) {
    throw invalidBatch([{
      path: ["layer", "head_size"],
      message: `${b.layer.head_size} is not supported by WEBGPU_FLASH on this device`,
    }]);
  }
  validate(b, cache);
  const m = buildMeta(b, cfg, enc);
  const L = b.layer;
  const fp8 = cache !== null && elementsPerWord(cache.geometry.storage_dtype) === 4;
  const [{ key, pipeline }] = await Promise.all([
    flashPipeline(ctx, b, cfg, cache),
    cache && b.key ? cacheWritePipeline(ctx, cache) : null,
  ]);
  const workgroups = m.numTiles * L.num_kv_heads;
  const [nwg_x, nwg_y] = dispatchSize(ctx, workgroups);
  const params = new UniformBuilder()
    .u32(m.numTiles).u32(L.num_heads).u32(L.num_kv_heads).u32(L.num_heads / L.num_kv_heads)
    .u32(b.num_tokens).u32(nwg_x).u32(m.causal ? 1 : 0).u32(Math.min(m.w, 2 ** 30))
    .f32(L.logits_soft_cap ?? 0).f32(L.scale * (fp8 ? L.k_scale : 1)).f32(fp8 ? L.v_scale : 1)
    .u32((L.alibi_slopes ? 1 : 0) | (L.sinks ? 2 : 0))
    .u32(m.offReqs).u32(m.offBt).u32(m.offAlibi).u32(m.offSinks)
    .u32(cache?.geometry.block_words ?? 0).u32(cache?.geometry.blocks_per_chunk ?? 0).u32(0).u32(0);
  return {
    ctx,
    cache,
    pipeline,
    key,
    cfg,
    meta: m.meta,
    params,
    workgroups,
    nwg_x,
    nwg_y,
    plan_ms: performance.now() - t0,
  };
}

async function run(p: FlashPlan, b: ForwardBatch): Promise<ForwardResult> {
  const t0 = performance.now();
  const L = b.layer, T = b.num_tokens, H = L.num_heads, D = L.head_size;
  if (T === 0) {
    return {
      output: new Float32Array(0),
      lse: b.return_lse ? new Float32Array(0) : null,
      timings: { plan: p.plan_ms },
    };
  }
  const { ctx, cache } = p;
  const dev = ctx.device;
  const bufs = new BatchBuffers(ctx, "flash");
  const timer = PassTimer.create(ctx);
  try {
    const encoder = dev.createCommandEncoder({ label: "flash" });
    if (cache && b.key && b.value) {
      await encodeCacheWrite(ctx, encoder, cache, {
        key: b.key,
        value: b.value,
        slot_mapping: b.metadata.slot_mapping,
        k_scale: L.k_scale,
        v_scale: L.v_scale,
      }, bufs);
    }
    const tw = performance.now();
    const out = bufs.poisoned(T * H * D, "out");
    const lse = bufs.poisoned(H * T, "lse");
    const entries: GPUBindGroupEntry[] = [
      { binding: 0, resource: { buffer: bufs.uniform(p.params, "params") } },
      { binding: 1, resource: { buffer: bufs.storage(b.query, "q") } },
      { binding: 2, resource: { buffer: bufs.storage(p.meta, "meta") } },
      { binding: 3, resource: { buffer: out } },
      { binding: 4, resource: { buffer: lse } },
    ];
    if (cache) entries.push(...cache.bindEntries(5));
    else {
      entries.push({ binding: 5, resource: { buffer: bufs.storage(b.key!, "k_in") } });
      entries.push({ binding: 6, resource: { buffer: bufs.storage(b.value!, "v_in") } });
    }
    const pass = encoder.beginComputePass({
      label: p.key,
      ...(timer ? { timestampWrites: timer.writes(0) } : {}),
    });
    pass.setPipeline(p.pipeline);
    pass.setBindGroup(
      0,
      dev.createBindGroup({ label: p.key, layout: p.pipeline.getBindGroupLayout(0), entries }),
    );
    if (p.workgroups > 0) pass.dispatchWorkgroups(p.nwg_x, p.nwg_y);
    pass.end();
    const parts = [{ buffer: out, floats: T * H * D }];
    if (b.return_lse) parts.push({ buffer: lse, floats: H * T });
    const stampPart = timer ? parts.push(timer.resolve(encoder, bufs)) - 1 : -1;
    const read = bufs.readback(encoder, parts);
    const tf = performance.now();
    const cmd = encoder.finish();
    const te = performance.now();
    dev.queue.submit([cmd]);
    const t1 = performance.now();
    const got = await read();
    const [o, l] = got;
    const gpuAttend = timer ? timer.ms(got[stampPart], 0) : null;
    const t2 = performance.now();
    return {
      output: roundArray(b.dtype, o),
      lse: b.return_lse ? l : null,
      timings: {
        plan: p.plan_ms,
        encode: t1 - t0,
        encode_write: tw - t0,
        encode_attend: tf - tw,
        finish: te - tf,
        submit: t1 - te,
        gpu_and_readback: t2 - t1,
        ...(gpuAttend !== null ? { gpu_attend: gpuAttend } : {}),
      },
    };
  } finally {
    timer?.destroy();
    bufs.destroy();
  }
}

function supportsCombination(cfg: SelectorConfig, ctx: BackendContext): string | null {
  if (!ctx.gpu || !FLASH_HEAD_SIZES.includes(cfg.head_size)) return null;
  const fc = flashConfig(cfg.head_size, ctx.gpu.limits);
  if (!fc) {
    return `head_size ${cfg.head_size} needs ${
      sharedBytes(cfg.head_size, 8, 8)
    } B of workgroup storage ` +
      `(device has ${ctx.gpu.limits.maxComputeWorkgroupStorageSize})`;
  }
  return null;
}

/** The general WebGPU flash-attention backend. */
export const WEBGPU_FLASH: AttentionBackend<FlashPlan> = {
  name: "WEBGPU_FLASH",
  priority: 20,
  description: "WebGPU FlashAttention-2 style varlen kernel for mixed prefill/decode batches " +
    "over the paged GPU cache (f32 online softmax, GQA-grouped tiles).",
  capabilities: {
    dtypes: [...DTYPES],
    kv_cache_dtypes: [...KV_CACHE_DTYPES],
    block_sizes: [{ multiple_of: 16 }],
    head_sizes: [...FLASH_HEAD_SIZES],
    kv_cache_layouts: [...KV_LAYOUTS],
    attn_types: [...ATTN_TYPES],
    is_mla: false,
    sinks: true,
    sliding_window: true,
    alibi: true,
    logits_soft_cap: true,
    non_causal: true,
    sparse: false,
    mm_prefix: false,
    per_head_quant_scales: false,
    batch_invariant: false,
    kv_connector: false,
    lse: true,
    graph_support: "NEVER",
    reorder_batch_threshold: null,
  },
  requires: {
    needs_device: true,
    features: [],
    limits: {
      maxComputeWorkgroupStorageSize: 16384,
      maxComputeInvocationsPerWorkgroup: 128,
      maxStorageBuffersPerShaderStage: 6,
    },
  },
  cache_storage: "webgpu",
  supportsCombination,
  createCache: (spec, ctx) => GpuKvCache.create(requireGpu(ctx), spec),
  importCache: (spec, key, value, ctx) => GpuKvCache.fromBytes(requireGpu(ctx), spec, key, value),
  plan,
  run,
};
