/**
 * The cache a `POST /v1/attention/forward` body names (`kv_cache`), found without decoding the
 * body, so the device-thread front (device_threads.ts) can send the call to the thread that
 * holds that cache: in a safetensors body, the `kv_cache` of `__metadata__.request` (the
 * header's JSON, memoized by its text as an engine repeats it); in a JSON body, the last
 * top-level `kv_cache` member whose value is a string (JSON.parse keeps the last of duplicate
 * keys), by one pass over the bytes that skips strings and nested values. Anything else
 * (no such member, a body that is not what it says, a safetensors header over
 * {@link MAX_ROUTED_HEADER_BYTES}) is undefined: the call then goes to any thread, whose
 * service answers it as it would answer it alone (a body naming a cache is valid only with the
 * member found here).
 * @module
 */

/** Largest safetensors header the front parses (valid forward headers are a few KB). */
export const MAX_ROUTED_HEADER_BYTES = 1 << 20;

const KEY = new TextEncoder().encode('"kv_cache"');
const utf8 = new TextDecoder("utf-8", { fatal: true });
const headers = new Map<string, string | undefined>();
const HEADER_MEMO = 64;

/** The `kv_cache` a forward body names, or undefined (see the module doc). */
export function forwardCacheId(bytes: Uint8Array, safetensors: boolean): string | undefined {
  try {
    return safetensors ? fromSafetensors(bytes) : topLevelString(bytes, "kv_cache");
  } catch {
    return undefined;
  }
}

function fromSafetensors(bytes: Uint8Array): string | undefined {
  if (bytes.byteLength < 8) return undefined;
  const n = new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true);
  if (n > BigInt(Math.min(MAX_ROUTED_HEADER_BYTES, bytes.byteLength - 8))) return undefined;
  const text = utf8.decode(bytes.subarray(8, 8 + Number(n)));
  if (headers.has(text)) return headers.get(text);
  const request = JSON.parse(text)?.__metadata__?.request;
  const id = typeof request === "string" ? JSON.parse(request)?.kv_cache : undefined;
  const found = typeof id === "string" ? id : undefined;
  if (headers.size >= HEADER_MEMO) headers.delete(headers.keys().next().value!);
  headers.set(text, found);
  return found;
}

const isSpace = (c: number) => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

/** Index just past the string token starting at `i` (a quote), or -1 if it does not end. */
function stringEnd(b: Uint8Array, i: number): number {
  for (let j = i + 1; j < b.length; j++) {
    if (b[j] === 0x5c) j++;
    else if (b[j] === 0x22) return j + 1;
  }
  return -1;
}

/** Whether the string token b[i, end) means `key` (escapes decoded where there are any). */
function tokenIs(b: Uint8Array, i: number, end: number, key: string): boolean {
  if (end - i === KEY.length && key === "kv_cache") {
    let same = true;
    for (let k = 0; k < KEY.length && same; k++) same = b[i + k] === KEY[k];
    if (same) return true;
  }
  if (b.subarray(i, end).indexOf(0x5c) < 0) return false;
  return JSON.parse(utf8.decode(b.subarray(i, end))) === key;
}

/** The last top-level member `key` of the JSON object in `b` whose value is a string. */
export function topLevelString(b: Uint8Array, key: string): string | undefined {
  let i = 0;
  while (i < b.length && isSpace(b[i])) i++;
  if (b[i] !== 0x7b) return undefined; // not an object
  let depth = 0, expectKey = false, found: string | undefined;
  while (i < b.length) {
    const c = b[i];
    if (c === 0x22) {
      const end = stringEnd(b, i);
      if (end < 0) return undefined;
      if (depth === 1 && expectKey) {
        expectKey = false;
        const isKey = tokenIs(b, i, end, key);
        let j = end;
        while (j < b.length && isSpace(b[j])) j++;
        if (b[j] !== 0x3a) return undefined; // no colon
        j++;
        while (j < b.length && isSpace(b[j])) j++;
        if (isKey && b[j] === 0x22) {
          const vEnd = stringEnd(b, j);
          if (vEnd < 0) return undefined;
          found = JSON.parse(utf8.decode(b.subarray(j, vEnd)));
          i = vEnd;
        } else {
          i = j;
        }
        continue;
      }
      i = end;
      continue;
    }
    if (c === 0x7b || c === 0x5b) {
      depth++;
      if (depth === 1) expectKey = true;
    } else if (c === 0x7d || c === 0x5d) {
      depth--;
      if (depth === 0) return found;
    } else if (c === 0x2c && depth === 1) {
      expectKey = true;
    }
    i++;
  }
  return undefined;
}
