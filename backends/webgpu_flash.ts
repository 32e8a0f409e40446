/**
 * WEBGPU_FLASH: the general GPU backend, one plan for any batch (FlashInfer's way of mixed
 * batches): decode rows (requests of query length at most the decode threshold, vLLM's
 * reorder_batch_threshold) go through the split-KV kernels of WEBGPU_DECODE, every other row
 * through the tensor-core kernel where the device has subgroup matrices (f16/bf16 data), else
 * the FlashAttention-2 style prefill kernel (wgsl/flash_attention.wgsl: GQA-grouped tiles, K/V
 * tiles shared in workgroup memory, f32 online softmax, causal early exit, window skipping) or,
 * with `prefill_split`, the split-KV kernels with each query token a decode row. Encoder types
 * read K/V from the call. The new K/V are written first, and all of it runs in one submission
 * with one readback (gpu/gpu_plan.ts).
 * @module
 */
import { DeviceUnavailableError, invalidBatch } from "../core/errors.ts";
import {
  type AttentionBackend,
  ATTN_TYPES,
  type BackendContext,
  type BatchShape,
  DTYPES,
  type GpuContext,
  KV_CACHE_DTYPES,
  KV_LAYOUTS,
  type SelectorConfig,
} from "../core/types.ts";
import { capabilities } from "./capabilities_base.ts";
import { type GpuPlan, runGpuPlan } from "../gpu/gpu_plan.ts";
import { type AttentionCalls, buildGpuPlan, disposeGpuPlan } from "../gpu/plan_builder.ts";
import { GpuKvCache } from "../gpu/kv_cache.ts";
import {
  envFlashTile,
  FLASH_TILES,
  type FlashConfig,
  flashConfig,
  flashSharedBytes,
  type FlashTile,
  planPrefillRows,
} from "./flash_plan.ts";
import { partialBytes, partialLimit, planDecodeRows } from "./decode_plan.ts";
import { envMmaShape, mmaConstsOf, planMmaRows } from "./flash_mma_plan.ts";
import type { MmaConsts, MmaShape } from "../gpu/flash_mma_shape.ts";
import { mmaSupportOf } from "../gpu/flash_mma_kernel.ts";
import type { TableBuilder } from "../gpu/plan_table.ts";
import { isSoftware } from "./decode_shape.ts";
import { DECODE_HEAD_SIZES } from "./webgpu_decode.ts";
import {
  type DecodeTuning,
  DEFAULT_DECODE_TUNING,
  envDecodeTuning,
} from "./webgpu_decode_tuning.ts";
import { envVar } from "../core/env.ts";

export { type FlashConfig, flashConfig, type FlashTile } from "./flash_plan.ts";

/** Head sizes compiled and tested. */
export const FLASH_HEAD_SIZES = [32, 64, 80, 96, 112, 128, 160, 192, 256];

/** Requests of at most this many query tokens run as decode rows (vLLM's reorder_batch_threshold). */
export const DECODE_THRESHOLD = 1;

const NAME = "WEBGPU_FLASH";
const isEncoder = (s: BatchShape) =>
  s.layer.attn_type === "encoder" || s.layer.attn_type === "encoder_only";

function requireGpu(ctx: BackendContext): GpuContext {
  const gpu = ctx.gpu;
  if (!gpu || gpu.lost) {
    throw new DeviceUnavailableError(`${NAME} needs a WebGPU device; none is available`);
  }
  return gpu;
}

/** What a WEBGPU_FLASH variant is built with. */
export interface FlashOptions {
  /** The prefill register tile; null: the first of FLASH_TILES that fits. */
  tile: FlashTile | null;
  /** The split-KV kernels' tuning for the decode rows. */
  decode: DecodeTuning;
  /**
   * Run f16/bf16 prefill rows on the tensor-core kernel (subgroup matrices, Dawn) where the
   * device has them; false keeps the portable kernel. Default: on, unless ATTN_PREFILL_MMA=0 when the backend
   * is built.
   */
  mma?: boolean;
  /** The tensor-core kernel's shape where a batch can take it (else the default shape). */
  mma_shape?: MmaShape;
  /**
   * Prefill rows that the tensor-core kernel does not take run on the split-KV kernels, each
   * query token a decode row, instead of the portable tiles (decoder layers with a paged
   * cache, when one partial result per token and head fits a binding). On the H200 under
   * Deno's runtime this ran causal prefill 2.2x (4 x 1024) and 2.3x (8 x 4096) faster than
   * the tiles, on lavapipe 3.2x (2 x 256): bench/NOTES.md. Default: on, unless
   * ATTN_PREFILL_SPLIT=0 when the backend is built.
   */
  prefill_split?: boolean;
}

/** An on-by-default switch: off only where the variable is "0". */
function envOn(name: string): boolean {
  return envVar(name) !== "0";
}

/** The tensor-core kernel's constants for this batch's prefill rows; null where it runs none. */
function mmaFor(ctx: GpuContext, o: FlashOptions, s: BatchShape): MmaConsts | null {
  if (!o.mma) return null;
  const c = mmaConstsOf(ctx, s, mmaSupportOf(ctx), undefined, o.mma_shape);
  return typeof c === "string" ? null : c;
}

/** The prefill rows on the tensor-core kernel when it runs them (`mma`), else the portable one. */
async function planPrefill(
  ctx: GpuContext,
  mma: MmaConsts | null,
  s: BatchShape,
  cfg: FlashConfig,
  reqs: (i: number) => boolean,
  table: TableBuilder,
) {
  if (mma) return await planMmaRows(ctx, s, mma, reqs, table);
  return await planPrefillRows(ctx, s, cfg, reqs, table);
}

async function planFor(
  o: FlashOptions,
  s: BatchShape,
  bctx: BackendContext,
): Promise<GpuPlan> {
  const ctx = requireGpu(bctx);
  const cfg = flashConfig(s.layer.head_size, ctx.limits, o.tile, !isSoftware(ctx));
  if (!cfg) {
    throw invalidBatch([{
      path: ["layer", "head_size"],
      message: `${s.layer.head_size} is not supported by ${NAME} on this device`,
    }]);
  }
  const md = s.metadata;
  const qlen = (i: number) => md.query_start_loc[i + 1] - md.query_start_loc[i];
  // Decode rows need the split kernels' head sizes and a cache.
  const decodes = !isEncoder(s) && DECODE_HEAD_SIZES.includes(s.layer.head_size) &&
    s.cache_spec !== null && [16, 32, 64].includes(s.cache_spec.block_size);
  const mma = mmaFor(ctx, o, s);
  // Every token a decode row needs one partial result per token and head in one binding.
  const splitFits =
    partialBytes(s.num_tokens, s.layer.num_heads, s.layer.head_size) <= partialLimit(ctx);
  const allSplit = decodes && splitFits && o.prefill_split && !mma;
  const isDecode = (i: number) => decodes && (allSplit || qlen(i) <= DECODE_THRESHOLD);
  return await buildGpuPlan(ctx, s, async (table): Promise<AttentionCalls> => {
    const [d, p] = await Promise.all([
      planDecodeRows(ctx, o.decode, s, isDecode, table),
      planPrefill(ctx, mma, s, cfg, (i) => !isDecode(i), table),
    ]);
    return {
      calls: [...(d?.calls ?? []), ...(p?.calls ?? [])],
      scratch: d ? { part: d.part_bytes } : {},
      kernels: [...(d ? [d.key] : []), ...(p ? [p.key] : [])],
      info: {
        decode_rows: d?.rows ?? 0,
        decode_items: d?.items ?? 0,
        prefill_tiles: p?.tiles ?? 0,
      },
    };
  });
}

function supportsCombination(cfg: SelectorConfig, ctx: BackendContext): string | null {
  if (!ctx.gpu || !FLASH_HEAD_SIZES.includes(cfg.head_size)) return null;
  if (!flashConfig(cfg.head_size, ctx.gpu.limits)) {
    const least = FLASH_TILES[FLASH_TILES.length - 1];
    return `head_size ${cfg.head_size} needs ${flashSharedBytes(cfg.head_size, least)} B of ` +
      `workgroup storage (device has ${ctx.gpu.limits.maxComputeWorkgroupStorageSize})`;
  }
  return null;
}

/** Builds the backend with `o` (the registry uses {@link WEBGPU_FLASH}). */
export function makeWebGpuFlash(
  o: FlashOptions = { tile: null, decode: { ...DEFAULT_DECODE_TUNING } },
): AttentionBackend<GpuPlan> {
  // The switches' environment variables are read here, once, not on every plan.
  const opts: FlashOptions = {
    ...o,
    mma: o.mma ?? envOn("ATTN_PREFILL_MMA"),
    prefill_split: o.prefill_split ?? envOn("ATTN_PREFILL_SPLIT"),
  };
  return {
    name: NAME,
    priority: 10,
    description: "WebGPU attention for any batch: decode rows through split-KV kernels, the " +
      "rest through a FlashAttention-2 style varlen kernel, one submission.",
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
      reorder_batch_threshold: DECODE_THRESHOLD,
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
    plan: (s, ctx) => planFor(opts, s, ctx),
    run: (p, batch, ctx, opts) => runGpuPlan(p, batch, ctx.gpu, opts),
    disposePlan: disposeGpuPlan,
  };
}

/**
 * The registered WEBGPU_FLASH: the prefill tile from `ATTN_FLASH_TILE` (else automatic), the
 * tensor-core shape from `ATTN_PREFILL_MMA_SHAPE`, the decode rows' tuning from
 * `ATTN_DECODE_TUNING`, all read once here.
 */
export const WEBGPU_FLASH: AttentionBackend<GpuPlan> = makeWebGpuFlash({
  tile: envFlashTile(),
  mma_shape: envMmaShape(),
  decode: envDecodeTuning(),
});
