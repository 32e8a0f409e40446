/**
 * One check of the subgroup-matrix kernel against CPU_REFERENCE: a fresh random batch from
 * {@link BatchSpec}, the reference run on a host cache (which writes the new K/V), the
 * written cache bytes imported into a GPU cache (optionally spread over several chunks),
 * the query as raw data-dtype bits, one launch, and the output (and LSE) compared at the
 * stated tolerances. Options plant out-of-f16-range cache values, or run an f32 cache with
 * the query rounded to f16.
 * @module
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu_reference.ts";
import { decode, encode, roundArray } from "../../core/dtype.ts";
import { HostKvCache } from "../../core/host_cache.ts";
import type { ForwardBatch, ForwardResult, KvCache } from "../../core/types.ts";
import type { MmaShape } from "../../gpu/flash_mma_codegen.ts";
import type { MmaContext } from "../../gpu/flash_mma_device.ts";
import { type MmaBatch, runFlashMma } from "../../gpu/flash_mma_launch.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { type BatchSpec, cacheIndex, generateBatch } from "./batches.ts";
import { assertClose, firstNonFinite } from "./compare.ts";

/** Options of {@link checkMma}. */
export interface MmaCaseOptions {
  shape: MmaShape;
  maxBlocksPerChunk?: number;
  /** Plant this value (and its negation) in a few visible K and V cache elements. */
  plant?: number;
}

/** Tolerances of the f16 path: f16/bf16 data, fp8 caches looser. */
export function mmaTolerance(s: BatchSpec): { atol: number; rtol: number } {
  const fp8 = s.kv_cache_dtype === "fp8_e4m3" || s.kv_cache_dtype === "fp8_e5m2";
  return fp8 ? { atol: 6e-2, rtol: 1e-1 } : { atol: 1e-2, rtol: 1e-2 };
}

const bits = (dtype: "float16" | "bfloat16", x: Float32Array) => {
  const b = encode(dtype, x);
  return new Uint16Array(b.buffer, b.byteOffset, b.byteLength / 2);
};

/** Sets three visible context elements of request 0 (kv head 0) in K and V to +-v0. */
function plantValues(s: BatchSpec, k: Float32Array, v: Float32Array, bt: Int32Array, v0: number) {
  const r = s.requests[0], ctxLen = Math.max(1, r.seq_len - r.query_len);
  for (let j = 0; j < 3; j++) {
    const pos = (5 * j) % ctxLen, o = pos % s.block_size;
    const block = bt[Math.floor(pos / s.block_size)];
    const at = cacheIndex(s.layout, s.block_size, s.num_kv_heads, s.head_size, block, o, 0);
    k[at + j] = j % 2 ? -v0 : v0;
    v[at + 2 * j] = j % 2 ? v0 : -v0;
  }
}

/** Runs one case; throws (an AssertionError naming the seed) on a mismatch. */
export async function checkMma(
  ctx: MmaContext,
  s: BatchSpec,
  seed: number,
  o: MmaCaseOptions,
): Promise<void> {
  const g = generateBatch(s, seed);
  const tag = `seed ${seed}`;
  const f32Cache = s.dtype === "float32";
  const dtype = f32Cache ? "float16" : s.dtype as "float16" | "bfloat16";
  const batch: Omit<ForwardBatch, "cache"> = { ...g.batch };
  if (f32Cache) batch.query = roundArray("float16", batch.query); // f32 data: not this path
  let gpu: GpuKvCache | null = null;
  let want: ForwardResult;
  const reference = (b: Omit<ForwardBatch, "cache">, cache: KvCache | null) =>
    CPU_REFERENCE.run(
      CPU_REFERENCE.plan({ ...b, cache }, { gpu: null }) as never,
      { ...b, cache },
      { gpu: null },
    );
  if (g.cache_spec) {
    // The reference writes the new K/V; the kernel reads the written cache.
    const host = HostKvCache.fromBytes(g.cache_spec, g.key_cache, g.value_cache);
    want = await reference(batch, host);
    let { key, value } = await host.read();
    if (o.plant !== undefined) {
      // The kernel reads the planted values in the cache's dtype; the reference (f32 cache,
      // nothing written) their clamp to f16's range.
      const st = g.storage!;
      const kv = decode(st, key), vv = decode(st, value);
      plantValues(s, kv, vv, batch.metadata.block_table, o.plant);
      [key, value] = [encode(st, kv), encode(st, vv)];
      const clamped = (x: Float32Array) =>
        encode(
          "float32",
          decode(st, encode(st, x)).map((y) => Math.max(-65504, Math.min(65504, y))),
        );
      const spec = { ...g.cache_spec, dtype: "float32" as const, kv_cache_dtype: "auto" as const };
      const md = { ...batch.metadata, slot_mapping: batch.metadata.slot_mapping.map(() => -1) };
      want = await reference(
        { ...batch, dtype: "float32", metadata: md },
        HostKvCache.fromBytes(spec, clamped(kv), clamped(vv)),
      );
    }
    gpu = await GpuKvCache.fromBytes(ctx, g.cache_spec, key, value, {
      maxBlocksPerChunk: o.maxBlocksPerChunk,
    });
  } else want = await reference(batch, null);
  try {
    const mb: MmaBatch = {
      dtype,
      layer: batch.layer,
      num_tokens: batch.num_tokens,
      query: bits(dtype, batch.query),
      key: gpu ? null : bits(dtype, batch.key!),
      value: gpu ? null : bits(dtype, batch.value!),
      metadata: batch.metadata,
      return_lse: true,
    };
    const got = await runFlashMma(ctx, mb, gpu, o.shape);
    const out = decode(
      dtype,
      new Uint8Array(got.output.buffer, got.output.byteOffset, got.output.byteLength),
    );
    assert.equal(firstNonFinite(out), -1, `output has a non-finite element (${tag})`);
    assertClose(out, want.output, {
      ...mmaTolerance(s),
      shape: g.output_shape,
      label: `output (${tag})`,
    });
    assertClose(got.lse, want.lse!, { atol: 1e-3, rtol: 1e-4, label: `lse (${tag})` });
  } finally {
    gpu?.destroy();
  }
}
