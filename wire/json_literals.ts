/**
 * The literal a client wrote for a JSON number, for messages about values that float64 cannot
 * hold: `JSON.parse` reads `9007199254740993` as 9007199254740992 and `1e400` as Infinity, so a
 * message built from the parsed value would name a number the client never sent. A body's text
 * is remembered beside its parsed root ({@link rememberJsonText}); only when a message needs such
 * a number is the text walked, member by member down the value's path, to the literal (no
 * second parse: a re-parse with a source-text reviver took 4.3 s over 4 MiB of zeros). Each text
 * is walked at most {@link LITERAL_LOOKUPS} times; later messages show the parsed value.
 * @module
 */

/** Texts longer than this are not remembered (a walk is then at most a few ms). */
export const LITERAL_TEXT_MAX = 1024 * 1024;
/** Walks of one text at most (a body of many such numbers costs at most this many). */
export const LITERAL_LOOKUPS = 8;

interface Remembered {
  text: string;
  walks: number;
}

const texts = new WeakMap<object, Remembered>();

/**
 * Remembers `text` as the JSON `root` was parsed from (roots that are not objects are skipped,
 * and texts over {@link LITERAL_TEXT_MAX}: keeping a 64 MiB body's text alive through its
 * decoding would only add to the call's memory).
 */
export function rememberJsonText<T>(root: T, text: string): T {
  if (typeof root === "object" && root !== null && text.length <= LITERAL_TEXT_MAX) {
    texts.set(root, { text, walks: 0 });
  }
  return root;
}

/** Whether float64's reading of a JSON number may differ from what was written. */
export function inexactNumber(v: unknown): v is number {
  return typeof v === "number" &&
    (!Number.isFinite(v) || (Number.isInteger(v) && !Number.isSafeInteger(v)));
}

/** The parsed value at `path` of `root`, or undefined where the path leaves it. */
export function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let v: unknown = root;
  for (const k of path) {
    if (v === null || typeof v !== "object") return undefined;
    v = (v as Record<PropertyKey, unknown>)[k];
  }
  return v;
}

const isSpace = (c: number) => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

function skipSpace(t: string, i: number): number {
  while (i < t.length && isSpace(t.charCodeAt(i))) i++;
  return i;
}

/** Past the string token at `i` (its opening quote). */
function skipString(t: string, i: number): number {
  for (i++; i < t.length; i++) {
    const c = t.charCodeAt(i);
    if (c === 0x22) return i + 1;
    if (c === 0x5c) i++;
  }
  return i;
}

/** Past the value at `i`: a string, a container (nested ones and strings within), a scalar. */
function skipValue(t: string, i: number): number {
  const c = t.charCodeAt(i);
  if (c === 0x22) return skipString(t, i);
  if (c === 0x7b || c === 0x5b) {
    let depth = 0;
    for (; i < t.length; i++) {
      const d = t.charCodeAt(i);
      if (d === 0x22) i = skipString(t, i) - 1;
      else if (d === 0x7b || d === 0x5b) depth++;
      else if ((d === 0x7d || d === 0x5d) && --depth === 0) return i + 1;
    }
    return i;
  }
  while (i < t.length) {
    const d = t.charCodeAt(i);
    if (d === 0x2c || d === 0x7d || d === 0x5d || isSpace(d)) break;
    i++;
  }
  return i;
}

/** Where the member or element `key` of the container at `i` starts, or -1. */
function childAt(t: string, i: number, key: PropertyKey): number {
  const open = t.charCodeAt(i);
  let at = -1;
  for (let n = 0, j = skipSpace(t, i + 1); j < t.length && t.charCodeAt(j) !== open + 2; n++) {
    if (open === 0x7b) { // object: "name" : value
      const end = skipString(t, j);
      const raw = t.slice(j, end);
      const name = raw.includes("\\") ? JSON.parse(raw) as string : raw.slice(1, -1);
      j = skipSpace(t, skipSpace(t, end) + 1);
      if (name === key) at = j; // JSON.parse keeps the last of a repeated name
    } else if (n === key) return j;
    j = skipSpace(t, skipValue(t, j));
    if (t.charCodeAt(j) === 0x2c) j = skipSpace(t, j + 1);
  }
  return at;
}

/**
 * The literal written at `path` of the JSON `root` when the parsed value there is a number
 * float64 may have changed ({@link inexactNumber}) and the text is known; else undefined.
 */
export function literalAt(root: unknown, path: readonly PropertyKey[]): string | undefined {
  if (typeof root !== "object" || root === null) return undefined;
  const known = texts.get(root);
  if (known === undefined || known.walks >= LITERAL_LOOKUPS) return undefined;
  if (!inexactNumber(valueAt(root, path))) return undefined;
  known.walks++;
  const t = known.text;
  let i = skipSpace(t, 0);
  for (const k of path) {
    const c = t.charCodeAt(i);
    if (c !== 0x7b && c !== 0x5b) return undefined;
    i = childAt(t, i, typeof k === "string" && c === 0x5b ? Number(k) : k);
    if (i < 0) return undefined;
  }
  const literal = t.slice(i, skipValue(t, i));
  return /^-?[0-9]/.test(literal) ? literal : undefined;
}
