/**
 * Comparing outputs that may hold NaN or infinities with CPU_REFERENCE's (the NaN/Inf tests:
 * tests/backends/nan_read_slot_test.ts, decode_masked_keys_test.ts).
 * @module
 */
import assert from "node:assert/strict";

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
