/**
 * The HTTP bench's workload, as a model runner would produce it: the shape (requests, context,
 * heads, prefill chunking, decode steps, clients), the paged layout of every client's cache
 * (one shared random block table, block 0 never used), and the data of each call drawn from a
 * seed, so that a worker sending a call and the checker recomputing it agree without sharing
 * memory.
 *
 * Data are float16 bit patterns drawn directly (no rounding): keys and values with magnitudes
 * in [0.125, 2), queries in [0.5, 8), random signs. With head 128 that makes attention over
 * 2048 keys moderately peaked (about 60 keys carry 90% of the weight; outputs' RMS ≈ 0.35), so
 * a wrong key or position moves the output by more than the f16 tolerance.
 * @module
 */
import { Rng } from "../tests/support/rng.ts";

/** What one run sends. */
export interface HttpShape {
  /** Requests in every decode step (each cache holds this many sequences). */
  reqs: number;
  /** Context of every request after prefill. */
  ctx: number;
  num_heads: number;
  num_kv_heads: number;
  head_size: number;
  block_size: number;
  /** A prefill call carries up to this many requests ... */
  prefill_reqs: number;
  /** ... and up to this many new tokens of each. */
  prefill_tokens: number;
  /** Timed decode steps per client, in each decode phase. */
  steps: number;
  /** Concurrent clients (each with its own caches) in the concurrent phase. */
  clients: number;
  /** Layers per client: each its own cache, each step one call per layer (same metadata). */
  layers: number;
}

/** The H200 shape of issue 7: 32 x 2048, 32 q / 8 kv heads, head 128, 4 x 2048 prefill calls. */
export const BIG_SHAPE: HttpShape = {
  reqs: 32,
  ctx: 2048,
  num_heads: 32,
  num_kv_heads: 8,
  head_size: 128,
  block_size: 16,
  prefill_reqs: 4,
  prefill_tokens: 2048,
  steps: 64,
  clients: 8,
  layers: 1,
};

/** For software adapters (llvmpipe / lavapipe). */
export const SMALL_SHAPE: HttpShape = {
  reqs: 8,
  ctx: 256,
  num_heads: 8,
  num_kv_heads: 2,
  head_size: 128,
  block_size: 16,
  prefill_reqs: 2,
  prefill_tokens: 256,
  steps: 16,
  clients: 8,
  layers: 1,
};

/** The paged layout every cache of a run shares. */
export interface Layout {
  /** Blocks per request: room for ctx + 2 * steps tokens (client 0 decodes in both phases). */
  max_blocks: number;
  num_blocks: number;
  /** [reqs, max_blocks], a random permutation of blocks 1..num_blocks-1. */
  block_table: Int32Array;
}

/** The layout of a shape (seeded). */
export function layoutOf(s: HttpShape, seed: number): Layout {
  const max_blocks = Math.ceil((s.ctx + 2 * s.steps) / s.block_size);
  const num_blocks = 1 + s.reqs * max_blocks;
  const perm = new Rng(seed ^ 0x5bd1e995).shuffle(
    Array.from({ length: num_blocks - 1 }, (_, i) => i + 1),
  );
  return { max_blocks, num_blocks, block_table: Int32Array.from(perm) };
}

/** The cache slot of request `r`'s position `pos`. */
export function slotOf(s: HttpShape, l: Layout, r: number, pos: number): number {
  return l.block_table[r * l.max_blocks + Math.floor(pos / s.block_size)] * s.block_size +
    pos % s.block_size;
}

/** Bytes of K+V one cache holds (f16). */
export function cacheBytes(s: HttpShape, l: Layout): number {
  return l.num_blocks * s.block_size * s.num_kv_heads * s.head_size * 2 * 2;
}

/** n random float16 bit patterns: sign random, exponent field e0..e0+3, mantissa random. */
export function randomF16(seed: number, n: number, e0: number): Uint16Array {
  const out = new Uint16Array(n);
  const rng = new Rng(seed);
  const bits = (b: number) => ((b >> 12) & 1) << 15 | (e0 + ((b >> 10) & 3)) << 10 | (b & 0x3ff);
  for (let i = 0; i < n; i += 2) {
    const u = rng.u32();
    out[i] = bits(u & 0xffff);
    if (i + 1 < n) out[i + 1] = bits(u >>> 16);
  }
  return out;
}

/** Exponent fields: keys/values in [0.125, 2), queries in [0.5, 8). */
export const KV_EXP = 12, Q_EXP = 14;

/** A per-purpose seed (FNV-1a over the label, mixed with the run seed). */
export function seedOf(seed: number, ...label: (string | number)[]): number {
  let h = (seed ^ 0x811c9dc5) >>> 0;
  for (const ch of label.join(":")) h = Math.imul(h ^ ch.charCodeAt(0), 0x01000193) >>> 0;
  return h;
}

/** The prefill K and V of request r: [ctx, num_kv_heads, head_size] each. */
export function contextKv(
  s: HttpShape,
  seed: number,
  r: number,
): { k: Uint16Array; v: Uint16Array } {
  const n = s.ctx * s.num_kv_heads * s.head_size;
  return {
    k: randomF16(seedOf(seed, "pk", r), n, KV_EXP),
    v: randomF16(seedOf(seed, "pv", r), n, KV_EXP),
  };
}

/** One prefill call: requests [r0, r0 + n), new positions [p0, p0 + len) of each. */
export interface Chunk {
  index: number;
  r0: number;
  n: number;
  p0: number;
  len: number;
}

/** The prefill calls that fill one cache, in order (later token chunks after earlier ones). */
export function chunksOf(s: HttpShape): Chunk[] {
  const out: Chunk[] = [];
  for (let r0 = 0; r0 < s.reqs; r0 += s.prefill_reqs) {
    for (let p0 = 0; p0 < s.ctx; p0 += s.prefill_tokens) {
      const n = Math.min(s.prefill_reqs, s.reqs - r0), len = Math.min(s.prefill_tokens, s.ctx - p0);
      out.push({ index: out.length, r0, n, p0, len });
    }
  }
  return out;
}

/** A chunk's queries: [n * len, num_heads, head_size] (request-major). */
export function chunkQuery(s: HttpShape, seed: number, c: Chunk): Uint16Array {
  return randomF16(seedOf(seed, "pq", c.r0, c.p0), c.n * c.len * s.num_heads * s.head_size, Q_EXP);
}

/** One decode step's data for cache `cache`: q [reqs, H, D], k and v [reqs, Hkv, D]. */
export function stepData(
  s: HttpShape,
  seed: number,
  cache: number,
  step: number,
): { q: Uint16Array; k: Uint16Array; v: Uint16Array } {
  const kvn = s.reqs * s.num_kv_heads * s.head_size;
  return {
    q: randomF16(seedOf(seed, "dq", cache, step), s.reqs * s.num_heads * s.head_size, Q_EXP),
    k: randomF16(seedOf(seed, "dk", cache, step), kvn, KV_EXP),
    v: randomF16(seedOf(seed, "dv", cache, step), kvn, KV_EXP),
  };
}
