/**
 * The forward inputs the host profiles time (bench/host_profile.ts, bench/host_hot.ts): one
 * call's request on a server-held f16 cache at a bench/http_workload.ts shape, with fresh
 * random query/key/value.
 * @module
 */
import { dataArray } from "../core/data.ts";
import type { ForwardInput } from "../service/validate.ts";
import { type HttpShape, KV_EXP, type Layout, Q_EXP, randomF16, slotOf } from "./http_workload.ts";

const f16Tensor = (bits: Uint16Array, shape: number[]) => ({
  dtype: "float16" as const,
  shape,
  array: dataArray("float16", new Uint8Array(bits.buffer, bits.byteOffset, bits.byteLength)),
  encoding: "binary" as const,
});
const ints = (v: ArrayLike<number>, shape = [v.length]) => ({ shape, values: Int32Array.from(v) });

/** One call's request: `reqs` requests [r0, r0 + reqs), `len` new tokens at positions p0.. . */
export function callInput(
  s: HttpShape,
  l: Layout,
  cache: string,
  seed: number,
  r0: number,
  reqs: number,
  p0: number,
  len: number,
): ForwardInput {
  const T = reqs * len, H = s.num_heads, Hkv = s.num_kv_heads, D = s.head_size;
  const slots: number[] = [];
  for (let r = r0; r < r0 + reqs; r++) {
    for (let j = 0; j < len; j++) slots.push(slotOf(s, l, r, p0 + j));
  }
  const bt = l.block_table.subarray(r0 * l.max_blocks, (r0 + reqs) * l.max_blocks);
  return {
    dtype: "float16",
    layer: { num_heads: H, num_kv_heads: Hkv, head_size: D },
    query: f16Tensor(randomF16(seed, T * H * D, Q_EXP), [T, H, D]),
    key: f16Tensor(randomF16(seed + 1, T * Hkv * D, KV_EXP), [T, Hkv, D]),
    value: f16Tensor(randomF16(seed + 2, T * Hkv * D, KV_EXP), [T, Hkv, D]),
    metadata: {
      query_start_loc: ints(Array.from({ length: reqs + 1 }, (_, i) => i * len)),
      seq_lens: ints(new Array(reqs).fill(p0 + len)),
      block_table: ints(bt, [reqs, l.max_blocks]),
      slot_mapping: ints(slots),
    },
    kv_cache: cache,
  } as ForwardInput;
}
