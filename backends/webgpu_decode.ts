/**
 * WEBGPU_DECODE: flash decoding (split-KV) for decode batches (one query per request).
 * Each request's visible keys are cut into slices; one workgroup per (slice, kv head) reads
 * every K/V byte of its slice once for all query heads of the GQA group (coalesced
 * vec4<u32> loads, f32 online softmax, no barrier per key; wgsl/decode_split.wgsl), and a
 * reduce pass merges the slices by their max and sum and adds the sink
 * (wgsl/decode_reduce.wgsl). `plan` (planDecode, webgpu_decode_plan.ts) validates the batch,
 * picks the slice length from the context lengths and a target workgroup count, compiles
 * (cached) pipelines and builds the uniforms; `run` writes the new K/V (gpu/cache_write.ts),
 * dispatches both passes in one submission and reads output + LSE back through one staging
 * buffer. Needs `shader-f16` (half and e5m2 caches decode through `bitcast<vec2<f16>>`);
 * uses subgroup shuffles when `subgroups` was granted, else a workgroup-memory reduction.
 * @module
 */
import { roundArray } from "../core/dtype.ts";
import { DeviceUnavailableError } from "../core/errors.ts";
import type {
  AttentionBackend,
  BackendContext,
  ForwardBatch,
  ForwardResult,
  SelectorConfig,
} from "../core/types.ts";
import { capabilities } from "./capabilities_base.ts";
import { BatchBuffers } from "../gpu/batch_buffers.ts";
import { callTimings, PassTimer } from "../gpu/timer.ts";
import { encodeCacheWrite } from "../gpu/cache_write.ts";
import { GpuKvCache } from "../gpu/kv_cache.ts";
import {
  DECODE_HEAD_SIZES,
  DECODE_NAME as NAME,
  type DecodePlan,
  planDecode,
} from "./webgpu_decode_plan.ts";
import {
  type DecodeTuning,
  DEFAULT_DECODE_TUNING,
  envDecodeTuning,
} from "./webgpu_decode_tuning.ts";

export { DECODE_HEAD_SIZES, type DecodePlan } from "./webgpu_decode_plan.ts";
export {
  type DecodeTuning,
  DEFAULT_DECODE_TUNING,
  envDecodeTuning,
} from "./webgpu_decode_tuning.ts";

/** Builds the backend with `tuning` (the registry uses {@link WEBGPU_DECODE}). */
export function makeWebGpuDecode(
  tuning: DecodeTuning = { ...DEFAULT_DECODE_TUNING },
): AttentionBackend<DecodePlan> {
  const plan = (batch: ForwardBatch, bctx: BackendContext): Promise<DecodePlan> =>
    planDecode(tuning, batch, bctx);

  async function run(
    p: DecodePlan,
    batch: ForwardBatch,
    bctx: BackendContext,
  ): Promise<ForwardResult> {
    const gpu = bctx.gpu ?? p.gpu;
    if (gpu.lost || gpu.device !== p.gpu.device) {
      throw new DeviceUnavailableError("the WebGPU device was lost");
    }
    p.cache.assertUsable(gpu);
    const t0 = performance.now();
    const T = batch.num_tokens, L = batch.layer, H = L.num_heads, D = L.head_size;
    const dev = gpu.device, bufs = new BatchBuffers(gpu, "decode");
    const timer = batch.num_tokens > 0 ? PassTimer.create(gpu) : null;
    try {
      const enc = dev.createCommandEncoder({ label: "decode" });
      const fp8 = p.cache.geometry.storage_dtype.startsWith("fp8");
      if (batch.key && batch.value && batch.metadata.slot_mapping.length > 0) {
        await encodeCacheWrite(gpu, enc, p.cache, {
          key: batch.key,
          value: batch.value,
          slot_mapping: batch.metadata.slot_mapping,
          k_scale: fp8 ? L.k_scale : 1,
          v_scale: fp8 ? L.v_scale : 1,
        }, bufs);
      }
      const tw = performance.now();
      const uni = bufs.uniform(p.params, "params");
      const meta = bufs.storage(p.meta, "meta");
      const result = bufs.poisoned(T * H * D + H * T, "result");
      if (T > 0) {
        const part = bufs.scratch(p.partBytes, "part");
        const q = bufs.storage(p.q16 ? new Float16Array(batch.query) : batch.query, "q");
        const pass = enc.beginComputePass({
          label: "decode",
          ...(timer ? { timestampWrites: timer.writes(0) } : {}),
        });
        pass.setPipeline(p.split);
        pass.setBindGroup(
          0,
          dev.createBindGroup({
            layout: p.split.getBindGroupLayout(0),
            entries: [
              { binding: 0, resource: { buffer: uni } },
              { binding: 1, resource: { buffer: q } },
              { binding: 2, resource: { buffer: meta } },
              { binding: 3, resource: { buffer: part } },
              ...p.cache.bindEntries(4),
            ],
          }),
        );
        if (p.num_items > 0) pass.dispatchWorkgroups(p.splitGrid[0], p.splitGrid[1]);
        pass.setPipeline(p.reduce);
        pass.setBindGroup(
          0,
          dev.createBindGroup({
            layout: p.reduce.getBindGroupLayout(0),
            entries: [
              { binding: 0, resource: { buffer: uni } },
              { binding: 1, resource: { buffer: meta } },
              { binding: 2, resource: { buffer: part } },
              { binding: 3, resource: { buffer: result } },
            ],
          }),
        );
        pass.dispatchWorkgroups(p.reduceGrid[0], p.reduceGrid[1]);
        pass.end();
      }
      const parts = [{ buffer: result, floats: T * H * D + (batch.return_lse ? H * T : 0) }];
      if (timer) parts.push(timer.resolve(enc, bufs));
      const read = bufs.readback(enc, parts);
      const tf = performance.now();
      const cmd = enc.finish();
      const te = performance.now();
      dev.queue.submit([cmd]);
      const t1 = performance.now();
      const [all, stamps] = await read();
      const gpuAttend = timer && stamps ? timer.ms(stamps, 0) : null;
      const t2 = performance.now();
      const output = roundArray(batch.dtype, all.subarray(0, T * H * D));
      const lse = batch.return_lse ? all.slice(T * H * D, T * H * D + H * T) : null;
      return {
        output: output.length === all.length ? output : output.slice(),
        lse,
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

  return {
    name: NAME,
    priority: 10,
    description: "Flash decoding (split-KV) WGSL kernels for single-token decode steps; " +
      "needs shader-f16, uses subgroups when granted.",
    capabilities: capabilities({
      dtypes: ["float32", "float16", "bfloat16"],
      kv_cache_dtypes: ["auto", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"],
      block_sizes: [16, 32, 64],
      head_sizes: [...DECODE_HEAD_SIZES],
      kv_cache_layouts: ["NHD", "HND"],
      attn_types: ["decoder", "encoder_decoder"],
      sinks: true,
      sliding_window: true,
      alibi: true,
      logits_soft_cap: true,
      // With one query at position seq_len - 1 every key is at or before it: non-causal
      // decode sees exactly the causal keys.
      non_causal: true,
      lse: true,
      reorder_batch_threshold: 1,
    }),
    requires: { needs_device: true, features: ["shader-f16"], limits: {} },
    cache_storage: "webgpu",
    supportsCombination(cfg: SelectorConfig): string | null {
      const q = cfg.max_query_len;
      return q !== undefined && q > 1
        ? `query length ${q} > 1 not supported (decode-only backend)`
        : null;
    },
    createCache(spec, ctx) {
      if (!ctx.gpu) throw new DeviceUnavailableError(`${NAME} needs a WebGPU device`);
      return GpuKvCache.create(ctx.gpu, spec);
    },
    importCache(spec, key, value, ctx) {
      if (!ctx.gpu) throw new DeviceUnavailableError(`${NAME} needs a WebGPU device`);
      return GpuKvCache.fromBytes(ctx.gpu, spec, key, value);
    },
    plan,
    run,
  };
}

/** The registered WEBGPU_DECODE backend (default tuning, see {@link envDecodeTuning}). */
export const WEBGPU_DECODE: AttentionBackend<DecodePlan> = makeWebGpuDecode(envDecodeTuning());
