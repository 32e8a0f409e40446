/**
 * Safetensors bodies of the HTTP bench's forward calls (`Content-Type:
 * application/octet-stream`): a prefill chunk or a decode step on a server-held cache, with
 * vLLM's metadata (`query_start_loc`, `seq_lens`, `block_table`, `slot_mapping`) as I32
 * tensors and the rest of the request as JSON in `__metadata__.request`.
 * @module
 */
import { type SafetensorsTensor, serializeSafetensors } from "../core/safetensors.ts";
import { type Chunk, type HttpShape, type Layout, slotOf } from "./http_workload.ts";

const f16 = (shape: number[], a: Uint16Array): SafetensorsTensor => ({
  dtype: "F16",
  shape,
  data: new Uint8Array(a.buffer, a.byteOffset, a.byteLength),
});
const i32 = (shape: number[], a: Int32Array): SafetensorsTensor => ({
  dtype: "I32",
  shape,
  data: new Uint8Array(a.buffer, a.byteOffset, a.byteLength),
});

function request(s: HttpShape, cacheId: string): string {
  return JSON.stringify({
    dtype: "float16",
    layer: { num_heads: s.num_heads, num_kv_heads: s.num_kv_heads, head_size: s.head_size },
    kv_cache: cacheId,
  });
}

/**
 * A prefill call: the chunk's queries, and the K/V of its new positions cut from each
 * request's context K/V (`ctxK[r]`, `ctxV[r]`: [ctx, Hkv, D]).
 */
export function prefillBody(
  s: HttpShape,
  l: Layout,
  cacheId: string,
  c: Chunk,
  q: Uint16Array,
  ctxK: Uint16Array[],
  ctxV: Uint16Array[],
): Uint8Array {
  const row = s.num_kv_heads * s.head_size, T = c.n * c.len;
  const k = new Uint16Array(T * row), v = new Uint16Array(T * row);
  const qsl = new Int32Array(c.n + 1), seq = new Int32Array(c.n), slots = new Int32Array(T);
  const table = l.block_table.subarray(c.r0 * l.max_blocks, (c.r0 + c.n) * l.max_blocks);
  for (let i = 0; i < c.n; i++) {
    const r = c.r0 + i;
    k.set(ctxK[r].subarray(c.p0 * row, (c.p0 + c.len) * row), i * c.len * row);
    v.set(ctxV[r].subarray(c.p0 * row, (c.p0 + c.len) * row), i * c.len * row);
    qsl[i + 1] = (i + 1) * c.len;
    seq[i] = c.p0 + c.len;
    for (let j = 0; j < c.len; j++) slots[i * c.len + j] = slotOf(s, l, r, c.p0 + j);
  }
  return serializeSafetensors({
    query: f16([T, s.num_heads, s.head_size], q),
    key: f16([T, s.num_kv_heads, s.head_size], k),
    value: f16([T, s.num_kv_heads, s.head_size], v),
    query_start_loc: i32([c.n + 1], qsl),
    seq_lens: i32([c.n], seq),
    block_table: i32([c.n, l.max_blocks], table),
    slot_mapping: i32([T], slots),
  }, { request: request(s, cacheId) });
}

/** A decode step: one new token per request at position ctx + step. */
export function decodeBody(
  s: HttpShape,
  l: Layout,
  cacheId: string,
  step: number,
  d: { q: Uint16Array; k: Uint16Array; v: Uint16Array },
): Uint8Array {
  const R = s.reqs, pos = s.ctx + step;
  const slots = Int32Array.from({ length: R }, (_, r) => slotOf(s, l, r, pos));
  return serializeSafetensors({
    query: f16([R, s.num_heads, s.head_size], d.q),
    key: f16([R, s.num_kv_heads, s.head_size], d.k),
    value: f16([R, s.num_kv_heads, s.head_size], d.v),
    query_start_loc: i32([R + 1], Int32Array.from({ length: R + 1 }, (_, i) => i)),
    seq_lens: i32([R], new Int32Array(R).fill(pos + 1)),
    block_table: i32([R, l.max_blocks], l.block_table),
    slot_mapping: i32([R], slots),
  }, { request: request(s, cacheId) });
}
