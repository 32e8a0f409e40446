/**
 * A value a caller gave, as a refusal shows it: never throws, whatever it is (a BigInt, a cycle,
 * an object without a prototype), and never runs long.
 * @module
 */

/**
 * `v` for a message: a name as itself where a name is asked for (`asName`: `float64`), a number
 * or BigInt as written, any other value as JSON, so its type shows (`"16"` for a size, `""`,
 * `null`); `undefined (missing)`; past 60 characters cut with `...`.
 */
export function shownValue(v: unknown, asName = false): string {
  if (v === undefined) return "undefined (missing)";
  if (asName && typeof v === "string" && /^[\w.-]+$/.test(v)) return v;
  if (typeof v === "number" || typeof v === "bigint") return String(v);
  let s: string | undefined;
  try {
    s = JSON.stringify(v);
  } catch {
    // a cycle or the like: String() below
  }
  if (s === undefined) {
    try {
      s = String(v);
    } catch {
      s = `(${typeof v})`; // an object String() cannot convert
    }
  }
  return s.length > 60 ? `${s.slice(0, 57)}...` : s;
}
