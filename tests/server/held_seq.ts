/**
 * One request's sequence on a server-held cache, step by step, with its float64 reference:
 * each {@link HeldSeq.step} adds tokens (fresh random float32 values) at the next positions,
 * and returns the forward body (no `kv_cache`: the caller names the cache) and the reference
 * output over everything written so far. {@link HeldSeq.cacheSpec} is the cache it needs.
 * @module
 */
import type { ForwardBody } from "../../client/client.ts";
import type { CreateCacheRequest } from "../../wire/types.ts";
import { rand, refAttention, to3d } from "./helpers.ts";

/** Heads, kv heads, head size, block size, blocks, and the request's block table. */
const H = 2, HKV = 1, D = 8, BS = 4, NB = 6;
const TABLE = [3, 0, 5, 1];

/** A request's keys, values and positions so far. */
export class HeldSeq {
  k: number[][][] = [];
  v: number[][][] = [];

  /** The cache a sequence runs on. */
  static cacheSpec(): CreateCacheRequest {
    return { num_blocks: NB, block_size: BS, num_kv_heads: HKV, head_size: D, dtype: "float32" };
  }

  /** A step of `n` new tokens: the body and the reference output `[n, H, D]` flattened. */
  step(n: number): { body: ForwardBody; ref: number[] } {
    const q = rand(n * H * D).map(Math.fround), k = rand(n * HKV * D).map(Math.fround);
    const v = rand(n * HKV * D).map(Math.fround);
    const slots: number[] = [];
    for (let i = 0; i < n; i++) {
      const p = this.k.length;
      slots.push(TABLE[Math.floor(p / BS)] * BS + (p % BS));
      this.k.push(to3d(k, n, HKV, D)[i]);
      this.v.push(to3d(v, n, HKV, D)[i]);
    }
    const ref = refAttention({ q: to3d(q, n, H, D), k: this.k, v: this.v }).out.flat(2);
    const body: ForwardBody = {
      dtype: "float32",
      layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
      query: { dtype: "float32", shape: [n, H, D], data: q },
      key: { dtype: "float32", shape: [n, HKV, D], data: k },
      value: { dtype: "float32", shape: [n, HKV, D], data: v },
      metadata: {
        query_start_loc: [0, n],
        seq_lens: [this.k.length],
        block_table: [TABLE],
        slot_mapping: slots,
      },
    };
    return { body, ref };
  }
}
