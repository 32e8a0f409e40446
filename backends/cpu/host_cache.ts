/**
 * The host KV cache: K and V as raw little-endian bytes of the storage dtype, in the spec's
 * layout order, exactly the bytes a safetensors export or a GPU buffer of the same cache
 * holds. NHD is `[blocks, block_size, kv_heads, head]`, HND `[blocks, kv_heads, block_size,
 * head]`; either way one (block, slot, kv head) row is `head_size` contiguous elements.
 *
 * K and V each live in a `SharedArrayBuffer`, so a Web Worker can read and write the same
 * memory in place: {@link HostKvCache.handle} names the memory (posting it to a worker shares
 * it, copying nothing) and {@link HostKvCache.attach} opens a second view of it there. Whoever
 * holds the cache serialises writers (the service's per-cache mutex); the cache itself has no
 * lock. {@link HostKvCache.read} returns copies in ordinary ArrayBuffers.
 *
 * Element access goes through typed views made once over the buffers, so a row read or write
 * costs no allocation; a row outside the cache is a RangeError (checked once per row, not per
 * element). Writes round to the storage dtype with core/dtype.ts (nearest even; fp8 saturates).
 * The per-dtype codecs that read and write elements are backends/cpu/element_codec.ts.
 * @module
 */
import { bytesPerElement, resolveStorage } from "../../core/dtype.ts";
import { cacheDestroyed, invalidBatch, ServiceError } from "../../core/errors.ts";
import { checkCacheSpec } from "../../core/cache_spec.ts";
import type { KvCache, KvCacheSpec, StorageDType } from "../../core/types.ts";
import { codecFor, type ElementCodec } from "./element_codec.ts";

/** Which half of the cache. */
export type KvWhich = "key" | "value";

/** What a worker needs to open a {@link HostKvCache}'s memory: its spec and shared buffers. */
export interface HostCacheHandle {
  spec: KvCacheSpec;
  key: SharedArrayBuffer;
  value: SharedArrayBuffer;
}

/** Bytes of one of K or V for a spec. */
export function cacheHalfBytes(spec: KvCacheSpec): number {
  const elems = spec.num_blocks * spec.block_size * spec.num_kv_heads * spec.head_size;
  return elems * bytesPerElement(resolveStorage(spec.kv_cache_dtype, spec.dtype));
}

/**
 * The most bytes one of K or V may hold: the largest length a `SharedArrayBuffer` takes (V8 on
 * 64-bit: 2^53 - 1; a longer one is a RangeError, "Invalid array buffer length").
 */
export const HOST_CACHE_MAX_TENSOR_BYTES = Number.MAX_SAFE_INTEGER;

/** The 422 `kv_cache_too_large` of a host cache (the GPU cache's code, gpu/kv_cache.ts). */
function tooLarge(message: string, extra: Record<string, unknown>): ServiceError {
  return new ServiceError(message, { status: 422, code: "kv_cache_too_large", extra });
}

/**
 * Checks `spec` (core/cache_spec.ts) and answers the bytes of one of its K or V, refusing,
 * before anything is allocated, a cache no ArrayBuffer could hold.
 * @throws ServiceError 422 `invalid_cache_spec`; 422 `kv_cache_too_large` (`bytes`: K and V
 *   together, `max_bytes`) when a tensor needs more than {@link HOST_CACHE_MAX_TENSOR_BYTES}.
 */
export function hostCacheHalfBytes(spec: KvCacheSpec): number {
  checkCacheSpec(spec);
  const n = cacheHalfBytes(spec);
  if (n <= HOST_CACHE_MAX_TENSOR_BYTES) return n;
  const max = HOST_CACHE_MAX_TENSOR_BYTES;
  throw tooLarge(
    `a host KV cache of ${spec.num_blocks} blocks needs ${n} B per tensor (K and V each, ` +
      `${2 * n} B in all), over the ${max} B one ArrayBuffer can hold`,
    { bytes: 2 * n, max_bytes: 2 * max },
  );
}

/**
 * `n` zeroed bytes in a new SharedArrayBuffer for each of K and V.
 * @throws ServiceError 422 `kv_cache_too_large` (`bytes`: K and V together) when the host
 *   cannot allocate them (V8's RangeError "Array buffer allocation failed").
 */
function sharedPair(n: number): [Uint8Array<SharedArrayBuffer>, Uint8Array<SharedArrayBuffer>] {
  try {
    return [new Uint8Array(new SharedArrayBuffer(n)), new Uint8Array(new SharedArrayBuffer(n))];
  } catch (e) {
    if (!(e instanceof RangeError)) throw e;
    throw tooLarge(`could not allocate a host KV cache of ${2 * n} B: ${e.message}`, {
      bytes: 2 * n,
    });
  }
}

/** A paged KV cache held in host memory (storage "host"). */
export class HostKvCache implements KvCache {
  readonly spec: KvCacheSpec;
  readonly storage = "host" as const;
  /** The element type the bytes hold (`auto` resolved to the data dtype). */
  readonly storage_dtype: StorageDType;
  /** Raw K bytes, layout order (a view of shared memory). */
  readonly key: Uint8Array<SharedArrayBuffer>;
  /** Raw V bytes, layout order (a view of shared memory). */
  readonly value: Uint8Array<SharedArrayBuffer>;
  #codec: Record<KvWhich, ElementCodec>;
  #destroyed = false;

  private constructor(
    spec: KvCacheSpec,
    key: Uint8Array<SharedArrayBuffer>,
    value: Uint8Array<SharedArrayBuffer>,
  ) {
    this.spec = { ...spec };
    this.storage_dtype = resolveStorage(spec.kv_cache_dtype, spec.dtype);
    this.key = key;
    this.value = value;
    this.#codec = {
      key: codecFor(this.storage_dtype, key),
      value: codecFor(this.storage_dtype, value),
    };
  }

  /**
   * A zero-filled cache for `spec`.
   * @throws ServiceError 422 `invalid_cache_spec`; 422 `kv_cache_too_large` when the host
   *   cannot hold or allocate it (see {@link hostCacheHalfBytes}).
   */
  static create(spec: KvCacheSpec): HostKvCache {
    const [k, v] = sharedPair(hostCacheHalfBytes(spec));
    return new HostKvCache(spec, k, v);
  }

  /**
   * A cache holding copies of caller bytes; each half must be exactly the spec's size.
   * @throws ServiceError 422 as {@link create}; 422 `invalid_batch` when a length disagrees.
   */
  static fromBytes(spec: KvCacheSpec, key: Uint8Array, value: Uint8Array): HostKvCache {
    const n = hostCacheHalfBytes(spec);
    const issues = [];
    if (key.byteLength !== n) {
      issues.push({ path: ["key_cache"], message: `has ${key.byteLength} bytes, expected ${n}` });
    }
    if (value.byteLength !== n) {
      issues.push({
        path: ["value_cache"],
        message: `has ${value.byteLength} bytes, expected ${n}`,
      });
    }
    if (issues.length) throw invalidBatch(issues);
    const [k, v] = sharedPair(n);
    k.set(key);
    v.set(value);
    return new HostKvCache(spec, k, v);
  }

  /**
   * A second view of the memory a {@link handle} names (in a worker, say): no copy, writes are
   * seen by every view.
   * @throws ServiceError 422 as {@link create}; 422 `invalid_batch` when the buffers do not fit
   *   the spec.
   */
  static attach(h: HostCacheHandle): HostKvCache {
    const n = hostCacheHalfBytes(h.spec);
    if (h.key.byteLength !== n || h.value.byteLength !== n) {
      throw invalidBatch([{
        path: ["kv_cache"],
        message:
          `shared buffers hold ${h.key.byteLength} and ${h.value.byteLength} bytes, expected ${n}`,
      }]);
    }
    return new HostKvCache(h.spec, new Uint8Array(h.key), new Uint8Array(h.value));
  }

  /**
   * The cache's memory as a handle to post to a worker: the buffers are shared, not copied.
   * @throws ServiceError 409 `cache_destroyed` once destroyed.
   */
  handle(): HostCacheHandle {
    this.#alive();
    return { spec: { ...this.spec }, key: this.key.buffer, value: this.value.buffer };
  }

  /** Bytes of K plus V. */
  get bytes(): number {
    return this.key.byteLength + this.value.byteLength;
  }

  /** True once destroyed. */
  get destroyed(): boolean {
    return this.#destroyed;
  }

  /**
   * Element index of the first element of the (block, slot, kvHead) row, either layout.
   * @throws RangeError when block, slot or kvHead is not an integer inside the cache (a caller
   *   fault: the backends check a batch's slots and block ids before they touch a row).
   */
  offset(block: number, slot: number, kvHead: number): number {
    const s = this.spec;
    if (!(Number.isInteger(block) && block >= 0 && block < s.num_blocks)) {
      throw new RangeError(`block ${block} is outside the cache (${s.num_blocks} blocks)`);
    }
    if (!(Number.isInteger(slot) && slot >= 0 && slot < s.block_size)) {
      throw new RangeError(`slot ${slot} is outside a block (block_size ${s.block_size})`);
    }
    if (!(Number.isInteger(kvHead) && kvHead >= 0 && kvHead < s.num_kv_heads)) {
      throw new RangeError(`kv head ${kvHead} is outside the cache (${s.num_kv_heads} kv heads)`);
    }
    return s.layout === "NHD"
      ? ((block * s.block_size + slot) * s.num_kv_heads + kvHead) * s.head_size
      : ((block * s.num_kv_heads + kvHead) * s.block_size + slot) * s.head_size;
  }

  /**
   * Decodes one row's stored values (no fp8 scale applied) into `out` (head_size long,
   * created when omitted) and returns it.
   */
  readRow(
    which: KvWhich,
    block: number,
    slot: number,
    kvHead: number,
    out: Float64Array = new Float64Array(this.spec.head_size),
  ): Float64Array {
    this.#alive();
    const c = this.#codec[which], o = this.offset(block, slot, kvHead);
    for (let d = 0; d < this.spec.head_size; d++) out[d] = c.get(o + d);
    return out;
  }

  /** Stores one row: `values[from .. from + head_size)`, each rounded to the storage dtype. */
  writeRow(
    which: KvWhich,
    block: number,
    slot: number,
    kvHead: number,
    values: ArrayLike<number>,
    from = 0,
  ): void {
    this.#alive();
    const c = this.#codec[which], o = this.offset(block, slot, kvHead);
    for (let d = 0; d < this.spec.head_size; d++) c.set(o + d, values[from + d]);
  }

  /** The raw bytes of one (block, slot, kvHead) row: a view, not a copy. */
  rowBytes(which: KvWhich, block: number, slot: number, kvHead: number): Uint8Array {
    const n = this.spec.head_size * bytesPerElement(this.storage_dtype);
    const o = this.offset(block, slot, kvHead) * bytesPerElement(this.storage_dtype);
    return this[which].subarray(o, o + n);
  }

  /** Copies of the raw K and V bytes (in ordinary, unshared ArrayBuffers). */
  read(): Promise<{ key: Uint8Array; value: Uint8Array }> {
    this.#alive();
    return Promise.resolve({ key: this.key.slice(), value: this.value.slice() });
  }

  /**
   * Marks this view unusable (the bytes are left to the garbage collector once no view of
   * them is left). Other views made by {@link attach} are separate objects.
   */
  destroy(): void {
    this.#destroyed = true;
  }

  #alive(): void {
    if (this.#destroyed) throw cacheDestroyed();
  }
}
