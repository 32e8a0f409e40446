/**
 * bench/variants.ts `decodeVariants` (`--decode-tunings`, `BENCH_DECODE_TUNINGS`): a variant
 * whose numbers break their rules (backends/webgpu_decode_tuning.ts DECODE_TUNING_RULES, what
 * `ATTN_DECODE_TUNING` refuses at start-up) was built and swept: `keys_per_iter` 3 answered wrong
 * on lavapipe, others failed to compile. Now the list is refused, naming the variant and the
 * rule. No device needed (nothing is planned).
 */
import assert from "node:assert/strict";
import { decodeVariants } from "../../bench/variants.ts";

Deno.test("decode variants: tunings within the rules are built", () => {
  const v = decodeVariants('[{"keys_per_iter":8},{"prefetch":true},{"workgroup_size":1024}]');
  assert.deepEqual(v.map((x) => x.label), [
    'WEBGPU_DECODE{"keys_per_iter":8}',
    'WEBGPU_DECODE{"prefetch":true}',
    'WEBGPU_DECODE{"workgroup_size":1024}',
  ]);
  assert.deepEqual(decodeVariants(undefined), []);
});

Deno.test("decode variants: a number that breaks its rule is refused, naming the variant", () => {
  assert.throws(
    () => decodeVariants('[{"prefetch":true},{"keys_per_iter":3}]'),
    (e) =>
      e instanceof Error &&
      e.message ===
        'decode tunings: {"keys_per_iter":3}: keys_per_iter = 3 breaks its rule: a power of ' +
          "two from 1 to 16, or 0 for automatic",
  );
  assert.throws(
    () => decodeVariants('[{"workgroup_size":4096}]'),
    /^Error: decode tunings: \{"workgroup_size":4096\}: workgroup_size = 4096 breaks its rule: an integer from 1 to 1024, or 0 for automatic$/,
  );
  assert.throws(() => decodeVariants('[{"max_lanes":6}]'), /max_lanes = 6 breaks its rule/);
  // Unknown fields and wrong types, as before.
  assert.throws(() => decodeVariants('[{"lanes":4}]'), /unknown field or wrong type: lanes = 4/);
});
