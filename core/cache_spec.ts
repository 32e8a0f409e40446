/**
 * The rules of a KV cache spec's fields, stated once: {@link CACHE_SPEC_RULES}. Every check of a
 * spec derives from it: {@link checkCacheSpec} (run first by every way of making a cache:
 * HostKvCache, GpuKvCache, the service's create), the forward validator's checkSpecFields
 * (service/validate_input.ts) and the HTTP schema of a cache create (wire/schemas.ts), so they
 * accept the same values and refuse the others with the same words, each in its own error shape.
 * @module
 */
import { shownValue } from "./shown.ts";
import { type Issue, ServiceError } from "./errors.ts";
import { DTYPES, KV_CACHE_DTYPES, KV_LAYOUTS, type KvCacheSpec } from "./types.ts";

/**
 * The largest int32: the largest size or count the wire takes (its schema's integers; block ids
 * in `block_table` are int32, so no larger `num_blocks` could be addressed).
 */
export const INT32_MAX = 2147483647;

/** A size: an integer in [min, max]. */
export interface SizeRule {
  readonly kind: "size";
  readonly min: number;
  readonly max: number;
}

/** A name: one of `values`. */
export interface EnumRule<T extends string = string> {
  readonly kind: "enum";
  readonly values: readonly [T, ...T[]];
}

/** The rule of every size of a spec: an integer in [1, 2^31 - 1]. */
export const SPEC_SIZE_RULE: SizeRule = { kind: "size", min: 1, max: INT32_MAX };

const oneOf = <T extends string>(values: readonly [T, ...T[]]): EnumRule<T> => ({
  kind: "enum",
  values,
});

/** Each field of a {@link KvCacheSpec} and its rule, in the order checks report them. */
export const CACHE_SPEC_RULES = {
  num_blocks: SPEC_SIZE_RULE,
  block_size: SPEC_SIZE_RULE,
  num_kv_heads: SPEC_SIZE_RULE,
  head_size: SPEC_SIZE_RULE,
  dtype: oneOf(DTYPES),
  kv_cache_dtype: oneOf(KV_CACHE_DTYPES),
  layout: oneOf(KV_LAYOUTS),
} as const satisfies Record<keyof KvCacheSpec, SizeRule | EnumRule>;

/** A spec's field names. */
export type CacheSpecField = keyof typeof CACHE_SPEC_RULES;
const FIELDS = Object.keys(CACHE_SPEC_RULES) as CacheSpecField[];

/** What a rule asks, to follow a field's name: `must be an integer in [1, 2147483647]`. */
export function ruleText(rule: SizeRule | EnumRule): string {
  return rule.kind === "size"
    ? `must be an integer in [${rule.min}, ${rule.max}]`
    : `must be one of ${rule.values.join(", ")}`;
}

/** Whether `v` keeps `rule`. */
function keepsRule(rule: SizeRule | EnumRule, v: unknown): boolean {
  if (rule.kind === "size") {
    return typeof v === "number" && Number.isInteger(v) && v >= rule.min && v <= rule.max;
  }
  return typeof v === "string" && (rule.values as readonly string[]).includes(v);
}

/** Why `v` breaks `rule` (`must be ..., got V`), or null when it keeps it. */
export function ruleProblem(rule: SizeRule | EnumRule, v: unknown): string | null {
  return keepsRule(rule, v)
    ? null
    : `${ruleText(rule)}, got ${shownValue(v, rule.kind === "enum")}`;
}

/** A plain record: an object that is neither null, an array nor a typed array. */
const isRecord = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v) && !ArrayBuffer.isView(v);

/**
 * Every field of `spec` that breaks its rule, as an issue at `[field]` (none for a valid spec;
 * one at `[]` for a value that is not an object).
 */
export function cacheSpecIssues(spec: unknown): Issue[] {
  if (!isRecord(spec)) {
    return [{
      path: [],
      message: `must be an object {${FIELDS.join(", ")}}, got ${shownValue(spec)}`,
    }];
  }
  const issues: Issue[] = [];
  for (const f of FIELDS) {
    const problem = ruleProblem(CACHE_SPEC_RULES[f], spec[f]);
    if (problem !== null) issues.push({ path: [f], message: problem });
  }
  return issues;
}

/**
 * Refuses a spec that breaks a rule of {@link CACHE_SPEC_RULES} (a size that is not an integer
 * in [1, 2^31 - 1]; a dtype, kv_cache_dtype or layout outside its list): every way a cache is
 * made checks it first.
 * @throws ServiceError 422 `invalid_cache_spec` with an issue per bad field, its value in each.
 */
export function checkCacheSpec(spec: KvCacheSpec): void {
  const issues = cacheSpecIssues(spec);
  if (issues.length === 0) return;
  const first = issues[0];
  const more = issues.length > 1 ? ` (and ${issues.length - 1} more)` : "";
  const what = first.path.length ? String(first.path[0]) : "a KV cache spec";
  throw new ServiceError(`${what} ${first.message}${more}`, {
    status: 422,
    code: "invalid_cache_spec",
    issues,
  });
}
