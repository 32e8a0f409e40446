/**
 * The rules of {@link DecodeTuning}'s numeric fields ({@link DECODE_TUNING_RULES}), their wording
 * and the check of a tuning against them ({@link decodeTuningProblem}).
 * @module
 */
import type { DecodeTuning } from "./webgpu_decode_tuning.ts";

/** The numeric fields of {@link DecodeTuning}. */
export type DecodeTuningNumber = {
  [K in keyof DecodeTuning]: DecodeTuning[K] extends number ? K : never;
}[keyof DecodeTuning];

/**
 * A numeric field's rule: an integer (a power of two where `pow2`) from `least` to `most`, or
 * 0 where `zero` says what 0 means (the automatic choice, another policy).
 */
export interface TuningRule {
  readonly least: number;
  readonly most: number;
  readonly pow2?: boolean;
  readonly zero?: string;
}

/** The most of a count no device or batch reaches (keys, workgroups, bytes, entries, heads). */
const MOST = 2 ** 31 - 1;

/**
 * Every numeric field's rule: what holds for any layer, cache and device (a value within it that
 * one cannot take is fitted at plan time: the field's comment says how). Values out of these
 * broke calls on lavapipe (tests/backends/decode_tuning_rules_test.ts): `keys_per_iter` 3 or 6
 * and `max_lanes` / `fallback_lanes` 3 or 6 answered wrong (a step's keys across two blocks;
 * butterfly sums over lanes not a power of two), or failed to compile (500
 * `shader_compile_failed`); `keys_per_iter` -1 or 0.5, `max_lanes` 0, -4 or 2.5, fractional
 * `max_heads` / `kv_heads_per_group` / `wg_kv_heads` and negative `wg_kv_heads` failed the plan
 * (500 `internal_error`); `workgroup_size` 4096 failed to compile. The others were fitted
 * silently (negative or fractional counts, 1e12 bytes, 1e999 = Infinity).
 */
export const DECODE_TUNING_RULES: Readonly<Record<DecodeTuningNumber, TuningRule>> = Object
  .freeze({
    workgroup_size: { least: 1, most: 1024, zero: "automatic" },
    keys_per_iter: { least: 1, most: 16, pow2: true, zero: "automatic" },
    gpu_keys_per_iter: { least: 1, most: 16, pow2: true, zero: "automatic" },
    kv_heads_per_group: { least: 1, most: MOST, zero: "automatic" },
    max_lanes: { least: 1, most: 128, pow2: true },
    fallback_lanes: { least: 1, most: 128, pow2: true },
    max_heads: { least: 1, most: MOST },
    max_flat_heads: { least: 1, most: MOST },
    target_workgroups: { least: 1, most: MOST, zero: "automatic" },
    waves: { least: 1, most: MOST, zero: "the target_workgroups policy" },
    wave_workgroups: { least: 1, most: MOST, zero: "automatic" },
    slice_overhead: { least: 0, most: MOST },
    min_split_keys: { least: 0, most: MOST },
    stage_table_max: { least: 0, most: MOST },
    stage_kv_bytes: { least: 0, most: MOST },
    wg_kv_heads: { least: 1, most: MOST },
    wg_tokens: { least: 1, most: 64, pow2: true },
  });

/** `n` as the rule says it ("2^31 - 1" for {@link MOST}). */
const said = (n: number) => n === MOST ? "2^31 - 1" : String(n);

/** Rule `r` in words: "a power of two from 1 to 16, or 0 for automatic". */
export function tuningRuleText(r: TuningRule): string {
  const kind = r.pow2 ? "a power of two" : "an integer";
  const zero = r.zero === undefined ? "" : `, or 0 for ${r.zero}`;
  return `${kind} from ${said(r.least)} to ${said(r.most)}${zero}`;
}

/** Whether `v` keeps rule `r`. */
export function keepsTuningRule(r: TuningRule, v: number): boolean {
  if (v === 0 && r.zero !== undefined) return true;
  if (!Number.isInteger(v) || v < r.least || v > r.most) return false;
  return !r.pow2 || (v & (v - 1)) === 0;
}

/**
 * The first numeric field of `t` that breaks its rule ({@link DECODE_TUNING_RULES}), worded as
 * `field = value breaks its rule: rule`, or null where every one keeps it (for tunings built in
 * code: benchmarks, tests).
 */
export function decodeTuningProblem(t: Readonly<DecodeTuning>): string | null {
  for (const [k, r] of Object.entries(DECODE_TUNING_RULES)) {
    const v = t[k as DecodeTuningNumber];
    if (!keepsTuningRule(r, v)) return `${k} = ${v} breaks its rule: ${tuningRuleText(r)}`;
  }
  return null;
}
