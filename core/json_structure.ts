/**
 * One pass over JSON bytes for what the service bounds or refuses before it trusts JSON.parse:
 * the nesting depth, the number of entries, and the first member name one object repeats.
 * JSON.parse keeps the last of a repeated name and says nothing, so `{"slot_mapping": <bad>,
 * "slot_mapping": <good>}` in a safetensors header was taken as the good one, and a first
 * `__metadata__` of the wrong type was dropped (session 38's HTTP audit): RFC 8259 leaves such a
 * document's meaning to the parser, so the service refuses it where it parses JSON (safetensors
 * headers, `__metadata__.request`, JSON bodies) instead of picking one.
 *
 * wire/json_scan.ts turns the depth and the entries into problems before the parse, and the
 * callers refuse a repeated name after it, so a JSON body is read once for all three. Names are
 * compared decoded, so `"a"` and `"\u0061"` are the same member.
 * @module
 */

/** Where the repeated name is: the member names and array indices down to it, then the name. */
export interface DuplicateKey {
  path: (string | number)[];
  /** Byte offset of the second occurrence's opening quote. */
  offset: number;
}

/**
 * The issue message for a {@link DuplicateKey}, the same wherever JSON is read (a body, a
 * safetensors header, `__metadata__.request`).
 */
export const REPEATED_NAME =
  "appears twice in its object (JSON keeps only one of them, the parser's choice): send it once";

const QUOTE = 0x22, BACKSLASH = 0x5c;
const OTHER = 0, STRING = 1, OBJ_OPEN = 2, ARR_OPEN = 3, CLOSE = 4, COMMA = 5;
/** The class of each byte outside strings: most bytes (digits, space, letters) are OTHER. */
const CLASS = new Uint8Array(256);
CLASS[QUOTE] = STRING;
CLASS[0x7b] = OBJ_OPEN; // {
CLASS[0x5b] = ARR_OPEN; // [
CLASS[0x7d] = CLASS[0x5d] = CLOSE; // } ]
CLASS[0x2c] = COMMA;

/** An object or array the scan is in. */
interface Frame {
  /** The object's names so far; null for an array. */
  names: Set<string> | null;
  /** The member the scan is in (objects). */
  member: string;
  /** An object expects a name next (after `{` or `,`). */
  expectName: boolean;
}

const utf8 = new TextDecoder();

/**
 * The name a string token spells (its bytes `[begin, end)` with the quotes). The scan runs before
 * JSON.parse, so the token may be malformed (a bad escape, no closing quote): then its raw text,
 * never an exception (JSON.parse refuses the document after the scan).
 */
function nameOf(bytes: Uint8Array, begin: number, end: number, escaped: boolean): string {
  const raw = utf8.decode(bytes.subarray(begin, end));
  if (!escaped) return raw.slice(1, -1);
  try {
    return JSON.parse(raw) as string;
  } catch {
    return raw;
  }
}

/** What {@link scanJsonStructure} found. */
export interface JsonStructure {
  /** Byte offset of the bracket past `maxDepth`, or -1 (the scan stops there). */
  tooDeepAt: number;
  /** Byte offset of the separator that made `maxValues` entries, or -1 (the scan stops there). */
  tooManyAt: number;
  /** The first repeated member name before any stop, or null. */
  duplicate: DuplicateKey | null;
}

/** The element index of each array on the stack at `offset`: counted again, on a rare path. */
function pathAt(bytes: Uint8Array, frames: Frame[], offset: number): (string | number)[] {
  const indices: number[] = [];
  for (let i = 0; i < offset; i++) {
    const c = CLASS[bytes[i]];
    if (c === STRING) {
      for (i++; i < offset && bytes[i] !== QUOTE; i++) if (bytes[i] === BACKSLASH) i++;
    } else if (c === OBJ_OPEN || c === ARR_OPEN) indices.push(0);
    else if (c === CLOSE) indices.pop();
    else if (c === COMMA) indices[indices.length - 1]++;
  }
  // frames[0] is the scan's root placeholder; frames[d] is the container at depth d.
  return frames.slice(1, -1).map((f, d) => f.names ? f.member : indices[d]);
}

/**
 * One pass over JSON bytes (UTF-8: multi-byte sequences never hold ASCII bytes, so a byte scan
 * is exact; brackets and commas inside strings do not count): the nesting depth against
 * `maxDepth`, the entries of arrays and objects (counted by their separators) against
 * `maxValues`, and the first member name an object repeats. It does not validate the JSON: on
 * bytes JSON.parse refuses its `duplicate` means nothing.
 */
export function scanJsonStructure(
  bytes: Uint8Array,
  maxDepth = Infinity,
  maxValues = Infinity,
): JsonStructure {
  const found: JsonStructure = { tooDeepAt: -1, tooManyAt: -1, duplicate: null };
  const frames: Frame[] = [{ names: null, member: "", expectName: false }];
  let top = frames[0];
  let depth = 0;
  let values = 0;
  const n = bytes.length;
  for (let i = 0; i < n; i++) {
    const c = CLASS[bytes[i]];
    if (c === OTHER) continue;
    if (c === COMMA) {
      if (++values >= maxValues) return { ...found, tooManyAt: i };
      if (top.names !== null) top.expectName = true;
    } else if (c === STRING) {
      const begin = i;
      let escaped = false;
      for (i++; i < n; i++) {
        const b = bytes[i];
        if (b === QUOTE) break;
        if (b === BACKSLASH) escaped = true, i++;
      }
      if (top.expectName && found.duplicate === null) {
        const name = nameOf(bytes, begin, i + 1, escaped);
        if (top.names!.has(name)) {
          found.duplicate = { path: [...pathAt(bytes, frames, begin), name], offset: begin };
        }
        top.names!.add(name);
        top.member = name;
        top.expectName = false;
      }
    } else if (c === CLOSE) {
      if (depth === 0) continue;
      depth--;
      frames.pop();
      top = frames[depth];
    } else {
      if (++depth > maxDepth) return { ...found, tooDeepAt: i };
      const obj = c === OBJ_OPEN;
      top = { names: obj ? new Set() : null, member: "", expectName: obj };
      frames.push(top);
    }
  }
  return found;
}

/** The first repeated member name of `bytes` (see the module doc), or null. */
export function duplicateKey(bytes: Uint8Array): DuplicateKey | null {
  return scanJsonStructure(bytes).duplicate;
}

/** `a.b[2].c` for messages. */
export function jsonPath(path: (string | number)[]): string {
  return path.map((p, i) => typeof p === "number" ? `[${p}]` : i === 0 ? p : `.${p}`).join("");
}
