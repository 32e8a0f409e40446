/**
 * Planning prefill rows on the tensor-core kernel (gpu/flash_mma_kernel.ts), the way
 * backends/flash_plan.ts plans them on the portable one: the same tile table
 * ({@link buildFlashMeta} with the kernel's rows per workgroup), the same Params words and
 * binding names, one planned call ({@link planMmaRows}); {@link planFlashMma} wraps it in a
 * whole plan (cache write, poison, attention; gpu/plan_builder.ts) that `runGpuPlan` runs.
 * Which batches qualify is said as a reason ({@link mmaTargetOf}): f16/bf16 data on a device
 * with f16 -> f32 subgroup matrices; f32 data keeps the exact path.
 * @module
 */
import type { BatchShape, GpuContext } from "../core/types.ts";
import { dispatchSize } from "../gpu/batch_buffers.ts";
import {
  chooseMmaShape,
  type MmaConsts,
  mmaLayout,
  type MmaShape,
  mmaShapeProblem,
  type MmaTarget,
} from "../gpu/flash_mma_shape.ts";
import { FLASH_MMA, type MmaSupport } from "../gpu/flash_mma_kernel.ts";
import type { GpuPlan, PlannedCall } from "../gpu/gpu_plan.ts";
import { getKernel, packUniforms } from "../gpu/kernel.ts";
import { kvChunkGeometry } from "../gpu/kv_cache.ts";
import { buildGpuPlan } from "../gpu/plan_builder.ts";
import type { TableBuilder } from "../gpu/plan_table.ts";
import { buildFlashMeta } from "./flash_plan.ts";

const isEncoder = (s: BatchShape) =>
  s.layer.attn_type === "encoder" || s.layer.attn_type === "encoder_only";

/** What `s` fixes of the kernel on a device with `mma`, or why the kernel cannot run it. */
export function mmaTargetOf(
  ctx: GpuContext,
  s: BatchShape,
  mma: MmaSupport | null,
): MmaTarget | string {
  if (!mma) return "the device has no f16 -> f32 subgroup matrices";
  if (s.dtype === "float32") return "float32 data keeps the exact f32 path";
  const g = isEncoder(s) ? null : kvChunkGeometry(ctx, s.cache_spec!);
  return {
    kv: g ? g.storage_dtype : s.dtype,
    dtype: s.dtype,
    enc: g === null,
    d: s.layer.head_size,
    bs: g ? s.cache_spec!.block_size : 16,
    nhd: g ? s.cache_spec!.layout === "NHD" : true,
    nchunk: g ? g.nchunk : 0,
    ...mma,
  };
}

/** The compile-time values for `s` with `shape` (default: the first that fits), or why not. */
export function mmaConstsOf(
  ctx: GpuContext,
  s: BatchShape,
  mma: MmaSupport | null,
  shape?: MmaShape,
): MmaConsts | string {
  const t = mmaTargetOf(ctx, s, mma);
  if (typeof t === "string") return t;
  const limit = ctx.limits.maxComputeWorkgroupStorageSize ?? 16384;
  const sh = shape ?? chooseMmaShape(t, limit);
  if (!sh) return `no kernel shape fits head_size ${t.d} in ${limit} B of workgroup memory`;
  const problem = mmaShapeProblem(t, sh, limit);
  return problem ?? { ...t, ...sh };
}

/** Plans the rows of the requests `reqs` selects on the tensor-core kernel. */
export async function planMmaRows(
  ctx: GpuContext,
  s: BatchShape,
  c: MmaConsts,
  reqs: (i: number) => boolean,
  table: TableBuilder,
): Promise<{ calls: PlannedCall[]; key: string; tiles: number } | null> {
  const L = s.layer, lay = mmaLayout(c, c);
  const m = buildFlashMeta(s, { rows: lay.rows }, reqs);
  if (m.numTiles === 0) return null;
  const kernel = await getKernel(ctx, FLASH_MMA, c);
  const fp8 = c.kv === "fp8_e4m3" || c.kv === "fp8_e5m2";
  const g = c.enc ? null : kvChunkGeometry(ctx, s.cache_spec!);
  const grid = dispatchSize(ctx, m.numTiles * L.num_kv_heads);
  const params = table.add(packUniforms(FLASH_MMA, {
    num_tiles: m.numTiles,
    num_heads: L.num_heads,
    num_kv_heads: L.num_kv_heads,
    group: L.num_heads / L.num_kv_heads,
    num_tokens: s.num_tokens,
    nwg_x: grid[0],
    causal: m.causal ? 1 : 0,
    window: Math.min(m.w, 2 ** 30),
    softcap: L.logits_soft_cap ?? 0,
    scale_qk: L.scale * (fp8 ? L.k_scale : 1),
    v_scale: fp8 ? L.v_scale : 1,
    flags: (L.alibi_slopes ? 1 : 0) | (L.sinks ? 2 : 0),
    off_reqs: m.offReqs,
    off_bt: m.offBt,
    off_alibi: m.offAlibi,
    off_sinks: m.offSinks,
    block_words: g?.block_words ?? 0,
    blocks_per_chunk: g?.blocks_per_chunk ?? 0,
  }));
  const meta = table.add(m.meta);
  const bind: PlannedCall["bind"] = {
    U: { table: params },
    q: { io: "query" },
    mdw: { table: meta },
    out: { io: "out" },
    lse: { io: "lse" },
  };
  if (c.enc) Object.assign(bind, { k_in: { io: "key" }, v_in: { io: "value" } });
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
  if (typeof c === "string") return Promise.reject(new Error(`flash_mma: ${c}`));
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
