/**
 * The forward inputs the host profiles time (bench/host_profile.ts, bench/host_hot.ts): one
 * call's request on a server-held f16 cache at a bench/http_workload.ts shape, with fresh
 * random query/key/value, back to back in one buffer as a safetensors body carries them
 * (`packed` false: three buffers, as a library caller may pass them).
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

/** `parts` copied back to back into one buffer, as views of it. */
function backToBack(parts: Uint16Array[]): Uint16Array[] {
  const all = new Uint16Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  return parts.map((p) => {
    all.set(p, at);
    at += p.length;
    return all.subarray(at - p.length, at);
  });
}

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
  packed = true,
): ForwardInput {
  const T = reqs * len, H = s.num_heads, Hkv = s.num_kv_heads, D = s.head_size;
  const slots: number[] = [];
  for (let r = r0; r < r0 + reqs; r++) {
    for (let j = 0; j < len; j++) slots.push(slotOf(s, l, r, p0 + j));
  }
  const qkv = [
    randomF16(seed, T * H * D, Q_EXP),
    randomF16(seed + 1, T * Hkv * D, KV_EXP),
    randomF16(seed + 2, T * Hkv * D, KV_EXP),
  ];
  const [q, k, v] = packed ? backToBack(qkv) : qkv;
  const bt = l.block_table.subarray(r0 * l.max_blocks, (r0 + reqs) * l.max_blocks);
  return {
    dtype: "float16",
    layer: { num_heads: H, num_kv_heads: Hkv, head_size: D },
    query: f16Tensor(q, [T, H, D]),
    key: f16Tensor(k, [T, Hkv, D]),
    value: f16Tensor(v, [T, Hkv, D]),
    metadata: {
      query_start_loc: ints(Array.from({ length: reqs + 1 }, (_, i) => i * len)),
      seq_lens: ints(new Array(reqs).fill(p0 + len)),
      block_table: ints(bt, [reqs, l.max_blocks]),
      slot_mapping: ints(slots),
    },
    kv_cache: cache,
  } as ForwardInput;
}
