/**
 * A pre-scan of raw JSON bytes, run before `JSON.parse`, that bounds what the parse may build:
 *
 * - nesting deeper than {@link MAX_JSON_DEPTH} is a 400 `json_too_deep` (deep values overflowed
 *   the stack of the recursive walks after the parse: schema checks, error messages);
 * - more than {@link MAX_JSON_VALUES} entries in arrays and objects together is a 413
 *   `json_too_many_values`. Time and memory of a JSON body grow with its number of values,
 *   not its bytes (measured on a 2-core VM: 8 Mi zeros take ~1 s and ~280 MiB to reject; 32 Mi
 *   zeros, 64 MiB, took 4-10 s and ~930 MiB), and V8 aborts the whole process, uncatchably, on
 *   an array of 2^27 elements (the 420 MiB crash): the cap keeps every body far below both.
 *
 * One linear pass over the bytes (core/json_structure.ts), which also finds a member name an
 * object repeats; brackets and commas inside strings do not count. The scan does not validate
 * the JSON: the parse that follows does. {@link scanSafetensorsHeader} runs
 * the same scan over a safetensors file's JSON header (forward bodies, cache imports).
 * @module
 */
import { ServiceError } from "../core/errors.ts";
import { type DuplicateKey, scanJsonStructure } from "../core/json_structure.ts";

/** Deepest accepted nesting of arrays and objects (the forward body needs 4). */
export const MAX_JSON_DEPTH = 32;

/**
 * Most entries (array elements plus object members, counted by their separators) in one JSON
 * body: 2^23 = 8,388,608, e.g. a 32 MiB float32 tensor. Bigger tensors go as base64 or
 * safetensors.
 */
export const MAX_JSON_VALUES = 2 ** 23;

/** Limits of {@link scanJson}. */
export interface JsonScanLimits {
  maxDepth?: number;
  maxValues?: number;
  /** What the bytes are, for messages (default "request body"). */
  what?: string;
}

function tooDeep(what: string, maxDepth: number, offset: number): ServiceError {
  return new ServiceError(
    `${what} nests arrays/objects deeper than ${maxDepth} levels (at byte ${offset})`,
    { status: 400, code: "json_too_deep", extra: { max_depth: maxDepth, offset } },
  );
}

function tooMany(what: string, maxValues: number, offset: number): ServiceError {
  return new ServiceError(
    `${what} has more than ${maxValues} JSON values in arrays and objects (at byte ${offset}); ` +
      "send large tensors as base64 or as a safetensors body",
    { status: 413, code: "json_too_many_values", extra: { max_json_values: maxValues, offset } },
  );
}

/**
 * Checks the nesting depth and the number of entries of raw JSON bytes, in the same pass as it
 * finds the first member name an object repeats (core/json_structure.ts), which it returns for
 * the caller to refuse once JSON.parse accepted the bytes.
 * @throws ServiceError 400 `json_too_deep`, 413 `json_too_many_values`.
 */
export function scanJson(bytes: Uint8Array, limits: JsonScanLimits = {}): DuplicateKey | null {
  const maxDepth = limits.maxDepth ?? MAX_JSON_DEPTH;
  const maxValues = limits.maxValues ?? MAX_JSON_VALUES;
  const what = limits.what ?? "request body";
  const found = scanJsonStructure(bytes, maxDepth, maxValues);
  if (found.tooDeepAt >= 0) throw tooDeep(what, maxDepth, found.tooDeepAt);
  if (found.tooManyAt >= 0) throw tooMany(what, maxValues, found.tooManyAt);
  return found.duplicate;
}

/** {@link scanJson} over a string (for JSON carried inside another format). */
export function scanJsonText(text: string, limits: JsonScanLimits = {}): DuplicateKey | null {
  return scanJson(new TextEncoder().encode(text), limits);
}

/** The depth and size pre-scan of a safetensors header's JSON (when its length is in range). */
export function scanSafetensorsHeader(bytes: Uint8Array): void {
  if (bytes.byteLength < 8) return;
  const n = new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true);
  if (n > BigInt(bytes.byteLength - 8)) return; // parseSafetensors says what is wrong
  scanJson(bytes.subarray(8, 8 + Number(n)), { what: "safetensors header" });
}
