/**
 * The float64 attention oracle: the contract of docs/api.md written out plainly, on a host
 * {@link ForwardBatch} and a {@link HostKvCache}. Every other backend is checked against it.
 *
 * {@link writeKv} stores the call's new K/V rows at their slots (fp8: `fround(x / scale)`, the
 * scale a float32 as on the device and in vLLM; other storage dtypes: `x`; slot -1 writes
 * nothing). {@link attend} then computes, per query token and head, a two-pass softmax over
 * the visible keys in float64 (scores, soft cap, ALiBi, mask, sink in the denominator) and the
 * log of its denominator.
 * @module
 */
import { roundTo } from "../../core/dtype.ts";
import { checkQueryLayout } from "../../core/batch_checks.ts";
import { invalidBatch } from "../../core/errors.ts";
import type { HostKvCache } from "./host_cache.ts";
import type { ForwardBatch } from "../../core/types.ts";

/** What {@link attend} returns. */
export interface ReferenceResult {
  /** [num_tokens, num_heads, head_size], rounded to the batch dtype. */
  output: Float32Array;
  /** [num_heads, num_tokens]: natural log of the softmax denominator; -Infinity with nothing to attend. */
  lse: Float32Array;
}

/** True for attention types whose K/V come straight from the call (no cache). */
export function kvFromCall(batch: ForwardBatch): boolean {
  const t = batch.layer.attn_type;
  return t === "encoder" || t === "encoder_only";
}

function fp8(cache: HostKvCache): boolean {
  return cache.storage_dtype === "fp8_e4m3" || cache.storage_dtype === "fp8_e5m2";
}

/** Physical (block, offset) of a slot, range-checked against the cache. */
function locate(slot: number, cache: HostKvCache, path: (string | number)[]): [number, number] {
  const { num_blocks, block_size } = cache.spec;
  if (!Number.isInteger(slot) || slot < 0 || slot >= num_blocks * block_size) {
    throw invalidBatch([{
      path,
      message: `slot ${slot} is outside the cache (${num_blocks} blocks x ${block_size} slots)`,
    }]);
  }
  return [Math.floor(slot / block_size), slot % block_size];
}

/**
 * Writes the call's K/V into the cache at `slot_mapping` (decoder and encoder_decoder, when
 * key/value are present). Slot -1 is padding and writes nothing.
 */
export function writeKv(batch: ForwardBatch, cache: HostKvCache): void {
  if (kvFromCall(batch) || batch.key === null || batch.value === null) return;
  const { num_kv_heads: Hkv, head_size: D, k_scale, v_scale } = batch.layer;
  const sm = batch.metadata.slot_mapping;
  const rows = batch.key.length / (Hkv * D);
  if (sm.length !== rows || batch.value.length !== batch.key.length) {
    throw invalidBatch([{
      path: ["metadata", "slot_mapping"],
      message: `has ${sm.length} entries for ${rows} key rows (value has ${
        batch.value.length / (Hkv * D)
      })`,
    }]);
  }
  const scaled = fp8(cache);
  // The scales are float32 (a device backend's uniform, vLLM's tensor): x / 0.3 rounds to a
  // different fp8 value than x / fround(0.3) where the quotient sits on a rounding tie.
  const ks = Math.fround(k_scale), vs = Math.fround(v_scale);
  const k = scaled ? batch.key.map((x) => Math.fround(x / ks)) : batch.key;
  const v = scaled ? batch.value.map((x) => Math.fround(x / vs)) : batch.value;
  for (let t = 0; t < rows; t++) {
    if (sm[t] === -1) continue;
    const [block, off] = locate(sm[t], cache, ["metadata", "slot_mapping", t]);
    for (let h = 0; h < Hkv; h++) {
      cache.writeRow("key", block, off, h, k, (t * Hkv + h) * D);
      cache.writeRow("value", block, off, h, v, (t * Hkv + h) * D);
    }
  }
}

/**
 * Checks everything {@link writeKv} and {@link attend} would index, before anything is
 * written (a rejected call must leave the cache unchanged): query size, query_start_loc,
 * key/slot counts, every written slot and every block id a request reads.
 */
export function checkBatch(batch: ForwardBatch, cache: HostKvCache | null): void {
  const L = batch.layer, md = batch.metadata, T = batch.num_tokens;
  const rowLen = L.num_kv_heads * L.head_size;
  checkQueryLayout(batch);
  if (kvFromCall(batch)) {
    for (const f of ["key", "value"] as const) {
      if (batch[f]?.length !== T * rowLen) {
        throw invalidBatch([{
          path: [f],
          message: `has ${
            batch[f]?.length ?? "no"
          } elements, expected ${T}x${L.num_kv_heads}x${L.head_size}`,
        }]);
      }
    }
    return;
  }
  if (!cache) {
    throw invalidBatch([{ path: ["kv_cache"], message: `is required for ${L.attn_type}` }]);
  }
  if (batch.key && batch.value) {
    const rows = batch.key.length / rowLen;
    if (batch.value.length !== batch.key.length || md.slot_mapping.length !== rows) {
      throw invalidBatch([{
        path: ["metadata", "slot_mapping"],
        message: `has ${md.slot_mapping.length} entries for ${rows} key rows (value has ${
          batch.value.length / rowLen
        })`,
      }]);
    }
    md.slot_mapping.forEach((s, t) => {
      if (s !== -1) locate(s, cache, ["metadata", "slot_mapping", t]);
    });
  }
  for (let i = 0; i < md.num_reqs; i++) cacheKeys(batch, cache, i, md.seq_lens[i]);
}

/** Where request i's keys come from: a row getter over key positions 0..n-1. */
interface KeySource {
  n: number;
  /** Fills `out` with the real (dequantized) K or V of key position k, kv head h. */
  row(which: "key" | "value", k: number, h: number, out: Float64Array): void;
}

function callKeys(batch: ForwardBatch, q0: number, n: number): KeySource {
  const { num_kv_heads: Hkv, head_size: D } = batch.layer;
  const key = batch.key, value = batch.value;
  if (!key || !value) {
    throw invalidBatch([{ path: ["key"], message: `is required for ${batch.layer.attn_type}` }]);
  }
  return {
    n,
    row(which, k, h, out) {
      const src = which === "key" ? key : value, o = ((q0 + k) * Hkv + h) * D;
      for (let d = 0; d < D; d++) out[d] = src[o + d];
    },
  };
}

function cacheKeys(batch: ForwardBatch, cache: HostKvCache, i: number, n: number): KeySource {
  const md = batch.metadata, bs = cache.spec.block_size, D = batch.layer.head_size;
  const scaled = fp8(cache);
  const ks = scaled ? Math.fround(batch.layer.k_scale) : 1;
  const vs = scaled ? Math.fround(batch.layer.v_scale) : 1;
  const need = Math.ceil(n / bs);
  if (need > md.max_blocks_per_req) {
    throw invalidBatch([{
      path: ["metadata", "block_table", i],
      message: `has ${md.max_blocks_per_req} blocks, seq_len ${n} needs ${need}`,
    }]);
  }
  const blocks: number[] = [];
  for (let b = 0; b < need; b++) {
    const id = md.block_table[i * md.max_blocks_per_req + b];
    if (!Number.isInteger(id) || id < 0 || id >= cache.spec.num_blocks) {
      throw invalidBatch([{
        path: ["metadata", "block_table", i, b],
        message: `block ${id} is outside the cache (${cache.spec.num_blocks} blocks)`,
      }]);
    }
    blocks.push(id);
  }
  return {
    n,
    row(which, k, h, out) {
      cache.readRow(which, blocks[Math.floor(k / bs)], k % bs, h, out);
      const s = which === "key" ? ks : vs;
      if (s === 1) return;
      for (let d = 0; d < D; d++) out[d] *= s;
    },
  };
}

/**
 * Attention for every query token and head. Reads K/V from `cache` (decoder,
 * encoder_decoder) or from the call (encoder, encoder_only); call {@link writeKv} first.
 * Throws a 422 `invalid_batch` ServiceError for anything {@link checkBatch} rejects.
 */
export function attend(batch: ForwardBatch, cache: HostKvCache | null): ReferenceResult {
  const L = batch.layer, md = batch.metadata;
  const H = L.num_heads, Hkv = L.num_kv_heads, D = L.head_size, T = batch.num_tokens;
  checkBatch(batch, cache);
  const fromCall = kvFromCall(batch);
  // Cross-attention is never causal; the other types follow the layer.
  const causal = L.attn_type === "encoder_decoder" ? false : L.causal;
  const w = L.sliding_window, cap = L.logits_soft_cap;
  const group = H / Hkv;
  const output = new Float32Array(T * H * D);
  const lse = new Float32Array(H * T);
  const q = new Float64Array(D), kRow = new Float64Array(D), vRow = new Float64Array(D);
  const acc = new Float64Array(D);

  for (let i = 0; i < md.num_reqs; i++) {
    const q0 = md.query_start_loc[i], qlen = md.query_start_loc[i + 1] - q0;
    const n = fromCall ? qlen : md.seq_lens[i];
    const keys = fromCall ? callKeys(batch, q0, n) : cacheKeys(batch, cache!, i, n);
    const base = fromCall ? 0 : md.seq_lens[i] - qlen; // position of the request's first query
    const scores = new Float64Array(n);
    const visible = new Uint8Array(n);

    for (let j = 0; j < qlen; j++) {
      const t = q0 + j, p = base + j;
      for (let h = 0; h < H; h++) {
        const kvh = Math.floor(h / group);
        for (let d = 0; d < D; d++) q[d] = batch.query[(t * H + h) * D + d];
        // Pass 1: scores of the visible keys and their max (the sink counts as one).
        const sink = L.sinks ? L.sinks[h] : -Infinity;
        let m = sink;
        for (let k = 0; k < n; k++) {
          const see = causal
            ? k <= p && (w === null || p - k < w)
            : w === null || Math.abs(p - k) < w;
          visible[k] = see ? 1 : 0;
          if (!see) continue;
          keys.row("key", k, kvh, kRow);
          let s = 0;
          for (let d = 0; d < D; d++) s += q[d] * kRow[d];
          s *= L.scale;
          if (cap !== null) s = cap * Math.tanh(s / cap);
          if (L.alibi_slopes) s += -L.alibi_slopes[h] * (p - k);
          scores[k] = s;
          if (s > m) m = s;
        }
        // Pass 2: weights e^(s - m), the denominator, the weighted sum of V.
        acc.fill(0);
        let denom = m === -Infinity ? 0 : Math.exp(sink - m);
        let any = false;
        for (let k = 0; k < n; k++) {
          if (!visible[k]) continue;
          any = true;
          const e = Math.exp(scores[k] - m);
          denom += e;
          keys.row("value", k, kvh, vRow);
          for (let d = 0; d < D; d++) acc[d] += e * vRow[d];
        }
        const o = (t * H + h) * D;
        // Rounded once, from float64 straight to the batch dtype.
        if (any) {
          for (let d = 0; d < D; d++) output[o + d] = roundTo(batch.dtype, acc[d] / denom);
        }
        // Nothing to attend (no visible key, no sink): the empty sum, log 0.
        lse[h * T + t] = any || L.sinks ? m + Math.log(denom) : -Infinity;
      }
    }
  }
  return { output, lse };
}
