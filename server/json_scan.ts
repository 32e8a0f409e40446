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

const QUOTE = 0x22, BACKSLASH = 0x5c, COMMA = 0x2c;
const OPEN_ARRAY = 0x5b, CLOSE_ARRAY = 0x5d, OPEN_OBJECT = 0x7b, CLOSE_OBJECT = 0x7d;

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
  // commas[d]: separators seen so far in the container open at depth d (1-based).
  const commas = new Float64Array(maxDepth + 1);
  let depth = 0;
  let inString = false;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i];
    if (inString) {
      if (b === BACKSLASH) i++;
      else if (b === QUOTE) inString = false;
      continue;
    }
    switch (b) {
      case QUOTE:
        inString = true;
        break;
      case OPEN_ARRAY:
      case OPEN_OBJECT:
        if (++depth > maxDepth) throw tooDeep(what, maxDepth, i);
        commas[depth] = 0;
        break;
      case CLOSE_ARRAY:
      case CLOSE_OBJECT:
        if (depth > 0) depth--;
        break;
      case COMMA:
        if (depth > 0 && ++commas[depth] >= maxEntries) throw tooMany(what, maxEntries, i);
        break;
    }
  }
}

/** {@link scanJson} over a string (for JSON carried inside another format). */
export function scanJsonText(text: string, limits: JsonScanLimits = {}): void {
  scanJson(new TextEncoder().encode(text), limits);
}
