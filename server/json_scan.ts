/**
 * A pre-scan of raw JSON bytes, run before `JSON.parse`, that bounds what the parse may build:
 * nesting deeper than {@link MAX_JSON_DEPTH} is a 400 `json_too_deep` (deep values overflow
 * the stack of every recursive walk after the parse: schema checks, error messages), and a
 * container with more than {@link MAX_JSON_CONTAINER_ENTRIES} entries is a 413
 * `json_container_too_large` (V8 aborts the whole process, uncatchably, on an array of 2^27
 * elements). One linear pass over the bytes; brackets inside strings do not count. The scan
 * does not validate the JSON: the parse that follows does.
 * @module
 */
import { ServiceError } from "../core/errors.ts";

/** Deepest accepted nesting of arrays and objects (the forward body needs 4). */
export const MAX_JSON_DEPTH = 32;

/**
 * Most entries (array elements or object members) in one JSON container: 2^25, a quarter of
 * the 2^27 elements at which V8 aborts the process.
 */
export const MAX_JSON_CONTAINER_ENTRIES = 2 ** 25;

/** Limits of {@link scanJson}. */
export interface JsonScanLimits {
  maxDepth?: number;
  maxEntries?: number;
  /** What the bytes are, for messages (default "request body"). */
  what?: string;
}

const QUOTE = 0x22, BACKSLASH = 0x5c;
const OTHER = 0, STRING = 1, OPEN = 2, CLOSE = 3, COMMA = 4;
/** The class of each byte outside strings: most bytes (digits, letters, space) are OTHER. */
const CLASS = new Uint8Array(256);
CLASS[QUOTE] = STRING;
CLASS[0x5b] = CLASS[0x7b] = OPEN; // [ {
CLASS[0x5d] = CLASS[0x7d] = CLOSE; // ] }
CLASS[0x2c] = COMMA;

function tooDeep(what: string, maxDepth: number, offset: number): ServiceError {
  return new ServiceError(
    `${what} nests arrays/objects deeper than ${maxDepth} levels (at byte ${offset})`,
    { status: 400, code: "json_too_deep", extra: { max_depth: maxDepth, offset } },
  );
}

function tooMany(what: string, maxEntries: number, offset: number): ServiceError {
  return new ServiceError(
    `${what} has a JSON array or object with more than ${maxEntries} entries (at byte ${offset}); ` +
      "send large tensors as base64 or as a safetensors body",
    {
      status: 413,
      code: "json_container_too_large",
      extra: { max_container_entries: maxEntries, offset },
    },
  );
}

/**
 * Checks nesting depth and container sizes of raw JSON bytes (UTF-8; multi-byte sequences
 * never contain ASCII bytes, so a byte scan is exact).
 * @throws ServiceError 400 `json_too_deep`, 413 `json_container_too_large`.
 */
export function scanJson(bytes: Uint8Array, limits: JsonScanLimits = {}): void {
  const maxDepth = limits.maxDepth ?? MAX_JSON_DEPTH;
  const maxEntries = limits.maxEntries ?? MAX_JSON_CONTAINER_ENTRIES;
  const what = limits.what ?? "request body";
  // The separators seen in the open container (`count`), and those of the enclosing ones.
  const counts = new Int32Array(maxDepth + 1);
  let depth = 0;
  let count = 0;
  const n = bytes.length;
  for (let i = 0; i < n; i++) {
    const c = CLASS[bytes[i]];
    if (c === OTHER) continue;
    if (c === COMMA) {
      if (++count >= maxEntries && depth > 0) throw tooMany(what, maxEntries, i);
    } else if (c === STRING) {
      for (i++; i < n; i++) {
        const b = bytes[i];
        if (b === QUOTE) break;
        if (b === BACKSLASH) i++;
      }
    } else if (c === OPEN) {
      if (depth === maxDepth) throw tooDeep(what, maxDepth, i);
      counts[depth++] = count;
      count = 0;
    } else if (depth > 0) { // CLOSE
      count = counts[--depth];
    }
  }
}

/** {@link scanJson} over a string (for JSON carried inside another format). */
export function scanJsonText(text: string, limits: JsonScanLimits = {}): void {
  scanJson(new TextEncoder().encode(text), limits);
}
