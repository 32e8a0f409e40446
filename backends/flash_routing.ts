/**
 * How WEBGPU_FLASH routes a batch: its options ({@link FlashOptions}, the environment's switches
 * resolved once), the kernels a part can run on ({@link FLASH_PATHS}), and {@link flashRouting}:
 * from the batch's shape and the device's features and limits alone, which kernels run the
 * decode and the prefill rows, and why not the preferred ones (the plan's `paths`, which the
 * forward routes send as `X-Attention-Paths` and `X-Attention-Path-Reasons`).
 * @module
 */
import type { BatchShape, GpuContext } from "../core/types.ts";
import { type PlanPath, type PlanPaths, planPaths } from "../core/backend_types.ts";
import type { FlashTile } from "./flash_plan.ts";
import { partialBytes, partialLimit } from "./decode_plan.ts";
import {
  mmaConstsOf,
  MmaRefusal,
  type MmaRefusalKind,
  mmaShapeNotTaken,
} from "./flash_mma_plan.ts";
import type { MmaConsts, MmaShape } from "../gpu/flash_mma_shape.ts";
import { mmaSupportOrWhy } from "../gpu/flash_mma_kernel.ts";
import { DECODE_BLOCK_SIZES, DECODE_HEAD_SIZES } from "./webgpu_decode.ts";
import { blockSizeIn } from "./capabilities.ts";
import type { DecodeTuning } from "./webgpu_decode_tuning.ts";
import { readSetting } from "../core/env.ts";
import { PREFILL_MMA_SETTING, PREFILL_SPLIT_SETTING } from "./flash_switches.ts";

/** Requests of at most this many query tokens run as decode rows (vLLM's reorder_batch_threshold). */
export const DECODE_THRESHOLD = 1;

export const isEncoder = (s: BatchShape) =>
  s.layer.attn_type === "encoder" || s.layer.attn_type === "encoder_only";

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
export function withReason(reason: string | undefined, more: string | null | undefined) {
  if (!more) return reason;
  return reason ? `${reason}; ${more}` : more;
}

/** A part's path record: `reason` only where there is one. */
export function pathOf(part: PlanPath["part"], path: string, reason?: string): PlanPath {
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
