/**
 * A NaN stored in a cache slot a call reads (imported bytes: `PUT .../data`, inline caches) comes
 * out as NaN, as CPU_REFERENCE and float64 give it, in the heads that see the slot, and nowhere
 * else. Before the fix the GPU kernels' last step took a NaN softmax denominator for "no key
 * visible" and answered 0 (LSE -inf): a plausible number for corrupt data. Through WEBGPU_DECODE
 * (one pass and split rows) and WEBGPU_FLASH (decode and prefill rows, the split-KV kernels and the
 * portable tiles), a NaN in K or in V, over f16, bf16, f32 and fp8 e4m3 caches, NHD and HND, with
 * a soft cap too (its clamp() made a NaN +-15).
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { DEFAULT_DECODE_TUNING, makeWebGpuDecode } from "../../backends/webgpu_decode.ts";
import { makeWebGpuFlash, WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import { toFloat32 } from "../../core/data.ts";
import { resolveStorage } from "../../core/dtype.ts";
import type { AttentionBackend, StorageDType } from "../../core/types.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, cacheIndex, generateBatch, smallSpec } from "../support/batches.ts";
import { tolerance } from "../support/backend_check.ts";
import { freshSeed, GPU, NO_GPU } from "../gpu/helpers.ts";

/** Writes a NaN of `storage` over element `i` of a cache's bytes. */
function poison(bytes: Uint8Array, storage: StorageDType, i: number): void {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (storage === "float32") dv.setFloat32(4 * i, NaN, true);
  else if (storage === "float16") dv.setUint16(2 * i, 0x7e00, true);
  else if (storage === "bfloat16") dv.setUint16(2 * i, 0x7fc0, true);
  else bytes[i] = 0x7f; // fp8 e4m3's NaN (e5m2: an f16's high byte, also NaN)
}

/** Element-wise: NaN where the reference has NaN, within tolerance elsewhere. */
function assertSameNaNs(
  got: Float32Array,
  want: Float32Array,
  tol: { atol: number; rtol: number },
  label: string,
): number {
  assert.equal(got.length, want.length, label);
  let nans = 0;
  for (let i = 0; i < got.length; i++) {
    if (Number.isNaN(want[i])) {
      nans++;
      assert.ok(Number.isNaN(got[i]), `${label}: element ${i} is ${got[i]}, float64 gives NaN`);
      continue;
    }
    const err = Math.abs(got[i] - want[i]);
    assert.ok(
      err <= tol.atol + tol.rtol * Math.abs(want[i]),
      `${label}: element ${i} is ${got[i]}, want ${want[i]}`,
    );
  }
  return nans;
}

const SPLIT = { target_workgroups: 4096, min_split_keys: 16 };
const DECODE = makeWebGpuDecode(DEFAULT_DECODE_TUNING) as AttentionBackend;
const DECODE_SPLIT = makeWebGpuDecode({ ...DEFAULT_DECODE_TUNING, ...SPLIT }) as AttentionBackend;
/** The portable tile kernel for prefill rows (not the split-KV kernels software adapters use). */
const FLASH_TILES = makeWebGpuFlash({
  tile: null,
  decode: { ...DEFAULT_DECODE_TUNING },
  mma: false,
  prefill_split: false,
}) as AttentionBackend;
const DECODE_ROWS = [{ query_len: 1, seq_len: 70 }, { query_len: 1, seq_len: 33 }];

const CASES: [string, AttentionBackend, BatchSpec][] = [
  ["WEBGPU_DECODE, f16 NHD", DECODE, smallSpec({ requests: DECODE_ROWS })],
  [
    "WEBGPU_DECODE split, bf16 HND, sinks",
    DECODE_SPLIT,
    smallSpec({
      dtype: "bfloat16",
      kv_cache_dtype: "bfloat16",
      layout: "HND",
      sinks: true,
      requests: DECODE_ROWS,
    }),
  ],
  [
    "WEBGPU_DECODE split, fp8 e4m3, soft cap",
    DECODE_SPLIT,
    smallSpec({
      kv_cache_dtype: "fp8_e4m3",
      logits_soft_cap: 5,
      requests: DECODE_ROWS,
    }),
  ],
  [
    "WEBGPU_FLASH, f32 decode and prefill rows",
    WEBGPU_FLASH,
    smallSpec({
      dtype: "float32",
      requests: [{ query_len: 1, seq_len: 40 }, { query_len: 6, seq_len: 30 }],
    }),
  ],
  [
    "WEBGPU_FLASH, f16 prefill rows, ALiBi",
    WEBGPU_FLASH,
    smallSpec({
      alibi: true,
      requests: [{ query_len: 9, seq_len: 20 }, { query_len: 4, seq_len: 4 }],
    }),
  ],
  [
    "WEBGPU_FLASH, f16 prefill rows, soft cap",
    WEBGPU_FLASH,
    smallSpec({
      logits_soft_cap: 4,
      requests: [{ query_len: 9, seq_len: 20 }, { query_len: 4, seq_len: 4 }],
    }),
  ],
  [
    "WEBGPU_FLASH tile kernel, f32 prefill rows, soft cap, sinks",
    FLASH_TILES,
    smallSpec({
      dtype: "float32",
      logits_soft_cap: 4,
      sinks: true,
      requests: [{ query_len: 9, seq_len: 20 }, { query_len: 4, seq_len: 4 }],
    }),
  ],
];

for (const [name, backend, spec] of CASES) {
  for (const which of ["key", "value"] as const) {
    Deno.test(`NaN in a read ${which} slot comes out NaN: ${name}`, {
      ignore: NO_GPU,
    }, async () => {
      const seed = freshSeed();
      const g = generateBatch(spec, seed);
      const cs = g.cache_spec!;
      const storage = resolveStorage(cs.kv_cache_dtype, cs.dtype);
      // Request 0's first context position (every query of it sees position 0), kv head 0.
      const md = g.batch.metadata;
      const maxBlocks = md.block_table.length / md.num_reqs;
      const block = md.block_table[0 * maxBlocks];
      const at = cacheIndex(cs.layout, cs.block_size, cs.num_kv_heads, cs.head_size, block, 0, 0);
      assert.ok(!g.written_slots.includes(block * cs.block_size), "a slot the call only reads");
      poison(which === "key" ? g.key_cache : g.value_cache, storage, at + 3);
      const ref = HostKvCache.fromBytes(cs, g.key_cache, g.value_cache);
      const cache = await GpuKvCache.fromBytes(GPU!, cs, g.key_cache, g.value_cache);
      try {
        const want = await CPU_REFERENCE.run({}, validHostBatch(g.batch, ref), { gpu: null });
        const batch = validHostBatch(g.batch, cache);
        const plan = await backend.plan(batch, { gpu: GPU });
        let got;
        try {
          got = await backend.run(plan, batch, { gpu: GPU });
        } finally {
          backend.disposePlan?.(plan);
        }
        const label = `${name}, NaN in ${which}, seed ${seed}`;
        const nans = assertSameNaNs(
          toFloat32(got.output),
          toFloat32(want.output),
          tolerance(spec),
          `output (${label})`,
        );
        assert.ok(nans > 0, `the reference has NaN outputs (${label})`);
        assert.ok(nans < toFloat32(want.output).length, `and finite ones (${label})`);
        if (spec.return_lse) {
          assertSameNaNs(got.lse!, want.lse!, { atol: 2e-4, rtol: 1e-5 }, `lse (${label})`);
        }
      } finally {
        cache.destroy();
      }
    });
  }
}
