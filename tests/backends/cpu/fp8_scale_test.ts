/**
 * CPU_REFERENCE writes fp8 rows as a device does: `fp8(fround(x / fround(scale)))`, the scale a
 * float32 (a device's uniform, vLLM's tensor). With the float64 scale, a quotient on a rounding tie
 * went the other way: -1.125 / 0.3 is -3.75 exactly in float64 (e5m2 rounds it to -4), while
 * -1.125 / fround(0.3) is -3.7499998 (to -3.5), so the oracle and both GPU backends disagreed by an
 * fp8 step (a random conformance batch caught it: tests/conformance/random_batches_test.ts).
 */
import assert from "node:assert/strict";
import { writeKv } from "../../../backends/cpu/reference.ts";
import { HostKvCache } from "../../../backends/cpu/host_cache.ts";
import { f32ToFp8E5m2 } from "../../../core/dtype.ts";
import { deriveSeed, generateBatch } from "../../support/batches.ts";

Deno.test("cpu reference: fp8 rows are scaled by the float32 scale (a tie rounds as on a device)", () => {
  const g = generateBatch({
    dtype: "float32",
    kv_cache_dtype: "fp8_e5m2",
    layout: "NHD",
    block_size: 16,
    head_size: 8,
    num_heads: 1,
    num_kv_heads: 1,
    requests: [{ query_len: 1, seq_len: 1 }],
    k_scale: 0.3,
    v_scale: 0.3,
  }, deriveSeed(1, "fp8-scale"));
  const cache = HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache);
  const value = new Float32Array(8).fill(-1.125);
  writeKv({ ...g.batch, value, key: value, cache }, cache);
  const slot = g.batch.metadata.slot_mapping[0];
  const byte = cache.value[slot * 8]; // NHD, one kv head of 8: the slot's first element
  const device = f32ToFp8E5m2(Math.fround(-1.125 / Math.fround(0.3)));
  assert.notEqual(
    device,
    f32ToFp8E5m2(-1.125 / 0.3),
    "the case is a tie the scale's width decides",
  );
  assert.equal(byte, device, `stored ${byte.toString(16)}, a device stores ${device.toString(16)}`);
});
