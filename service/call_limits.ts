/**
 * The per-call limits of a forward call (server flags `--max-tokens-per-call`,
 * `--max-attended-keys`, `--max-attention-flops`), the check of a call's counts against them, and
 * the one 422 problem that lists what a call breaks: `limit_exceeded` when the limits are its only
 * problems, else `invalid_batch` with the limits listed too (docs/api.md, "Limits").
 *
 * The attention FLOPs of a call are 4 x attended keys x num_heads x head_size: QK^T and PV, a
 * multiply-add counted as two (the count bench/ reports TFLOP/s with). They can pass 2^53, so
 * they are counted as a BigInt and compared with the limit as a BigInt: exact, no float
 * rounding lets a call in. A problem's `value` is a JSON number (exact up to 2^53, the nearest
 * double above, still over any limit the flag accepts); its issue's message has every digit.
 * @module
 */
import { invalidBatch, type Issue, ServiceError } from "../core/errors.ts";
import type { Issues } from "./validate_layer.ts";

/** Per-call limits (server flags), refused with 422 `limit_exceeded` naming the limit and value. */
export interface CallLimits {
  /** Most query tokens in one call. */
  max_tokens: number;
  /** Most attended keys (sum over query tokens of the keys each may see) in one call. */
  max_attended_keys: number;
  /**
   * Most attention FLOPs in one call: 4 x attended keys x num_heads x head_size, so the same
   * keys cost more on a wider layer (see the module doc for how it is compared).
   */
  max_attention_flops: number;
}

/**
 * The default per-call limits. `max_attention_flops` is Number.MAX_SAFE_INTEGER (2^53 - 1, the
 * largest value the flag takes): a call within the default attended keys (2^32) reaches it only
 * with num_heads x head_size over 2^19.
 */
export const DEFAULT_CALL_LIMITS: Readonly<CallLimits> = Object.freeze({
  max_tokens: 262_144,
  max_attended_keys: 2 ** 32,
  max_attention_flops: Number.MAX_SAFE_INTEGER,
});

/** What the limits are checked against: the call's counts. */
export interface CallCounts {
  num_tokens: number;
  /**
   * Null when query_start_loc, seq_lens or sliding_window broke a rule: the count would be
   * meaningless (and those issues are listed already), so neither key nor FLOPs limit is checked.
   */
  attended_keys: number | null;
  num_heads: number;
  head_size: number;
}

/** A per-call limit a call exceeds: the limit's name, the call's count, the limit's value. */
export interface Over {
  limit: keyof CallLimits;
  /** The count as a JSON number (exact up to 2^53). */
  value: number;
  max: number;
  /** The issue's path and message (`<what> <count> exceeds <limit> = <max>`). */
  path: (string | number)[];
  what: string;
  /** The count as the message writes it: every digit (for the FLOPs, how they were counted). */
  count: string;
}

/** A call's attention FLOPs, exactly: 4 x attended keys x num_heads x head_size. */
export function attentionFlops(attendedKeys: number, numHeads: number, headSize: number): bigint {
  return 4n * BigInt(attendedKeys) * BigInt(numHeads) * BigInt(headSize);
}

/** The FLOPs limit, if `c`'s attended keys exceed it on this layer. */
function flopsOver(c: CallCounts, attended: number, max: number): Over | null {
  // Exact where the counts and the limit are integers (always over HTTP: the schema and the flag
  // take no other). A library caller's layer or limit may not be (BigInt() would throw): its
  // count is a float and its limit compares as the other limits do (Infinity: none).
  const flops = [attended, c.num_heads, c.head_size].every(Number.isInteger)
    ? attentionFlops(attended, c.num_heads, c.head_size)
    : 4 * attended * c.num_heads * c.head_size;
  const over = typeof flops === "bigint" && Number.isInteger(max)
    ? flops > BigInt(max)
    : Number(flops) > max;
  if (!over) return null;
  return {
    limit: "max_attention_flops",
    value: Number(flops),
    max,
    path: ["metadata", "seq_lens"],
    what: "attention FLOPs",
    count:
      `${flops} (4 x ${attended} attended keys x ${c.num_heads} heads x head_size ${c.head_size})`,
  };
}

/**
 * The per-call limits a call exceeds, in this order: `max_tokens` always (the query's first axis
 * is the token count every other check uses), then `max_attended_keys` and `max_attention_flops`
 * when the keys can be counted. `limits` may leave some out: the defaults fill them in.
 */
export function limitsOver(c: CallCounts, limits: Partial<CallLimits>): Over[] {
  const lim = { ...DEFAULT_CALL_LIMITS, ...limits };
  const over: Over[] = [];
  const at = (limit: keyof CallLimits, value: number, path: Over["path"], what: string) =>
    over.push({ limit, value, max: lim[limit], path, what, count: String(value) });
  if (c.num_tokens > lim.max_tokens) {
    at("max_tokens", c.num_tokens, ["query", "shape", 0], "num_tokens");
  }
  const A = c.attended_keys;
  if (A === null) return over;
  if (A > lim.max_attended_keys) {
    at("max_attended_keys", A, ["metadata", "seq_lens"], "attended keys");
  }
  const flops = flopsOver(c, A, lim.max_attention_flops);
  if (flops) over.push(flops);
  return over;
}

/** A limit as an issue: at the field that carries the count, naming the limit and value. */
function limitIssue(o: Over): Issue {
  return { path: o.path, message: `${o.what} ${o.count} exceeds ${o.limit} = ${o.max}` };
}

/**
 * Throws every problem found as one 422 problem document, if there is any. Both codes are 422
 * (docs/api.md): a call whose only problems are per-call limits is `limit_exceeded` (a valid
 * batch, too large: split it); one that also breaks a batch rule is `invalid_batch`, since
 * splitting would not make it run, and its issues list the limits too (after the rule issues,
 * whatever the MAX_LISTED_ISSUES cap), with the first limit's `limit`, `value` and `max` as in a
 * `limit_exceeded` document.
 */
export function throwProblems(is: Issues, over: Over[]): void {
  if (is.count === 0 && over.length === 0) return;
  const first = over[0];
  const extra = first ? { limit: first.limit, value: first.value, max: first.max } : undefined;
  if (is.count > 0) throw invalidBatch(is.listed(over.map(limitIssue)), extra);
  throw new ServiceError(
    `${first.what} ${first.count} exceeds the per-call limit ${first.limit} = ${first.max}`,
    { status: 422, code: "limit_exceeded", issues: over.map(limitIssue), extra },
  );
}
