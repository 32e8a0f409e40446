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
import { capabilities } from "./capabilities_base.ts";
import { BatchBuffers, dispatchSize, UniformBuilder } from "../gpu/batch_buffers.ts";
import { callTimings, PassTimer } from "../gpu/timer.ts";
import { cacheWritePipeline, encodeCacheWrite } from "../gpu/cache_write.ts";
import { GpuKvCache } from "../gpu/kv_cache.ts";
import { elementsPerWord } from "../gpu/wgsl.ts";
import {
  buildFlashMeta,
  type FlashConfig,
  flashConfig,
  flashPipeline,
  flashSharedBytes,
  validateFlashBatch,
} from "./webgpu_flash_plan.ts";

export { type FlashConfig, flashConfig } from "./webgpu_flash_plan.ts";

/** Head sizes compiled and tested. */
export const FLASH_HEAD_SIZES = [32, 64, 80, 96, 112, 128, 160, 192, 256];

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
  validateFlashBatch(b, cache);
  const m = buildFlashMeta(b, cfg, enc);
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
      timings: callTimings(p.plan_ms, {
        start: t0,
        written: tw,
        attended: tf,
        finished: te,
        submitted: t1,
        read: t2,
      }, gpuAttend),
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
      flashSharedBytes(cfg.head_size, 8, 8)
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
  capabilities: capabilities({
    dtypes: [...DTYPES],
    kv_cache_dtypes: [...KV_CACHE_DTYPES],
    block_sizes: [{ multiple_of: 16 }],
    head_sizes: [...FLASH_HEAD_SIZES],
    kv_cache_layouts: [...KV_LAYOUTS],
    attn_types: [...ATTN_TYPES],
    sinks: true,
    sliding_window: true,
    alibi: true,
    logits_soft_cap: true,
    non_causal: true,
    lse: true,
  }),
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
