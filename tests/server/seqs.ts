/**
 * Paged sequences for forward tests over HTTP: the K/V written per request and position, and
 * each step's body with its float64 reference (helpers.ts's refAttention).
 * @module
 */
import type { ForwardBody } from "../../client/client.ts";
import { rand, refAttention, type RefOptions, to3d } from "./helpers.ts";

/** The layer and cache shape of the forward tests. */
export const H = 4, HKV = 2, D = 8, BS = 4, NB = 10;
/** Logical → physical blocks per request; unused columns hold an out-of-range id on purpose. */
export const TABLE = [[7, 2, 999], [5, 9, 1]];

/** The K/V the test wrote, per request and position, and the request's queries per step. */
export class Seqs {
  k: number[][][][] = TABLE.map(() => []);
  v: number[][][][] = TABLE.map(() => []);
  constructor(readonly round: (x: number) => number) {}
  slot(r: number, p: number): number {
    return TABLE[r][Math.floor(p / BS)] * BS + (p % BS);
  }
  /** A step adding `lens[r]` tokens to request r; returns the body and the reference output. */
  step(lens: number[], dtype: ForwardBody["dtype"], extra: RefOptions = {}) {
    const T = lens.reduce((a, b) => a + b, 0);
    const q = rand(T * H * D).map(this.round), k = rand(T * HKV * D).map(this.round);
    const v = rand(T * HKV * D).map(this.round);
    const q3 = to3d(q, T, H, D), k3 = to3d(k, T, HKV, D), v3 = to3d(v, T, HKV, D);
    const qsl = [0], slots: number[] = [], seq: number[] = [];
    const refOut: number[] = [], refLse: number[][] = Array.from({ length: H }, () => []);
    let t = 0;
    lens.forEach((n, r) => {
      for (let i = 0; i < n; i++, t++) {
        slots.push(this.slot(r, this.k[r].length));
        this.k[r].push(k3[t]);
        this.v[r].push(v3[t]);
      }
      qsl.push(t);
      seq.push(this.k[r].length);
      const ref = refAttention({ q: q3.slice(t - n, t), k: this.k[r], v: this.v[r] }, extra);
      refOut.push(...ref.out.flat(2));
      ref.lse.forEach((row, h) => refLse[h].push(...row));
    });
    const body: ForwardBody = {
      dtype,
      layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
      query: { dtype, shape: [T, H, D], data: q },
      key: { dtype, shape: [T, HKV, D], data: k },
      value: { dtype, shape: [T, HKV, D], data: v },
      metadata: { query_start_loc: qsl, seq_lens: seq, block_table: TABLE, slot_mapping: slots },
      return_lse: true,
    };
    return { body, refOut, refLse: refLse.flat(), T };
  }
}
