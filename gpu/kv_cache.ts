/**
 * The paged KV cache on the GPU. K and V each span NCHUNK storage buffers holding the same
 * bytes as a host cache (storage-dtype little-endian, NHD or HND), whole blocks per chunk:
 * `blocks_per_chunk = floor(min(maxStorageBufferBindingSize, maxBufferSize) / block_bytes)`.
 * Kernels bind k0..k{N-1}, v0..v{N-1} and use the accessor from {@link kvAccessors}; how a
 * cache splits into chunks is gpu/kv_chunks.ts.
 * @module
 */
import { trace } from "../core/trace.ts";
import { cacheDestroyed, DeviceUnavailableError, ServiceError } from "../core/errors.ts";
import { checkCacheSpec } from "../core/cache_spec.ts";
import type { GpuContext, KvCache, KvCacheSpec } from "../core/types.ts";
import { onDeviceLost } from "./device.ts";
import { wakeDawnPoll } from "./dawn_tick_pace.ts";
import { type KvAccessorOptions, kvAccessors } from "./wgsl.ts";
import { chunkKeyOf, type KvChunkGeometry, kvChunkGeometry } from "./kv_chunks.ts";

export {
  chunkKeyOf,
  KV_RESERVED_STORAGE_BINDINGS,
  type KvChunkGeometry,
  kvChunkGeometry,
  MAX_KV_CHUNK_BYTES,
  MAX_KV_CHUNKS,
} from "./kv_chunks.ts";
import { inErrorScopes } from "./error_scopes.ts";

/** Options of {@link GpuKvCache.create} / {@link GpuKvCache.fromBytes}. */
export interface GpuKvCacheOptions {
  /** Caps blocks per chunk (tests use it to force several chunks on small caches). */
  maxBlocksPerChunk?: number;
  /** Buffer label prefix. */
  label?: string;
}

/**
 * Whether `b` holds an fp8 e4m3 NaN byte (S.1111.111): its low 7 bits plus one carry into bit 7,
 * four bytes a step.
 */
export function hasE4m3Nan(b: Uint8Array): boolean {
  const need = (4 - (b.byteOffset % 4)) % 4; // bytes before the first aligned word
  const head = Math.min(b.byteLength, need);
  const words = head < need ? 0 : Math.floor((b.byteLength - head) / 4);
  const nan = (x: number) => (x & 0x7f) === 0x7f;
  for (let i = 0; i < head; i++) if (nan(b[i])) return true;
  if (words > 0) {
    const w = new Uint32Array(b.buffer, b.byteOffset + head, words);
    for (let i = 0; i < words; i++) {
      if ((((w[i] & 0x7f7f7f7f) + 0x01010101) & 0x80808080) !== 0) return true;
    }
  }
  for (let i = head + 4 * words; i < b.byteLength; i++) if (nan(b[i])) return true;
  return false;
}

/** A paged KV cache in GPU buffers (storage "webgpu"). */
export class GpuKvCache implements KvCache {
  readonly spec: KvCacheSpec;
  readonly storage = "webgpu" as const;
  readonly ctx: GpuContext;
  readonly geometry: KvChunkGeometry;
  /** K chunk buffers (STORAGE | COPY_SRC | COPY_DST). */
  readonly keyBuffers: GPUBuffer[];
  /** V chunk buffers. */
  readonly valueBuffers: GPUBuffer[];
  #destroyed = false;
  #lost = false;
  #nanFree: boolean;
  #unlisten: () => void;

  private constructor(
    ctx: GpuContext,
    spec: KvCacheSpec,
    g: KvChunkGeometry,
    k: GPUBuffer[],
    v: GPUBuffer[],
  ) {
    this.ctx = ctx;
    this.spec = { ...spec };
    this.geometry = g;
    this.keyBuffers = k;
    this.valueBuffers = v;
    // Created zeroed: no NaN byte until something other than the cache writer writes one.
    this.#nanFree = g.storage_dtype === "fp8_e4m3";
    this.#unlisten = onDeviceLost(ctx, () => {
      this.#lost = true;
    });
  }

  /**
   * An empty (zeroed) cache on `ctx`'s device.
   * @throws ServiceError 422 `invalid_cache_spec` (core/cache_spec.ts), 422 (see
   *   {@link kvChunkGeometry}); 503 when the device is lost or out of memory.
   */
  static async create(
    ctx: GpuContext,
    spec: KvCacheSpec,
    opts: GpuKvCacheOptions = {},
  ): Promise<GpuKvCache> {
    if (ctx.lost) throw new DeviceUnavailableError("the WebGPU device was lost");
    checkCacheSpec(spec);
    const g = kvChunkGeometry(ctx, spec, opts);
    const label = opts.label ?? "kv";
    const dev = ctx.device;
    const make = (t: string) =>
      g.chunk_bytes.map((size, c) =>
        dev.createBuffer({
          label: `${label}.${t}${c}`,
          size,
          usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
        })
      );
    const made = inErrorScopes(dev, ["validation", "out-of-memory"], () => [make("k"), make("v")]);
    const [k, v] = made.value;
    const [validation, oom] = await made.errors;
    if (validation || oom) {
      for (const b of [...k, ...v]) b.destroy();
      const why = (oom ?? validation)!.message;
      throw new ServiceError(`could not allocate a GPU KV cache of ${g.bytes} B: ${why}`, {
        status: oom ? 503 : 422,
        code: oom ? "device_out_of_memory" : "kv_cache_too_large",
        extra: { bytes: g.bytes },
      });
    }
    return new GpuKvCache(ctx, spec, g, k, v);
  }

  /**
   * A cache holding `key` and `value` (layout-order bytes of the storage dtype, each
   * num_blocks * block_bytes long).
   * @throws ServiceError 422 `invalid_kv_cache` when a length disagrees with the spec.
   */
  static async fromBytes(
    ctx: GpuContext,
    spec: KvCacheSpec,
    key: Uint8Array,
    value: Uint8Array,
    opts: GpuKvCacheOptions = {},
  ): Promise<GpuKvCache> {
    checkCacheSpec(spec);
    const g = kvChunkGeometry(ctx, spec, opts);
    const want = g.bytes / 2;
    for (const [name, b] of [["key_cache", key], ["value_cache", value]] as const) {
      if (b.byteLength !== want) {
        throw new ServiceError(`${name} has ${b.byteLength} bytes but the spec needs ${want}`, {
          status: 422,
          code: "invalid_kv_cache",
          issues: [{ path: [name], message: `has ${b.byteLength} bytes, expected ${want}` }],
        });
      }
    }
    const cache = await GpuKvCache.create(ctx, spec, opts);
    cache.#upload(cache.keyBuffers, key);
    cache.#upload(cache.valueBuffers, value);
    cache.#nanFree &&= !hasE4m3Nan(key) && !hasE4m3Nan(value);
    return cache;
  }

  /** See {@link KvCache.fp8_nan_free}: an e4m3 cache with no NaN byte (false for other dtypes). */
  get fp8_nan_free(): boolean {
    return this.#nanFree;
  }

  #upload(bufs: GPUBuffer[], bytes: Uint8Array): void {
    const per = this.geometry.blocks_per_chunk * this.geometry.block_bytes;
    bufs.forEach((b, c) => {
      const start = c * per;
      const n = Math.min(per, bytes.byteLength - start);
      if (n > 0) {
        this.ctx.device.queue.writeBuffer(b, 0, bytes as Uint8Array<ArrayBuffer>, start, n);
      }
    });
  }

  /** Bytes of K plus V. */
  get bytes(): number {
    return this.geometry.bytes;
  }

  /** True once the device holding it was lost. */
  get lost(): boolean {
    return this.#lost || this.ctx.lost;
  }

  /** True once destroyed. */
  get destroyed(): boolean {
    return this.#destroyed;
  }

  /**
   * Throws unless the cache can be used on `ctx` now.
   * @throws ServiceError 409 `cache_destroyed` once destroyed (as a host cache does);
   *   DeviceUnavailableError 503 when its device was lost or `ctx` is another device.
   */
  assertUsable(ctx?: GpuContext | null): void {
    if (this.#destroyed) throw cacheDestroyed();
    if (this.lost) throw new DeviceUnavailableError("the KV cache's WebGPU device was lost");
    if (ctx && ctx.device !== this.ctx.device) {
      throw new DeviceUnavailableError("the KV cache belongs to an earlier WebGPU device");
    }
  }

  /**
   * Bind-group entries for k0..k{N-1} at `firstBinding`.., then v0..v{N-1}: the order
   * {@link kvAccessors} declares them in.
   */
  bindEntries(firstBinding: number): GPUBindGroupEntry[] {
    return [...this.keyBuffers, ...this.valueBuffers].map((buffer, i) => ({
      binding: firstBinding + i,
      resource: { buffer },
    }));
  }

  /** The chunk buffers by binding name (`k0..`, `v0..`), as kvBindingDecls names them. */
  bindMap(): Record<string, GPUBuffer> {
    const m: Record<string, GPUBuffer> = {};
    this.keyBuffers.forEach((b, i) => (m[`k${i}`] = b));
    this.valueBuffers.forEach((b, i) => (m[`v${i}`] = b));
    return m;
  }

  /** The WGSL bindings and accessors for this cache (see {@link kvAccessors}). */
  accessorWgsl(o: Omit<KvAccessorOptions, "nchunk" | "blocksPerChunk" | "blockWords">): string {
    return kvAccessors({
      ...o,
      nchunk: this.geometry.nchunk,
      blocksPerChunk: this.geometry.blocks_per_chunk,
      blockWords: this.geometry.block_words,
    });
  }

  /** A key naming the chunk layout, e.g. `c1` or `c3x512` (see {@link chunkKeyOf}). */
  get chunkKey(): string {
    return chunkKeyOf(this.geometry);
  }

  /**
   * K and V as layout-order bytes: copies into MAP_READ staging (one buffer unless the cache
   * exceeds maxBufferSize), one submit, one mapAsync per staging buffer.
   */
  async read(): Promise<{ key: Uint8Array; value: Uint8Array }> {
    this.assertUsable();
    const half = this.geometry.bytes / 2;
    const out = { key: new Uint8Array(half), value: new Uint8Array(half) };
    const dev = this.ctx.device;
    const maxStage = Math.max(4, Math.min(this.ctx.limits.maxBufferSize ?? 2 ** 28, 2 ** 31));
    // Pieces: [buffer, bytes, destination, destination offset], packed into staging groups.
    const per = this.geometry.blocks_per_chunk * this.geometry.block_bytes;
    const groups: { size: number; parts: [GPUBuffer, number, Uint8Array, number, number][] }[] = [];
    for (
      const [bufs, dst] of [[this.keyBuffers, out.key], [this.valueBuffers, out.value]] as const
    ) {
      bufs.forEach((b, c) => {
        const n = Math.min(per, half - c * per);
        if (n <= 0) return;
        let g = groups[groups.length - 1];
        if (!g || g.size + n > maxStage) groups.push(g = { size: 0, parts: [] });
        g.parts.push([b, n, dst, c * per, g.size]);
        g.size += n;
      });
    }
    if (groups.length === 0) return out;
    const staging = groups.map((g, i) =>
      dev.createBuffer({
        label: `kv.readback${i}`,
        size: g.size,
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      })
    );
    try {
      const enc = dev.createCommandEncoder({ label: "kv.read" });
      groups.forEach((g, i) => {
        for (const [b, n, , , so] of g.parts) enc.copyBufferToBuffer(b, 0, staging[i], so, n);
      });
      dev.queue.submit([enc.finish()]);
      trace("kv cache read: submitted");
      wakeDawnPoll();
      await Promise.all(staging.map((s) => s.mapAsync(GPUMapMode.READ)));
      trace("kv cache read: mapped");
      groups.forEach((g, i) => {
        const bytes = new Uint8Array(staging[i].getMappedRange());
        for (const [, n, dst, doff, so] of g.parts) dst.set(bytes.subarray(so, so + n), doff);
        staging[i].unmap();
      });
      return out;
    } finally {
      for (const s of staging) s.destroy();
    }
  }

  /** Frees the buffers (idempotent). */
  destroy(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    this.#unlisten();
    for (const b of [...this.keyBuffers, ...this.valueBuffers]) b.destroy();
  }
}
