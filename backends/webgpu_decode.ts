/**
 * WEBGPU_DECODE: flash decoding (split-KV) for every query token of a batch. Each token's
 * visible keys are cut into slices; one workgroup per (slice, kv head) reads every K/V byte of
 * its slice once for all query heads of the GQA group (coalesced vec4<u32> loads, f32 online
 * softmax, no barrier per key; wgsl/decode_split.wgsl), and a reduce pass merges the slices
 * by their max and sum, adds the sink and writes the output in the batch dtype
 * (wgsl/decode_reduce.wgsl); on GPU shapes a row of one slice writes its output from the split
 * pass, and with `fused_reduce` the last slice of a row merges the others there too
 * (wgsl/decode_epilogue.wgsl, decode_fused.wgsl). A request with n > 1 query tokens is n decode rows: correct for
 * any batch, fast where queries are short (decode, speculative decode). WEBGPU_FLASH runs its
 * decode rows through the same kernels. Core WGSL only; uses subgroup shuffles when
 * `subgroups` was granted, else a workgroup-memory reduction.
 * @module
 */
import { DeviceUnavailableError } from "../core/errors.ts";
import type { AttentionBackend, BackendContext, BatchShape, GpuContext } from "../core/types.ts";
import { capabilities } from "./capabilities_base.ts";
import { type GpuPlan, runGpuPlan } from "../gpu/gpu_plan.ts";
import { type AttentionCalls, buildGpuPlan, disposeGpuPlan } from "../gpu/plan_builder.ts";
import { GpuKvCache } from "../gpu/kv_cache.ts";
import { planDecodeRows } from "./decode_plan.ts";
import {
  type DecodeTuning,
  DEFAULT_DECODE_TUNING,
  envDecodeTuning,
} from "./webgpu_decode_tuning.ts";

export {
  type DecodeTuning,
  DEFAULT_DECODE_TUNING,
  envDecodeTuning,
} from "./webgpu_decode_tuning.ts";

/** Head sizes compiled and tested. */
export const DECODE_HEAD_SIZES = [64, 80, 96, 112, 128, 192, 256];

/** Kernel block sizes of the split-KV kernels, as declared (vLLM: each admits its multiples). */
export const DECODE_BLOCK_SIZES = [16, 32, 64];
const NAME = "WEBGPU_DECODE";

function requireGpu(ctx: BackendContext): GpuContext {
  if (!ctx.gpu || ctx.gpu.lost) {
    throw new DeviceUnavailableError(`${NAME} needs a live WebGPU device`);
  }
  return ctx.gpu;
}

/** Builds the backend with `tuning` (the registry uses {@link WEBGPU_DECODE}). */
export function makeWebGpuDecode(
  tuning: DecodeTuning = { ...DEFAULT_DECODE_TUNING },
): AttentionBackend<GpuPlan> {
  async function plan(s: BatchShape, bctx: BackendContext): Promise<GpuPlan> {
    const ctx = requireGpu(bctx);
    return await buildGpuPlan(ctx, s, async (table): Promise<AttentionCalls> => {
      const d = await planDecodeRows(ctx, tuning, s, () => true, table);
      if (!d) return { calls: [], scratch: {}, kernels: [] };
      return {
        calls: d.calls,
        scratch: { part: d.part_bytes },
        kernels: [d.key],
        info: {
          decode_rows: d.rows,
          decode_items: d.items,
          split_keys: d.split_keys,
          decode_split_rows: d.split_rows,
          decode_epilogue: d.epilogue,
          decode_table_entries: d.table_entries,
          decode_staged_kv: d.staged_kv,
          ...d.geometry,
        },
      };
    });
  }

  return {
    name: NAME,
    priority: 20,
    description: "Flash decoding (split-KV) WGSL kernels: every query token is a decode row " +
      "(any batch; fastest for decode and short queries); subgroup sums when granted.",
    capabilities: capabilities({
      dtypes: ["float32", "float16", "bfloat16"],
      kv_cache_dtypes: ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"],
      block_sizes: [...DECODE_BLOCK_SIZES],
      head_sizes: [...DECODE_HEAD_SIZES],
      kv_cache_layouts: ["NHD", "HND"],
      attn_types: ["decoder", "encoder_decoder"],
      sinks: true,
      sliding_window: true,
      alibi: true,
      logits_soft_cap: true,
      non_causal: true,
      lse: true,
      reorder_batch_threshold: 1,
    }),
    requires: { needs_device: true, features: [], limits: {} },
    cache_storage: "webgpu",
    createCache: (spec, ctx) => GpuKvCache.create(requireGpu(ctx), spec),
    importCache: (spec, key, value, ctx) => GpuKvCache.fromBytes(requireGpu(ctx), spec, key, value),
    plan,
    run: (p, batch, ctx, opts) => runGpuPlan(p, batch, ctx.gpu, opts),
    disposePlan: disposeGpuPlan,
  };
}

/** The registered WEBGPU_DECODE backend (default tuning, see {@link envDecodeTuning}). */
export const WEBGPU_DECODE: AttentionBackend<GpuPlan> = makeWebGpuDecode(envDecodeTuning());
