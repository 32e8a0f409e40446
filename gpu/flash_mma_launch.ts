/**
 * Standalone launcher of the subgroup-matrix prefill kernel (wgsl/flash_mma.wgsl) for tests
 * and the bench: the tile table and metadata (the layout of flash_attention.wgsl's: tiles of
 * 4 words, per-request words, block table, ALiBi slopes, sinks), the uniform, the buffers
 * (query uploaded as raw data-dtype bits, outputs poisoned with NaN), one dispatch, one
 * readback. K/V come from a {@link GpuKvCache} (new K/V already written), or from the call
 * for encoder types. The host side proper (validation, plan caching, cache write) is the
 * forward path's; this module only drives the kernel.
 * @module
 */
import type { BatchMetadata, LayerSpec } from "../core/types.ts";
import { BatchBuffers, dispatchSize, UniformBuilder } from "./batch_buffers.ts";
import type { MmaContext } from "./flash_mma_device.ts";
import {
  flashMmaKey,
  flashMmaWgsl,
  type MmaKernelSpec,
  mmaLayout,
  type MmaShape,
  mmaShapeProblem,
} from "./flash_mma_codegen.ts";
import type { GpuKvCache } from "./kv_cache.ts";
import { getComputePipeline } from "./pipelines.ts";

/** What the kernel reads of a forward call: tensors as raw data-dtype bits. */
export interface MmaBatch {
  dtype: "float16" | "bfloat16";
  layer: LayerSpec;
  num_tokens: number;
  /** [num_tokens, num_heads, head_size] f16 or bf16 bits. */
  query: Uint16Array;
  /** Encoder types only: [num_tokens, num_kv_heads, head_size] bits (else null). */
  key: Uint16Array | null;
  value: Uint16Array | null;
  metadata: BatchMetadata;
  return_lse: boolean;
}

/** A prepared launch: buffers uploaded, pipeline compiled. */
export interface MmaLaunch {
  ctx: MmaContext;
  key: string;
  pipeline: GPUComputePipeline;
  bindGroup: GPUBindGroup;
  nwg: [number, number];
  workgroups: number;
  out: GPUBuffer;
  lse: GPUBuffer;
  bufs: BatchBuffers;
  outWords: number;
  lseFloats: number;
}

/** f16 NaN in both halves (also a bf16 NaN): the output poison. */
export const OUT_POISON = 0x7fc07fc0;

const isEncoder = (l: LayerSpec) => l.attn_type === "encoder" || l.attn_type === "encoder_only";

/** Tiles of up to `rows` (token, q head) rows of one GQA group, longest first, and metadata. */
export function buildMmaMeta(b: MmaBatch, rows: number) {
  const L = b.layer, md = b.metadata, G = L.num_heads / L.num_kv_heads;
  const enc = isEncoder(L);
  const tpt = G <= rows ? Math.floor(rows / G) : 1;
  const hchunk = Math.min(G, rows);
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
  tiles.sort((x, y) => y.cost - x.cost);
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

/** The kernel spec of a batch on a context (cache null: K/V from the call). */
export function mmaSpecOf(ctx: MmaContext, b: MmaBatch, cache: GpuKvCache | null): MmaKernelSpec {
  return {
    head_size: b.layer.head_size,
    dtype: b.dtype,
    storage: cache ? cache.geometry.storage_dtype : null,
    layout: cache ? cache.spec.layout : "NHD",
    block_size: cache ? cache.spec.block_size : 16,
    nchunk: cache ? cache.geometry.nchunk : 1,
    subgroup_size: ctx.subgroup_size,
    dims: ctx.mma,
  };
}

/** Uploads the batch, compiles (cached) and binds: ready to encode. */
export async function prepareFlashMma(
  ctx: MmaContext,
  b: MmaBatch,
  cache: GpuKvCache | null,
  shape: MmaShape,
): Promise<MmaLaunch> {
  const L = b.layer, T = b.num_tokens, H = L.num_heads, D = L.head_size;
  if (isEncoder(L) !== (cache === null)) {
    throw new Error(`flash_mma: ${L.attn_type} ${cache ? "takes no" : "needs a"} cache`);
  }
  const spec = mmaSpecOf(ctx, b, cache);
  const problem = mmaShapeProblem(spec, shape, ctx.limits.maxComputeWorkgroupStorageSize);
  if (problem) throw new Error(`flash_mma ${flashMmaKey(spec, shape)}: ${problem}`);
  const key = flashMmaKey(spec, shape);
  const pipeline = await getComputePipeline(ctx, key, await flashMmaWgsl(spec, shape));
  const m = buildMmaMeta(b, mmaLayout(spec, shape).rows);
  const fp8 = spec.storage === "fp8_e4m3" || spec.storage === "fp8_e5m2";
  const workgroups = m.numTiles * L.num_kv_heads;
  const nwg = dispatchSize(ctx, workgroups);
  const params = new UniformBuilder()
    .u32(m.numTiles).u32(H).u32(L.num_kv_heads).u32(H / L.num_kv_heads)
    .u32(T).u32(nwg[0]).u32(m.causal ? 1 : 0).u32(Math.min(m.w, 2 ** 30))
    .f32(L.logits_soft_cap ?? 0).f32(L.scale * (fp8 ? L.k_scale : 1)).f32(fp8 ? L.v_scale : 1)
    .u32((L.alibi_slopes ? 1 : 0) | (L.sinks ? 2 : 0))
    .u32(m.offReqs).u32(m.offBt).u32(m.offAlibi).u32(m.offSinks)
    .u32(cache?.geometry.block_words ?? 0).u32(cache?.geometry.blocks_per_chunk ?? 0).u32(0).u32(0);
  const bufs = new BatchBuffers(ctx, "flash_mma");
  const outWords = (T * H * D) / 2, lseFloats = H * T;
  const out = bufs.storage(new Uint32Array(outWords).fill(OUT_POISON), "out");
  const lse = bufs.poisoned(lseFloats, "lse");
  const entries: GPUBindGroupEntry[] = [
    { binding: 0, resource: { buffer: bufs.uniform(params, "params") } },
    { binding: 1, resource: { buffer: bufs.storage(b.query, "q") } },
    { binding: 2, resource: { buffer: bufs.storage(m.meta, "meta") } },
    { binding: 3, resource: { buffer: out } },
    { binding: 4, resource: { buffer: lse } },
  ];
  if (cache) entries.push(...cache.bindEntries(5));
  else {
    entries.push({ binding: 5, resource: { buffer: bufs.storage(b.key!, "k_in") } });
    entries.push({ binding: 6, resource: { buffer: bufs.storage(b.value!, "v_in") } });
  }
  const bindGroup = ctx.device.createBindGroup({
    label: key,
    layout: pipeline.getBindGroupLayout(0),
    entries,
  });
  return { ctx, key, pipeline, bindGroup, nwg, workgroups, out, lse, bufs, outWords, lseFloats };
}

/** Records the kernel's pass on `encoder` (with optional timestamp writes). */
export function encodeFlashMma(
  l: MmaLaunch,
  encoder: GPUCommandEncoder,
  timestampWrites?: GPUComputePassTimestampWrites,
): void {
  const pass = encoder.beginComputePass({
    label: l.key,
    ...(timestampWrites ? { timestampWrites } : {}),
  });
  pass.setPipeline(l.pipeline);
  pass.setBindGroup(0, l.bindGroup);
  if (l.workgroups > 0) pass.dispatchWorkgroups(l.nwg[0], l.nwg[1]);
  pass.end();
}

/** What one launch returns: output bits and the LSE. */
export interface MmaResult {
  /** [num_tokens, num_heads, head_size] data-dtype bits. */
  output: Uint16Array;
  /** [num_heads, num_tokens]. */
  lse: Float32Array;
}

/** Submits `encoder` with a copy of the outputs and reads them back (one mapAsync). */
export async function submitAndRead(l: MmaLaunch, encoder: GPUCommandEncoder): Promise<MmaResult> {
  const read = l.bufs.readback(encoder, [
    { buffer: l.out, floats: l.outWords },
    { buffer: l.lse, floats: l.lseFloats },
  ]);
  l.ctx.device.queue.submit([encoder.finish()]);
  const [o, s] = await read();
  return { output: new Uint16Array(o.buffer, o.byteOffset, 2 * l.outWords), lse: s };
}

/** Prepares, runs once and reads back; the buffers are destroyed afterwards. */
export async function runFlashMma(
  ctx: MmaContext,
  b: MmaBatch,
  cache: GpuKvCache | null,
  shape: MmaShape,
): Promise<MmaResult> {
  const l = await prepareFlashMma(ctx, b, cache, shape);
  try {
    const enc = ctx.device.createCommandEncoder({ label: l.key });
    encodeFlashMma(l, enc);
    return await submitAndRead(l, enc);
  } finally {
    l.bufs.destroy();
  }
}
