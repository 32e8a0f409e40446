/**
 * Planning prefill rows on the tensor-core kernel (gpu/flash_mma_kernel.ts), the way
 * backends/flash_plan.ts plans them on the portable one: the same tile table
 * ({@link buildFlashMeta} with the kernel's rows per workgroup), the same Params words and
 * binding names, one planned call ({@link planMmaRows}); {@link planFlashMma} wraps it in a
 * whole plan (cache write, poison, attention; gpu/plan_builder.ts) that `runGpuPlan` runs.
 * Which batches qualify is said as a refusal of one kind ({@link MmaRefusal}, from
 * {@link mmaConstsOf}): f16/bf16 data on a device with f16 -> f32 subgroup matrices, a
 * shape that compiles and fits the device's workgroup memory and invocations; f32 data keeps the
 * exact path.
 * @module
 */
import { warnOnce } from "../core/warn_once.ts";
import type { BatchShape, GpuContext } from "../core/types.ts";
import {
  chooseMmaShape,
  fullShape,
  MMA_SHAPES,
  MMA_VARIANTS,
  type MmaConsts,
  mmaLayout,
  type MmaShape,
  mmaShapeProblem,
  type MmaTarget,
} from "../gpu/flash_mma_shape.ts";
import { FLASH_MMA, type MmaSupport } from "../gpu/flash_mma_kernel.ts";
import type { GpuPlan, PlannedCall } from "../gpu/gpu_plan.ts";
import { getKernel } from "../gpu/kernel.ts";
import { kvChunkGeometry } from "../gpu/kv_cache.ts";
import { buildGpuPlan } from "../gpu/plan_builder.ts";
import type { TableBuilder } from "../gpu/plan_table.ts";
import { buildFlashMeta, flashTileCall, hasRows, maxWorkgroupInvocations } from "./flash_plan.ts";
import { type EnvSetting, EnvValueError, readSetting } from "../core/env.ts";

const isEncoder = (s: BatchShape) =>
  s.layer.attn_type === "encoder" || s.layer.attn_type === "encoder_only";

/** What kind of thing stops the tensor-core kernel from running a batch. */
export type MmaRefusalKind =
  | "support" // the device has no f16 -> f32 subgroup matrices
  | "dtype" // f32 data keeps the exact path
  | "shape" // no shape, or not the named one, compiles for the batch (head size, cache, fields)
  | "workgroup_memory" // no shape fits the device's workgroup memory, or the named one needs more
  | "invocations"; // the shape's workgroup has more invocations than the device allows

/** Why the tensor-core kernel cannot run a batch: the kind, and the particulars in words. */
export class MmaRefusal {
  constructor(readonly kind: MmaRefusalKind, readonly detail: string) {}

  toString(): string {
    return this.detail;
  }
}

/** What `s` fixes of the kernel on a device with `mma`, or why the kernel cannot run it. */
export function mmaTargetOf(
  ctx: GpuContext,
  s: BatchShape,
  mma: MmaSupport | null,
): MmaTarget | MmaRefusal {
  if (!mma) return new MmaRefusal("support", "the device has no f16 -> f32 subgroup matrices");
  if (s.dtype === "float32") {
    return new MmaRefusal("dtype", "float32 data keeps the exact f32 path");
  }
  const g = isEncoder(s) ? null : kvChunkGeometry(ctx, s.cache_spec!);
  const L = s.layer;
  return {
    kv: g ? g.storage_dtype : s.dtype,
    dtype: s.dtype,
    enc: g === null,
    d: s.layer.head_size,
    bs: g ? s.cache_spec!.block_size : 16,
    nhd: g ? s.cache_spec!.layout === "NHD" : true,
    nchunk: g ? g.nchunk : 0,
    ...mma,
    causal: L.attn_type === "encoder_decoder" ? false : L.causal,
    window: (L.sliding_window ?? 0) > 0,
    softcap: (L.logits_soft_cap ?? 0) > 0,
    alibi: L.alibi_slopes !== null,
    sinks: L.sinks !== null,
  };
}

/**
 * `ATTN_PREFILL_MMA_SHAPE`: the name of one of {@link MMA_VARIANTS}, not a bench-only one
 * (unset or empty: the first of MMA_SHAPES that fits).
 */
export const MMA_SHAPE_SETTING: EnvSetting<MmaShape | undefined> = {
  name: "ATTN_PREFILL_MMA_SHAPE",
  unset: undefined,
  parse(name) {
    const shape = Object.hasOwn(MMA_VARIANTS, name) ? MMA_VARIANTS[name] : undefined;
    if (!shape) {
      throw new EnvValueError(
        "ATTN_PREFILL_MMA_SHAPE",
        name,
        `ATTN_PREFILL_MMA_SHAPE=${JSON.stringify(name)} names no shape; known: ${
          Object.keys(MMA_VARIANTS)
        }`,
      );
    }
    if (shape.sgresc) {
      // bench/NOTES.md v0.8: right on the H200 and lavapipe, 1-2% faster on the H200, but it
      // relies on a subgroup's own workgroup-memory hand-offs being ordered, which WGSL does not
      // promise.
      throw new EnvValueError(
        "ATTN_PREFILL_MMA_SHAPE",
        name,
        `ATTN_PREFILL_MMA_SHAPE=${
          JSON.stringify(name)
        } is a bench-only shape (per-subgroup rescale: relies on ` +
          `an ordering WGSL does not promise): bench/mma_bench.ts --only names it`,
      );
    }
    return shape;
  },
};

/**
 * The shape ATTN_PREFILL_MMA_SHAPE names ({@link MMA_SHAPE_SETTING}), or undefined (unset:
 * the first of MMA_SHAPES that fits).
 * @throws EnvValueError naming the value and the known names when it names none, or when it
 *   names a bench-only (per-subgroup rescale) shape.
 */
export function envMmaShape(): MmaShape | undefined {
  return readSetting(MMA_SHAPE_SETTING);
}

/**
 * Why `t` cannot take `shape` on a device with `limits` (it does not compile for the batch, or
 * needs more workgroup memory or invocations than the device grants), or null.
 */
function shapeUnfit(
  t: MmaTarget,
  shape: MmaShape,
  limits: Readonly<Record<string, number>>,
): string | null {
  const problem = mmaShapeProblem(t, shape, limits.maxComputeWorkgroupStorageSize ?? 16384);
  if (problem) return problem;
  const lanes = shape.nsg * t.sg, maxLanes = maxWorkgroupInvocations(limits);
  return lanes > maxLanes ? `${lanes} invocations a workgroup (limit ${maxLanes})` : null;
}

/** `shape`'s name in {@link MMA_VARIANTS}, or its fields as JSON (a shape built in code). */
function mmaShapeName(shape: MmaShape): string {
  const named = Object.entries(MMA_VARIANTS).find(([, v]) => v === shape) ??
    Object.entries(MMA_VARIANTS).find(([, v]) => JSON.stringify(v) === JSON.stringify(shape));
  return named ? named[0] : JSON.stringify(shape);
}

/**
 * Why {@link mmaConstsOf} does not take `preferred` (`ATTN_PREFILL_MMA_SHAPE`, or WEBGPU_FLASH's
 * `mma_shape` option) for `s` on this device, for a call where it gave constants (the default
 * shape's, then): the path reason `shape NAME (ATTN_PREFILL_MMA_SHAPE) not taken (why): the
 * default shape runs`, also said once per process as a warning line on stderr (as a replaced
 * flash tile is: backends/flash_plan.ts). Null where none was named or `s` takes it. (Where
 * mmaConstsOf refuses `s`, its refusal is the reason, not this.)
 */
export function mmaShapeNotTaken(
  ctx: GpuContext,
  s: BatchShape,
  mma: MmaSupport | null,
  preferred?: MmaShape,
): string | null {
  if (!preferred) return null;
  const t = mmaTargetOf(ctx, s, mma);
  if (t instanceof MmaRefusal) return null;
  const why = shapeUnfit(t, preferred, ctx.limits);
  if (why === null) return null;
  const reason = `shape ${mmaShapeName(preferred)} (ATTN_PREFILL_MMA_SHAPE) not taken (${why}): ` +
    "the default shape runs";
  warnOnce(reason);
  return reason;
}

/**
 * The compile-time values for `s` with `shape` (default: `preferred` where `s` can take it on
 * this device, else the first that fits: {@link mmaShapeNotTaken} says why), or why not. The
 * batch's features are compiled in only by `fast` shapes (false otherwise: one pipeline serves
 * every feature set).
 */
export function mmaConstsOf(
  ctx: GpuContext,
  s: BatchShape,
  mma: MmaSupport | null,
  shape?: MmaShape,
  preferred?: MmaShape,
): MmaConsts | MmaRefusal {
  const t = mmaTargetOf(ctx, s, mma);
  if (t instanceof MmaRefusal) return t;
  const limit = ctx.limits.maxComputeWorkgroupStorageSize ?? 16384;
  // A named shape this batch cannot take here (a direct shape on a bf16 cache, one over the
  // device's workgroup memory or invocations): the default's.
  const named = shape ? undefined : preferred;
  const fits = named && shapeUnfit(t, named, ctx.limits) === null ? named : undefined;
  const sh = shape ?? fits ?? chooseMmaShape(t, limit);
  if (!sh) {
    // No shape compiles for this batch at all (head_size 72), or none fits the memory.
    const first = mmaShapeProblem(t, MMA_SHAPES[0]);
    if (!chooseMmaShape(t, Infinity) && first) return new MmaRefusal("shape", first);
    const detail = `no kernel shape fits head_size ${t.d} in ${limit} B of workgroup memory`;
    return new MmaRefusal("workgroup_memory", detail);
  }
  const problem = mmaShapeProblem(t, sh);
  if (problem) return new MmaRefusal("shape", problem);
  // Everything else about the shape is right: only its workgroup memory can be wrong.
  const tooBig = mmaShapeProblem(t, sh, limit);
  if (tooBig) return new MmaRefusal("workgroup_memory", tooBig);
  const lanes = sh.nsg * t.sg, maxLanes = maxWorkgroupInvocations(ctx.limits);
  if (lanes > maxLanes) {
    return new MmaRefusal("invocations", `${lanes} invocations a workgroup (limit ${maxLanes})`);
  }
  const full = fullShape(sh);
  if (full.fast) return { ...t, ...full };
  const off = { causal: false, window: false, softcap: false, alibi: false, sinks: false };
  return { ...t, ...off, ...full };
}

/** Plans the rows of the requests `reqs` selects on the tensor-core kernel. */
export async function planMmaRows(
  ctx: GpuContext,
  s: BatchShape,
  c: MmaConsts,
  reqs: (i: number) => boolean,
  table: TableBuilder,
): Promise<{ calls: PlannedCall[]; key: string; tiles: number } | null> {
  if (!hasRows(s, reqs)) return null;
  const lay = mmaLayout(c, c);
  const m = buildFlashMeta(s, { rows: lay.rows }, reqs);
  const g = c.enc ? null : kvChunkGeometry(ctx, s.cache_spec!);
  // Sections first, then the kernel (see planDecodeRows): a layout independent of timing.
  const strides = { kstr: lay.kstr, pstr: lay.pstr, sstr: lay.sstr };
  const { bind, grid } = flashTileCall(ctx, s, m, FLASH_MMA, g, c.enc, table, strides);
  const kernel = await getKernel(ctx, FLASH_MMA, c);
  return {
    calls: [{ name: "prefill_mma", kernel, bind, cache: !c.enc, grid }],
    key: kernel.key,
    tiles: m.numTiles,
  };
}

/**
 * A whole plan running every row of `s` on the tensor-core kernel.
 * @throws Error naming why the kernel cannot run `s` here.
 */
export function planFlashMma(
  ctx: GpuContext,
  s: BatchShape,
  mma: MmaSupport | null,
  shape?: MmaShape,
): Promise<GpuPlan> {
  const c = mmaConstsOf(ctx, s, mma, shape);
  if (c instanceof MmaRefusal) return Promise.reject(new Error(`flash_mma: ${c.detail}`));
  return buildGpuPlan(ctx, s, async (table) => {
    const r = await planMmaRows(ctx, s, c, () => true, table);
    return {
      calls: r?.calls ?? [],
      scratch: {},
      kernels: r ? [r.key] : [],
      info: { prefill_tiles: r?.tiles ?? 0 },
    };
  });
}
