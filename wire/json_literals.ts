/**
 * The literal a client wrote for a JSON number, for messages about values that float64 cannot
 * hold: `JSON.parse` reads `9007199254740993` as 9007199254740992 and `1e400` as Infinity, so a
 * message built from the parsed value would name a number the client never sent. A body's text
 * is remembered beside its parsed root ({@link rememberJsonText}); only when a message needs such
 * a number is the text parsed again, once, with each number's source text
 * (`JSON.parse`'s reviver context), and the literal at the value's path taken from it.
 * @module
 */

/** Texts longer than this are not parsed again (an error path; 4 MiB parses in tens of ms). */
export const LITERAL_REPARSE_MAX = 4 * 1024 * 1024;

/** A number's source text in a re-parsed tree. */
class Literal {
  constructor(readonly text: string) {}
}

const texts = new WeakMap<object, string>();
const trees = new WeakMap<object, unknown>();

/**
 * Remembers `text` as the JSON `root` was parsed from (roots that are not objects are skipped,
 * and texts over {@link LITERAL_REPARSE_MAX}: they would not be parsed again, and keeping a
 * 64 MiB body's text alive through its decoding would only add to the call's memory).
 */
export function rememberJsonText<T>(root: T, text: string): T {
  if (typeof root === "object" && root !== null && text.length <= LITERAL_REPARSE_MAX) {
    texts.set(root, text);
  }
  return root;
}

/** Whether float64's reading of a JSON number may differ from what was written. */
export function inexactNumber(v: unknown): v is number {
  return typeof v === "number" &&
    (!Number.isFinite(v) || (Number.isInteger(v) && !Number.isSafeInteger(v)));
}

type Reviver = (key: string, value: unknown, context?: { source?: string }) => unknown;

function literalTree(root: object): unknown {
  if (trees.has(root)) return trees.get(root);
  const text = texts.get(root);
  let tree: unknown = undefined;
  if (text !== undefined) {
    const reviver: Reviver = (_k, v, context) =>
      typeof v === "number" && context?.source !== undefined ? new Literal(context.source) : v;
    try {
      tree = JSON.parse(text, reviver as (k: string, v: unknown) => unknown);
    } catch {
      tree = undefined;
    }
  }
  trees.set(root, tree);
  return tree;
}

/**
 * The literal written at `path` of the JSON `root` when the parsed value there is a number
 * float64 may have changed ({@link inexactNumber}) and the text is known; else undefined.
 */
export function literalAt(root: unknown, path: readonly PropertyKey[]): string | undefined {
  if (typeof root !== "object" || root === null || !texts.has(root)) return undefined;
  let v: unknown = root;
  for (const k of path) {
    if (v === null || typeof v !== "object") return undefined;
    v = (v as Record<PropertyKey, unknown>)[k];
  }
  if (!inexactNumber(v)) return undefined;
  let t: unknown = literalTree(root);
  for (const k of path) {
    if (t === null || typeof t !== "object" || t instanceof Literal) return undefined;
    t = (t as Record<PropertyKey, unknown>)[k];
  }
  return t instanceof Literal ? t.text : undefined;
}
