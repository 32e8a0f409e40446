/**
 * The validator tests' forward call: one decode request at position 9 (10 attended keys, 3 blocks
 * of 4) over a held f16 NHD cache of 8 blocks, 2 q heads / 1 kv head of size 4; and their
 * check that a call is refused with a 422 of a given code.
 * @module
 */
import assert from "node:assert/strict";
import { fromFloats } from "../../core/data.ts";
import { ServiceError } from "../../core/errors.ts";
import type { KvCacheSpec } from "../../core/types.ts";
import type { ForwardInput } from "../../service/validate.ts";

/** The held cache's spec. */
export const DECODE_SPEC: KvCacheSpec = {
  num_blocks: 8,
  block_size: 4,
  num_kv_heads: 1,
  head_size: 4,
  dtype: "float16",
  kv_cache_dtype: "auto",
  layout: "NHD",
};

/** The cache as validateForward is given it. */
export const DECODE_HELD = { spec: DECODE_SPEC, storage: "webgpu" as const };

/** int32 metadata of `shape` (default: flat). */
export const ints = (values: number[], shape = [values.length]) => ({
  shape,
  values: Int32Array.from(values),
});

/** The decode call (`over` replaces top-level fields): 4 x 10 x 2 x 4 = 320 attention FLOPs. */
export function decodeInput(over: Partial<ForwardInput> = {}): ForwardInput {
  const f16 = (n: number, shape: number[]) => ({
    dtype: "float16" as const,
    shape,
    array: fromFloats("float16", Float32Array.from({ length: n }, (_, i) => i / 8)),
    encoding: "base64" as const,
  });
  return {
    dtype: "float16",
    layer: { num_heads: 2, num_kv_heads: 1, head_size: 4 },
    query: f16(8, [1, 2, 4]),
    key: f16(4, [1, 1, 4]),
    value: f16(4, [1, 1, 4]),
    metadata: {
      query_start_loc: ints([0, 1]),
      seq_lens: ints([10]),
      block_table: ints([5, 2, 7], [1, 3]),
      slot_mapping: ints([29]),
    },
    kv_cache: "c",
    ...over,
  };
}

/** The 422 ServiceError of `code` that `f` throws (fails when it throws another or none). */
export function refused422(f: () => unknown, code: string): ServiceError {
  try {
    f();
  } catch (e) {
    assert.ok(e instanceof ServiceError, String(e));
    assert.equal(e.status, 422);
    assert.equal(e.code, code, e.message);
    return e;
  }
  assert.fail(`expected 422 ${code}`);
}
