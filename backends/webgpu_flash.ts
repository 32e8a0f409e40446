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
import { type PlanPath, type PlanPaths, planPaths } from "../core/backend_types.ts";
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
import {
  envMmaShape,
  mmaConstsOf,
  MmaRefusal,
  type MmaRefusalKind,
  mmaShapeNotTaken,
  planMmaRows,
} from "./flash_mma_plan.ts";
import type { MmaConsts, MmaShape } from "../gpu/flash_mma_shape.ts";
import { mmaSupportOrWhy } from "../gpu/flash_mma_kernel.ts";
import type { TableBuilder } from "../gpu/plan_table.ts";
import { isSoftware } from "./decode_shape.ts";
import { DECODE_BLOCK_SIZES, DECODE_HEAD_SIZES } from "./webgpu_decode.ts";
import { blockSizeIn } from "./capabilities.ts";
import {
  type DecodeTuning,
  DEFAULT_DECODE_TUNING,
  envDecodeTuning,
} from "./webgpu_decode_tuning.ts";
import { prefillSplitTuning } from "./prefill_split_tuning.ts";
import { readSetting } from "../core/env.ts";
import { PREFILL_MMA_SETTING, PREFILL_SPLIT_SETTING } from "./flash_switches.ts";

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

/** The kernels a part of a batch can run on ({@link PlanPath}'s `path`). */
export const FLASH_PATHS = {
  /** The split-KV kernels of WEBGPU_DECODE, each query token a decode row. */
  split: "split_kv",
  /** The subgroup-matrix prefill kernel (gpu/flash_mma_kernel.ts). */
  mma: "tensor_core",
  /** The portable FlashAttention-2 style kernel (wgsl/flash_attention.wgsl). */
  tiles: "tiles",
} as const;

/** {@link FlashOptions} with the switches resolved (the environment read once). */
export interface ResolvedFlashOptions extends FlashOptions {
  mma: boolean;
  prefill_split: boolean;
  /** Why the tensor-core kernel is off, where `mma` is false. */
  mma_off?: string;
}

/**
 * `o` with the switches the caller left out taken from ATTN_PREFILL_MMA and ATTN_PREFILL_SPLIT
 * (read now; for the registered WEBGPU_FLASH, as this module loads).
 * @throws EnvValueError naming a variable the caller's options need whose value is not 0 or 1.
 */
export function resolveFlashOptions(o: FlashOptions): ResolvedFlashOptions {
  const mma = o.mma ?? readSetting(PREFILL_MMA_SETTING);
  return {
    ...o,
    mma,
    prefill_split: o.prefill_split ?? readSetting(PREFILL_SPLIT_SETTING),
    ...(mma ? {} : {
      mma_off: `tensor-core kernel disabled (${
        o.mma === false ? "option mma: false" : "ATTN_PREFILL_MMA=0"
      })`,
    }),
  };
}

/** Why decode rows of `s` cannot run on the split-KV kernels, or null where they can. */
function splitProblem(s: BatchShape): string | null {
  if (isEncoder(s)) {
    return `attention type ${s.layer.attn_type} not supported (the split-KV kernels read the ` +
      "paged cache)";
  }
  if (s.cache_spec === null) return "paged KV cache missing (the split-KV kernels read one)";
  const d = s.layer.head_size, bs = s.cache_spec.block_size;
  if (!DECODE_HEAD_SIZES.includes(d)) {
    return `head_size not supported (got ${d}; supported: ${DECODE_HEAD_SIZES.join(", ")})`;
  }
  // WEBGPU_DECODE's rule (vLLM's: a declared size admits its multiples), so that its decode rows
  // run wherever WEBGPU_DECODE would run them (block sizes 48, 80 and 128 went to the tiles).
  if (!blockSizeIn(DECODE_BLOCK_SIZES, bs)) {
    return `block_size not supported (got ${bs}; supported: ${DECODE_BLOCK_SIZES.join(", ")})`;
  }
  return null;
}

/**
 * The path reason for each kind of tensor-core refusal, worded like the selector's reasons, with
 * the refusal's detail in parentheses (`s`: the batch refused).
 */
export const MMA_REFUSAL_REASONS: Readonly<
  Record<MmaRefusalKind, (detail: string, s: BatchShape) => string>
> = {
  support: (detail) => `subgroup matrices not supported (${detail})`,
  dtype: (_, s) => `dtype not supported (got ${s.dtype}; supported: float16, bfloat16)`,
  shape: (detail) => `kernel shape not supported (${detail})`,
  workgroup_memory: (detail) => `workgroup memory not sufficient (${detail})`,
  invocations: (detail) => `workgroup size not supported (${detail})`,
};

/** The tensor-core kernel's constants for a batch, and why not the named shape. */
interface MmaChoice {
  consts: MmaConsts;
  /** Why the named shape (`mma_shape`) does not run this batch, where the default shape does
   * ({@link mmaShapeNotTaken}). */
  shape_reason: string | null;
}

/**
 * The tensor-core kernel's constants for this batch's prefill rows, or why it runs none: the
 * switch, the adapter, then what mmaConstsOf refuses (the dtype, the kernel's own
 * limits), worded by {@link MMA_REFUSAL_REASONS}.
 */
function mmaFor(ctx: GpuContext, o: ResolvedFlashOptions, s: BatchShape): MmaChoice | string {
  if (!o.mma) return o.mma_off ?? "tensor-core kernel disabled";
  const support = mmaSupportOrWhy(ctx);
  if (typeof support === "string") return MMA_REFUSAL_REASONS.support(support, s);
  const c = mmaConstsOf(ctx, s, support, undefined, o.mma_shape);
  if (c instanceof MmaRefusal) return MMA_REFUSAL_REASONS[c.kind](c.detail, s);
  return { consts: c, shape_reason: mmaShapeNotTaken(ctx, s, support, o.mma_shape) };
}

/** `reason`, then `more` where there is more to say ("; " between them). */
function withReason(reason: string | undefined, more: string | null | undefined) {
  if (!more) return reason;
  return reason ? `${reason}; ${more}` : more;
}

/** A part's path record: `reason` only where there is one. */
function pathOf(part: PlanPath["part"], path: string, reason?: string): PlanPath {
  return reason ? { part, path, reason } : { part, path };
}

/** How WEBGPU_FLASH runs a batch ({@link flashRouting}). */
export interface FlashRouting {
  /** The tensor-core kernel's constants for the rows not on the split kernels, or null. */
  mma: MmaConsts | null;
  /** Request i runs on the split-KV kernels. */
  isDecode: (i: number) => boolean;
  /** The split-KV kernels run prefill rows too: their tuning is prefillSplitTuning's. */
  prefillOnSplit: boolean;
  /** Which kernels run the decode and the prefill rows, why not the preferred ones, and on the
   * tensor core why not the named shape where the default runs (the plan adds why not the
   * named tile to parts on the tiles). */
  paths: PlanPaths;
}

/**
 * Decides, from the batch's shape and the device's features and limits alone (no device call),
 * which kernels run which rows of `s`: decode rows (query length at most DECODE_THRESHOLD) on
 * the split-KV kernels where they can take them, the others on the tensor-core kernel where it
 * can take them, else on the split-KV kernels (`prefill_split`, when their partial results fit
 * a binding), else on the portable tiles; and records it, with the reasons, as {@link PlanPaths}:
 * a part's reason is why not its preferred kernel, then (`; `) on the tensor core why not the
 * shape `mma_shape` names where the default shape runs instead.
 */
export function flashRouting(
  ctx: GpuContext,
  o: ResolvedFlashOptions,
  s: BatchShape,
): FlashRouting {
  const q = s.metadata.query_start_loc;
  const qlen = (i: number) => q[i + 1] - q[i];
  // Decode rows need the split kernels' head sizes and a cache.
  const noSplit = splitProblem(s);
  const decodes = noSplit === null;
  const m = mmaFor(ctx, o, s);
  const mma = typeof m === "string" ? null : m.consts;
  // Parts on the tensor-core kernel: why not the named shape, where it is not taken.
  const shapeWhy = typeof m === "string" ? null : m.shape_reason;
  // Every token a decode row needs one partial result per token and head in one binding.
  const splitFits =
    partialBytes(s.num_tokens, s.layer.num_heads, s.layer.head_size) <= partialLimit(ctx);
  const allSplit = decodes && splitFits && o.prefill_split && !mma;
  const isDecode = (i: number) => decodes && (allSplit || qlen(i) <= DECODE_THRESHOLD);
  let hasDecode = false, hasPrefill = false;
  for (let i = 0; i < s.metadata.num_reqs; i++) {
    const n = qlen(i);
    if (n > DECODE_THRESHOLD) hasPrefill = true;
    else if (n > 0) hasDecode = true;
  }
  const other = mma ? FLASH_PATHS.mma : FLASH_PATHS.tiles;
  const parts: PlanPath[] = [];
  if (hasDecode) {
    parts.push(
      decodes
        ? pathOf("decode", FLASH_PATHS.split)
        : pathOf("decode", other, withReason(noSplit!, mma ? shapeWhy : null)),
    );
  }
  if (hasPrefill) {
    parts.push(
      typeof m !== "string"
        ? pathOf("prefill", FLASH_PATHS.mma, withReason(undefined, shapeWhy))
        : pathOf("prefill", allSplit ? FLASH_PATHS.split : FLASH_PATHS.tiles, m),
    );
  }
  return { mma, isDecode, prefillOnSplit: allSplit && hasPrefill, paths: planPaths(parts) };
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
