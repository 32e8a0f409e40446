/**
 * Comparing outputs that may hold NaN or infinities with CPU_REFERENCE's (the NaN/Inf tests:
 * tests/backends/nan_read_slot_test.ts, decode_masked_keys_test.ts): a batch whose tensors or
 * cache bytes hold planted values, run through a backend ({@link Runner}) and the reference.
 * @module
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import type { ForwardResult } from "../../core/backend_types.ts";
import { toFloat32 } from "../../core/data.ts";
import type { AttentionBackend, GpuContext, ValidBatch } from "../../core/types.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, cacheIndex, type GeneratedBatch } from "./batches.ts";
import { tolerance } from "./backend_check.ts";
import { GPU } from "../gpu/helpers.ts";

/** How one check runs the batch: on which device, and through what. */
export interface Runner {
  ctx: GpuContext;
  run(batch: ValidBatch): Promise<ForwardResult>;
  tol: { atol: number; rtol: number };
  lseTol: { atol: number; rtol: number };
}

/** `backend` planned and run on the suite's device. */
export function backendRunner(backend: AttentionBackend, spec: BatchSpec): Runner {
  return {
    ctx: GPU!,
    run: async (batch) => {
      const plan = await backend.plan(batch, { gpu: GPU });
      try {
        return await backend.run(plan, batch, { gpu: GPU });
      } finally {
        backend.disposePlan?.(plan);
      }
    },
    tol: tolerance(spec),
    lseTol: { atol: 2e-4, rtol: 1e-5 },
  };
}

/**
 * Runs `g` (caches from its bytes) through `runner` and CPU_REFERENCE and compares the output
 * (and LSE where asked) with {@link assertSameNonFinite}; the count of the reference's
 * non-finite outputs, and of all.
 */
export async function checkNonFinite(
  g: GeneratedBatch,
  runner: Runner,
  label: string,
): Promise<{ odd: number; total: number }> {
  const cs = g.cache_spec!;
  const ref = HostKvCache.fromBytes(cs, g.key_cache, g.value_cache);
  const cache = await GpuKvCache.fromBytes(runner.ctx, cs, g.key_cache, g.value_cache);
  try {
    const want = await CPU_REFERENCE.run({}, validHostBatch(g.batch, ref), { gpu: null });
    const got = await runner.run(validHostBatch(g.batch, cache));
    const wantOut = toFloat32(want.output);
    const odd = assertSameNonFinite(
      toFloat32(got.output),
      wantOut,
      runner.tol,
      `output (${label})`,
    );
    if (g.spec.return_lse) {
      assertSameNonFinite(got.lse!, want.lse!, runner.lseTol, `lse (${label})`);
    }
    return { odd, total: wantOut.length };
  } finally {
    cache.destroy();
  }
}

/**
 * Element-wise: NaN where the reference has NaN, the same infinity where it has one, within
 * tolerance elsewhere; the count of the reference's non-finite elements.
 */
export function assertSameNonFinite(
  got: Float32Array,
  want: Float32Array,
  tol: { atol: number; rtol: number },
  label: string,
): number {
  assert.equal(got.length, want.length, label);
  let odd = 0;
  for (let i = 0; i < got.length; i++) {
    if (Number.isNaN(want[i])) {
      odd++;
      assert.ok(Number.isNaN(got[i]), `${label}: element ${i} is ${got[i]}, float64 gives NaN`);
      continue;
    }
    if (!Number.isFinite(want[i])) {
      odd++;
      assert.equal(
        got[i],
        want[i],
        `${label}: element ${i} is ${got[i]}, float64 gives ${want[i]}`,
      );
      continue;
    }
    const err = Math.abs(got[i] - want[i]);
    assert.ok(
      err <= tol.atol + tol.rtol * Math.abs(want[i]),
      `${label}: element ${i} is ${got[i]}, want ${want[i]}`,
    );
  }
  return odd;
}

/**
 * f32 data over an f16 cache (a planted 1e5 overflows to Inf when written), prefill chunks (one
 * with context), GQA 2, head 64, LSE: the masked-keys and masked-values tests' overflow batch.
 */
export const OVERFLOW_SPEC: BatchSpec = {
  dtype: "float32",
  kv_cache_dtype: "float16",
  layout: "NHD",
  block_size: 16,
  head_size: 64,
  num_heads: 4,
  num_kv_heads: 2,
  requests: [{ query_len: 12, seq_len: 12 }, { query_len: 9, seq_len: 40 }],
  return_lse: true,
};

/** A window of 3 over context (HND): some rows' first steps and tiles start before their windows. */
export const WINDOWED_SPEC: BatchSpec = {
  dtype: "float16",
  kv_cache_dtype: "float16",
  layout: "HND",
  block_size: 16,
  head_size: 64,
  num_heads: 4,
  num_kv_heads: 2,
  requests: [{ query_len: 4, seq_len: 14 }, { query_len: 1, seq_len: 23 }],
  sliding_window: 3,
  return_lse: true,
};

/**
 * 16-bit `bits` (an f16 cache's element) at request `req`'s cached position `pos`, kv head `h`,
 * element `e`, in each of `caches` (g.key_cache, g.value_cache).
 */
export function plantCacheBits(
  g: GeneratedBatch,
  caches: Uint8Array[],
  [req, pos, h, e]: readonly number[],
  bits: number,
): void {
  const cs = g.cache_spec!, md = g.batch.metadata;
  const maxBlocks = md.block_table.length / md.num_reqs;
  const block = md.block_table[req * maxBlocks + Math.floor(pos / cs.block_size)];
  const at = cacheIndex(
    cs.layout,
    cs.block_size,
    cs.num_kv_heads,
    cs.head_size,
    block,
    pos % 16,
    h,
  );
  for (const bytes of caches) {
    new DataView(bytes.buffer, bytes.byteOffset).setUint16(2 * (at + e), bits, true);
  }
}

/** NaN in K and V at request `req`'s position `pos`, kv head 0, element 3 (f16 caches). */
export const plantCacheNaN = (g: GeneratedBatch, req: number, pos: number): void =>
  plantCacheBits(g, [g.key_cache, g.value_cache], [req, pos, 0, 3], 0x7e00);
