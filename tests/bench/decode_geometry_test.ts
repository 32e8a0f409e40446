/**
 * bench/decode_geometry.ts: the split-KV launch the bench's decode shapes get on an H200-like
 * adapter (the numbers bench/NOTES.md "v0.7 decode" quotes), and `wg_kv_heads`' grid; the
 * default decode shape's half columns on fp8 caches (GPUs only).
 */
import assert from "node:assert/strict";
import { decodeGeometry, H200_LIKE } from "../../bench/decode_geometry.ts";
import { decodeShape } from "../../backends/decode_shape.ts";
import type { GpuContext, KvCacheSpec, LayerSpec, StorageDType } from "../../core/types.ts";
import { benchShapes } from "../../bench/shapes.ts";
import { type DecodeTuning, DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";

const [short, long] = benchShapes(false).filter((s) => s.kind === "decode");
const at = (t: Partial<DecodeTuning>, s = short) =>
  decodeGeometry({ ...DEFAULT_DECODE_TUNING, ...t }, s);

Deno.test("decode geometry: the default at 32 x 2048 and 64 x 8192", () => {
  assert.equal(short.ctx, 2048);
  const a = at({}); // the fused reduce (epilogue 2): no reduce pass
  assert.deepEqual(
    [a.lpk, a.wg, a.u, a.split_keys, a.slices_per_row, a.workgroups, a.steps, a.epilogue],
    [16, 128, 4, 1024, 2, 512, 32, 2],
  );
  assert.deepEqual([a.per_sm_max, a.sms_at_max, a.reduce_workgroups], [4, 116, 0]);
  const r = at({ fused_reduce: false }); // v0.10's default: a reduce pass
  assert.deepEqual([r.split_keys, r.workgroups, r.epilogue, r.reduce_workgroups], [
    1024,
    512,
    0,
    1024,
  ]);
  const b = at({}, long);
  assert.deepEqual([b.split_keys, b.slices_per_row, b.workgroups, b.steps], [8192, 1, 512, 256]);
  assert.equal(b.reduce_workgroups, 0, "uncut rows, fused");
});

Deno.test("decode geometry: wg_kv_heads keeps the grid, cuts rows n times finer", () => {
  for (const n of [2, 4, 8]) {
    const g = at({ wg_kv_heads: n });
    assert.deepEqual([g.wh, g.workgroups, g.split_keys, g.steps], [n, 512, 1024 / n, 32]);
  }
  assert.equal(at({ wg_kv_heads: 4, max_heads: 2 }).wh, 1, "a tiled GQA group");
});

Deno.test("decode shape: fp8 caches take half columns on GPUs by default, f16 and software do not", () => {
  const layer = { num_heads: 32, num_kv_heads: 8, head_size: 128 } as LayerSpec;
  const spec = { block_size: 16, layout: "NHD" } as KvCacheSpec;
  const shape = (t: Partial<DecodeTuning>, st: StorageDType, gpu = H200_LIKE) =>
    decodeShape(gpu, { ...DEFAULT_DECODE_TUNING, ...t }, layer, spec, st);
  const lanes = (s: { half: boolean; lpk: number }) => [s.half, s.lpk];
  assert.deepEqual(lanes(shape({}, "fp8_e4m3")), [true, 16], "fp8 e4m3: 16 lanes of 8 elements");
  assert.deepEqual(lanes(shape({}, "fp8_e5m2")), [true, 16]);
  assert.deepEqual(lanes(shape({ fp8_half_columns: false }, "fp8_e4m3")), [false, 8]);
  assert.deepEqual(lanes(shape({}, "float16")), [false, 16], "f16: whole columns");
  assert.deepEqual(lanes(shape({}, "bfloat16")), [false, 16]);
  const lavapipe = {
    ...H200_LIKE,
    adapter_info: {
      ...H200_LIKE.adapter_info,
      description: "llvmpipe (LLVM 15.0.6, 256 bits)",
      subgroup_min_size: 8,
      subgroup_max_size: 8,
    },
  } as GpuContext;
  assert.deepEqual(lanes(shape({}, "fp8_e4m3", lavapipe)), [false, 8], "software: unchanged");
  assert.deepEqual(lanes(shape({ half_columns: true }, "fp8_e4m3", lavapipe)), [true, 8]);
});
