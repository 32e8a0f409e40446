/**
 * Query, key and value that a request carried back to back in one body go up in one write and
 * are bound as ranges of one buffer (gpu/plan_bind.ts `packedInputs`). Which layouts qualify,
 * and that packed calls compute what calls with three separate tensors compute: output within
 * tolerance of CPU_REFERENCE and the reference's cache bytes afterwards, on fresh data each call,
 * with packed and separate calls interleaved on one plan (the bound calls and bind groups it
 * reuses must follow the buffers).
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { WEBGPU_DECODE } from "../../backends/webgpu_decode.ts";
import { WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import { dataArray, toFloat32 } from "../../core/data.ts";
import type { AttentionBackend, DataArray, ValidBatch } from "../../core/types.ts";
import { bindGpuPlan, type GpuPlan } from "../../gpu/gpu_plan.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { packedInputs } from "../../gpu/plan_bind.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { generateBatch, smallSpec } from "../support/batches.ts";
import { assertClose, assertSameBytes } from "../support/compare.ts";
import { tolerance } from "../support/backend_check.ts";
import { freshSeed, GPU, GPU_TEST, randomArray, rng } from "./helpers.ts";

/** Tensors of `sizes` bytes (null: absent) at byte offsets `at`, as a batch's q/k/v. */
function laidOut(sizes: (number | null)[], at: number[], buffers = [0, 0, 0]): ValidBatch {
  const mem = [new ArrayBuffer(8192), new ArrayBuffer(8192)];
  const t = (i: number): DataArray | null =>
    sizes[i] === null
      ? null
      : dataArray("float16", new Uint8Array(mem[buffers[i]], at[i], sizes[i]));
  return { query: t(0)!, key: t(1), value: t(2) } as unknown as ValidBatch;
}

Deno.test("packedInputs: which layouts go up in one write", () => {
  const packed = (b: ValidBatch, max = 2 ** 28) => packedInputs(b, 256, max);
  const got = packed(laidOut([512, 256, 256], [0, 512, 768]));
  assert.deepEqual(got?.at, [
    { name: "query", offset: 0, bytes: 512 },
    { name: "key", offset: 512, bytes: 256 },
    { name: "value", offset: 768, bytes: 256 },
  ]);
  assert.equal(got?.span.byteLength, 1024);
  // Offsets are relative to the query; gaps under the alignment are spanned.
  const gap = packed(laidOut([136, 200, 8], [64, 320, 576]));
  assert.deepEqual(gap?.at.map((x) => x.offset), [0, 256, 512]);
  assert.equal(gap?.span.byteOffset, 64);
  assert.equal(gap?.span.byteLength, 520);
  // No key and value: nothing to pack with. Key alone beside the query: packed.
  assert.equal(packed(laidOut([512, null, null], [0, 0, 0])), null);
  assert.deepEqual(packed(laidOut([512, 256, null], [0, 512, 0]))?.at.length, 2);
  for (
    const [why, b] of [
      ["a misaligned key", laidOut([512, 256, 256], [0, 520, 1024])],
      ["a gap of the alignment", laidOut([512, 256, 256], [0, 768, 1024])],
      ["out of order", laidOut([512, 256, 256], [1024, 0, 256])],
      ["overlapping", laidOut([512, 256, 256], [0, 256, 768])],
      ["another buffer", laidOut([512, 256, 256], [0, 512, 768], [0, 1, 0])],
      ["a tensor of odd half-words", laidOut([512, 254, 256], [0, 512, 768])],
      ["an empty key", laidOut([512, 0, 256], [0, 512, 512])],
    ] as const
  ) assert.equal(packed(b), null, why);
  // The pooled buffer the span needs (1024 B, a power of two) must fit one buffer.
  assert.equal(packed(laidOut([512, 256, 256], [0, 512, 768]), 512), null);
});

/** `b` with its query/key/value copied back to back into one buffer, as a body carries them. */
function backToBack(b: ValidBatch): ValidBatch {
  const parts = [b.query, b.key, b.value];
  const mem = new Uint8Array(parts.reduce((n, p) => n + (p?.bytes.byteLength ?? 0), 0));
  let at = 0;
  const put = (p: DataArray | null) => {
    if (!p) return null;
    mem.set(p.bytes, at);
    at += p.bytes.byteLength;
    return dataArray(p.dtype, mem.subarray(at - p.bytes.byteLength, at));
  };
  return { ...b, query: put(b.query)!, key: put(b.key), value: put(b.value) };
}

const SPECS = [
  smallSpec({
    head_size: 128,
    num_heads: 8,
    num_kv_heads: 2,
    requests: [{ query_len: 1, seq_len: 40 }, { query_len: 1, seq_len: 23 }],
  }),
  smallSpec({
    head_size: 128,
    num_heads: 8,
    num_kv_heads: 2,
    requests: [{ query_len: 6, seq_len: 30 }, { query_len: 1, seq_len: 17 }],
  }),
];

Deno.test(
  "packed inputs: one write, the same answer and cache as separate ones",
  GPU_TEST,
  async () => {
    for (const spec of SPECS) {
      const seed = freshSeed();
      const g = generateBatch(spec, seed);
      const backends = spec.requests.every((r) => r.query_len === 1)
        ? [WEBGPU_FLASH, WEBGPU_DECODE]
        : [WEBGPU_FLASH];
      for (const be of backends as AttentionBackend<GpuPlan>[]) {
        const gpuCache = await GpuKvCache.fromBytes(
          GPU!,
          g.cache_spec!,
          g.key_cache,
          g.value_cache,
        );
        const hostCache = HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache);
        try {
          let plan: GpuPlan | null = null;
          for (const [i, pack] of [true, false, true, false].entries()) {
            const r = rng(seed + 10 * i), b = g.batch;
            const data = {
              ...b,
              query: randomArray(r, b.query.length),
              key: randomArray(r, b.key!.length),
              value: randomArray(r, b.value!.length),
            };
            const want = await CPU_REFERENCE.run({}, validHostBatch(data, hostCache), {
              gpu: null,
            });
            const separate = validHostBatch(data, gpuCache);
            const batch = pack ? backToBack(separate) : separate;
            const what = `${be.name}, ${pack ? "packed" : "separate"}, call ${i}, seed ${seed}`;
            plan ??= await be.plan(batch, { gpu: GPU! });
            const bound = bindGpuPlan(plan, batch, GPU!);
            const inputWrites = bound.uploads.filter((u) => u.data !== plan!.table).length;
            bound.release();
            assert.equal(inputWrites, pack ? 1 : 3, `${what}: writes of the inputs`);
            const got = await be.run(plan, batch, { gpu: GPU! });
            assertClose(toFloat32(got.output), toFloat32(want.output), {
              ...tolerance(spec),
              label: `output (${what})`,
            });
            got.release?.();
            const [x, y] = await Promise.all([gpuCache.read(), hostCache.read()]);
            assertSameBytes(x.key, y.key, `key cache (${what})`);
            assertSameBytes(x.value, y.value, `value cache (${what})`);
          }
        } finally {
          gpuCache.destroy();
        }
      }
    }
  },
);
