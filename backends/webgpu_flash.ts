/**
 * WEBGPU_FLASH: the general GPU backend, one plan for any batch (FlashInfer's way of mixed
 * batches): decode rows (requests of query length at most the decode threshold, vLLM's
 * reorder_batch_threshold) go through the split-KV kernels of WEBGPU_DECODE, every other row
 * through the tensor-core kernel where the device has subgroup matrices (f16/bf16 data), else
 * the FlashAttention-2 style prefill kernel (wgsl/flash_attention.wgsl: GQA-grouped tiles, K/V
 * tiles shared in workgroup memory, f32 online softmax, causal early exit, window skipping) or,
 * with `prefill_split`, the split-KV kernels with each query token a decode row. Encoder types
 * read K/V from the call. The new K/V are written first, and all of it runs in one submission
 * with one readback (gpu/gpu_plan.ts). The plan records which kernels run the decode and the
 * prefill rows, why not the preferred ones, and why not the tensor-core shape or the tile named
 * where another runs ({@link flashRouting}: `paths`, which the forward routes send as
 * `X-Attention-Paths` and `X-Attention-Path-Reasons`).
 * @module
 */
import { DeviceUnavailableError, invalidBatch } from "../core/errors.ts";
import {
  type AttentionBackend,
  ATTN_TYPES,
  type BackendContext,
  type BatchShape,
  DTYPES,
  type ForwardResult,
  type GpuContext,
  KV_CACHE_DTYPES,
  KV_LAYOUTS,
  type RunOptions,
  type SelectorConfig,
  type ValidBatch,
} from "../core/types.ts";
import { type PlanPaths, planPaths } from "../core/backend_types.ts";
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
  planPrefillRows,
} from "./flash_plan.ts";
import { planDecodeRows } from "./decode_plan.ts";
import { envMmaShape, planMmaRows } from "./flash_mma_plan.ts";
import type { MmaConsts } from "../gpu/flash_mma_shape.ts";
import type { TableBuilder } from "../gpu/plan_table.ts";
import { isSoftware } from "./decode_shape.ts";
import { DEFAULT_DECODE_TUNING, envDecodeTuning } from "./webgpu_decode_tuning.ts";
import { prefillSplitTuning } from "./prefill_split_tuning.ts";
import {
  DECODE_THRESHOLD,
  FLASH_PATHS,
  type FlashOptions,
  flashRouting,
  pathOf,
  type ResolvedFlashOptions,
  resolveFlashOptions,
  withReason,
} from "./flash_routing.ts";

export { type FlashConfig, flashConfig, type FlashTile } from "./flash_plan.ts";
export {
  DECODE_THRESHOLD,
  FLASH_PATHS,
  type FlashOptions,
  type FlashRouting,
  flashRouting,
  MMA_REFUSAL_REASONS,
  type ResolvedFlashOptions,
  resolveFlashOptions,
} from "./flash_routing.ts";

/** Head sizes compiled and tested. */
export const FLASH_HEAD_SIZES = [32, 64, 80, 96, 112, 128, 160, 192, 256];

const NAME = "WEBGPU_FLASH";
function requireGpu(ctx: BackendContext): GpuContext {
  const gpu = ctx.gpu;
  if (!gpu || gpu.lost) {
    throw new DeviceUnavailableError(`${NAME} needs a WebGPU device; none is available`);
  }
  return gpu;
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

/**
 * `paths` with `replaced` (a named tile that does not fit: {@link FlashConfig}'s) added to the
 * reason of each part on the portable tiles, which run the automatic tile instead.
 */
function tileReplaced(paths: PlanPaths, replaced: string | undefined): PlanPaths {
  if (!replaced || !paths.parts.some((p) => p.path === FLASH_PATHS.tiles)) return paths;
  return planPaths(
    paths.parts.map((p) =>
      p.path === FLASH_PATHS.tiles ? pathOf(p.part, p.path, withReason(p.reason, replaced)) : p
    ),
  );
}

/** A WEBGPU_FLASH plan: a {@link GpuPlan} that records its paths. */
export type FlashPlan = GpuPlan & { readonly paths: PlanPaths };

async function planFor(
  o: ResolvedFlashOptions,
  s: BatchShape,
  bctx: BackendContext,
): Promise<FlashPlan> {
  const ctx = requireGpu(bctx);
  const cfg = flashConfig(s.layer.head_size, ctx.limits, o.tile, !isSoftware(ctx));
  if (!cfg) {
    throw invalidBatch([{
      path: ["layer", "head_size"],
      message: `${s.layer.head_size} is not supported by ${NAME} on this device`,
    }]);
  }
  const { mma, isDecode, prefillOnSplit, paths: routed } = flashRouting(ctx, o, s);
  const paths = tileReplaced(routed, cfg.replaced);
  const prefillTuning = prefillSplitTuning(o.decode, isSoftware(ctx), s.layer);
  const [onDecode, onPrefill] = splitDispatches(
    s,
    isDecode,
    prefillOnSplit,
    prefillTuning.wg_tokens,
  );
  const tuning = prefillOnSplit && !onPrefill ? prefillTuning : o.decode;
  const plan = await buildGpuPlan(ctx, s, async (table): Promise<AttentionCalls> => {
    const [d, ps, p] = await Promise.all([
      planDecodeRows(ctx, tuning, s, onDecode, table),
      onPrefill ? planDecodeRows(ctx, prefillTuning, s, onPrefill, table, "prefill") : null,
      planPrefill(ctx, mma, s, cfg, (i) => !isDecode(i), table),
    ]);
    const split = [d, ps].filter((x) => x !== null);
    return {
      calls: [...split.flatMap((x) => x.calls), ...(p?.calls ?? [])],
      scratch: split.length ? { part: Math.max(...split.map((x) => x.part_bytes)) } : {},
      kernels: [...split.map((x) => x.key), ...(p ? [p.key] : [])],
      info: {
        decode_rows: split.reduce((n, x) => n + x.rows, 0),
        decode_items: split.reduce((n, x) => n + x.items, 0),
        decode_wg_tokens: Math.max(0, ...split.map((x) => x.geometry.decode_wg_tokens)),
        decode_longest_first: Math.max(0, ...split.map((x) => x.geometry.decode_longest_first)),
        decode_dispatches: split.length,
        prefill_tiles: p?.tiles ?? 0,
      },
    };
  });
  return Object.assign(plan, { paths });
}

/**
 * The requests of each split-KV dispatch: `[rows, null]` for one dispatch (the decode tuning,
 * or the prefill tuning where the split kernels run prefill rows), `[short, long]` where they
 * run both kinds (a mixed batch on a device without the tensor cores): requests of fewer than
 * `wt` rows (decode rows, and short prefills such as speculative steps) keep the decode tuning
 * and the others get the prefill tuning (`wt` tokens a workgroup sharing K/V reads, which a
 * dispatch holding a request of fewer rows cannot take). The second dispatch runs after the
 * first (its partials reuse the same scratch; its passes are named `prefill_*`).
 */
export function splitDispatches(
  s: BatchShape,
  isDecode: (i: number) => boolean,
  prefillOnSplit: boolean,
  wt: number,
): [(i: number) => boolean, ((i: number) => boolean) | null] {
  const q = s.metadata.query_start_loc;
  const long = (i: number) => q[i + 1] - q[i] >= Math.max(wt, DECODE_THRESHOLD + 1);
  let shortRows = false;
  for (let i = 0; i < s.metadata.num_reqs && !shortRows; i++) {
    shortRows = isDecode(i) && !long(i) && q[i + 1] > q[i];
  }
  if (!prefillOnSplit || !shortRows) return [isDecode, null];
  return [(i) => isDecode(i) && !long(i), (i) => isDecode(i) && long(i)];
}

/** Runs a plan; the result carries the plan's paths (the same object, made at plan time). */
async function runFlash(
  p: FlashPlan,
  batch: ValidBatch,
  ctx: BackendContext,
  opts?: RunOptions,
): Promise<ForwardResult> {
  const r = await runGpuPlan(p, batch, ctx.gpu, opts);
  r.paths = p.paths;
  return r;
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
): AttentionBackend<FlashPlan> {
  // The switches' environment variables are read here, once, not on every plan.
  const opts = resolveFlashOptions(o);
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
    run: runFlash,
    disposePlan: disposeGpuPlan,
  };
}

/**
 * The registered WEBGPU_FLASH: the prefill tile from `ATTN_FLASH_TILE` (else automatic), the
 * tensor-core shape from `ATTN_PREFILL_MMA_SHAPE`, the decode rows' tuning from
 * `ATTN_DECODE_TUNING`, the switches from `ATTN_PREFILL_MMA` and `ATTN_PREFILL_SPLIT`, all read
 * once here, as this module loads: a bad value fails the import with an EnvValueError naming
 * it (server/serve_env.ts checks them before the server loads the backends).
 */
export const WEBGPU_FLASH: AttentionBackend<FlashPlan> = makeWebGpuFlash({
  tile: envFlashTile(),
  mma_shape: envMmaShape(),
  decode: envDecodeTuning(),
});
