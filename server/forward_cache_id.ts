/**
 * The cache a `POST /v1/attention/forward` body names (`kv_cache`), found without decoding the
 * body, so the device-thread front (device_threads.ts) can send the call to the thread that
 * holds that cache: in a safetensors body, the `kv_cache` of `__metadata__.request` (the
 * header's JSON; headers up to {@link MEMO_HEADER_BYTES} memoized by their text, as an engine
 * repeats them); in a JSON body (a UTF-8 byte order mark allowed, as the service's decoder
 * allows it), the last top-level `kv_cache` member whose value is a string (JSON.parse keeps the
 * last of duplicate keys), by one pass over the bytes that skips strings and nested values.
 * Anything else (no such member, a body that is not what it says) is undefined: the call then
 * goes to any thread, whose service answers it as it would alone (a body naming a cache is
 * valid only with the member found here).
 *
 * {@link findForwardCacheId} keeps the front's thread free of big bodies: a JSON body over
 * {@link SYNC_SCAN_BYTES} or a safetensors header over {@link MEMO_HEADER_BYTES} is scanned on a
 * worker (cache_id_worker.ts), its buffer transferred there and back, not copied.
 * @module
 */

/** Largest JSON body scanned on the calling thread (bigger: on the scan worker). */
export const SYNC_SCAN_BYTES = 1 << 20;
/** Largest safetensors header parsed on the calling thread and memoized. */
export const MEMO_HEADER_BYTES = 64 * 1024;

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
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

/** The safetensors header's length, or -1 when the body cannot have one. */
function headerLength(bytes: Uint8Array): number {
  if (bytes.byteLength < 8) return -1;
  const n = new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true);
  return n > BigInt(bytes.byteLength - 8) ? -1 : Number(n);
}

function fromSafetensors(bytes: Uint8Array): string | undefined {
  const n = headerLength(bytes);
  if (n < 0) return undefined;
  const text = utf8.decode(bytes.subarray(8, 8 + n));
  const memo = n <= MEMO_HEADER_BYTES;
  if (memo && headers.has(text)) return headers.get(text);
  const request = JSON.parse(text)?.__metadata__?.request;
  const id = typeof request === "string" ? JSON.parse(request)?.kv_cache : undefined;
  const found = typeof id === "string" ? id : undefined;
  if (memo) {
    if (headers.size >= HEADER_MEMO) headers.delete(headers.keys().next().value!);
    headers.set(text, found);
  }
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

/**
 * Whether the string token b[i, end) means the key whose JSON token is `raw`: the same bytes,
 * or, for a token with escapes no longer than the key with every character escaped, the same
 * text once decoded.
 */
function tokenIs(b: Uint8Array, i: number, end: number, raw: Uint8Array, key: string): boolean {
  const n = end - i;
  if (n === raw.length) {
    let k = 0;
    while (k < n && b[i + k] === raw[k]) k++;
    if (k === n) return true;
  }
  if (n <= raw.length || n > 6 * (raw.length - 2) + 2) return false;
  if (b.subarray(i, end).indexOf(0x5c) < 0) return false;
  return JSON.parse(utf8.decode(b.subarray(i, end))) === key;
}

/** The last top-level member `key` of the JSON object in `b` whose value is a string. */
export function topLevelString(b: Uint8Array, key: string): string | undefined {
  const raw = new TextEncoder().encode(JSON.stringify(key));
  let i = b[0] === 0xef && b[1] === 0xbb && b[2] === 0xbf ? 3 : 0; // a byte order mark
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
        const isKey = tokenIs(b, i, end, raw, key);
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

/** Whether {@link findForwardCacheId} scans `bytes` on the calling thread. */
export function scansHere(bytes: Uint8Array, safetensors: boolean): boolean {
  return safetensors
    ? headerLength(bytes) <= MEMO_HEADER_BYTES
    : bytes.byteLength <= SYNC_SCAN_BYTES;
}

/** A scan worker: takes a buffer, gives it back with what it found. */
export interface ScanWorker {
  scan(bytes: Uint8Array, safetensors: boolean): Promise<{ id?: string; bytes: Uint8Array }>;
  close(): void;
}

/** A scan worker on a thread of its own (cache_id_worker.ts), started on first use. */
export function scanWorker(): ScanWorker {
  let w: Worker | null = null;
  let next = 0;
  const waiting = new Map<number, (m: { id?: string; bytes: Uint8Array }) => void>();
  const start = () => {
    const worker = new Worker(new URL("./cache_id_worker.ts", import.meta.url), {
      type: "module",
    });
    worker.onmessage = (e) => {
      const { n, buffer, offset, length, id } = e.data;
      waiting.get(n)?.({ id, bytes: new Uint8Array(buffer, offset, length) });
      waiting.delete(n);
    };
    return worker;
  };
  return {
    scan(bytes, safetensors) {
      w ??= start();
      const n = next++;
      const buffer = bytes.buffer as ArrayBuffer;
      const m = { n, buffer, offset: bytes.byteOffset, length: bytes.byteLength, safetensors };
      return new Promise((resolve) => {
        waiting.set(n, resolve);
        w!.postMessage(m, [buffer]);
      });
    },
    close() {
      w?.terminate();
      w = null;
    },
  };
}

/**
 * The `kv_cache` a forward body names: small bodies here, big ones on `worker` (the bytes then
 * come back in a new view of the same memory: use the returned `bytes`).
 */
export async function findForwardCacheId(
  bytes: Uint8Array,
  safetensors: boolean,
  worker: ScanWorker,
): Promise<{ id?: string; bytes: Uint8Array }> {
  if (scansHere(bytes, safetensors)) return { id: forwardCacheId(bytes, safetensors), bytes };
  return await worker.scan(bytes, safetensors);
}
