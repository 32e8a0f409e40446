/**
 * Plan-stage helpers of WEBGPU_FLASH: the kernel shape for a head size and the device limits
 * ({@link flashConfig}), the (cached) specialized pipeline, batch validation against what the
 * kernel indexes, and the tile table + metadata array (tiles, per-request words, block table,
 * ALiBi slopes, sinks).
 * @module
 */
import { checkQueryLayout } from "../core/batch_checks.ts";
import { invalidBatch } from "../core/errors.ts";
import type { ForwardBatch, GpuContext } from "../core/types.ts";
import type { GpuKvCache } from "../gpu/kv_cache.ts";
import { getComputePipeline } from "../gpu/pipelines.ts";
import {
  decodeHelpers,
  dtypeTag,
  elementsPerWord,
  kvAccessors,
  loadWgsl,
  specialize,
} from "../gpu/wgsl.ts";

/** A kernel shape: query rows and keys per tile, threads per row, workgroup size. */
export interface FlashConfig {
  rows: number;
  bk: number;
  tpr: number;
  wg: number;
  /** Workgroup memory it needs, in bytes. */
  shared_bytes: number;
}

/** Workgroup memory of a kernel shape for head size `d`. */
export function flashSharedBytes(d: number, rows: number, bk: number): number {
  const d4 = d / 4;
  return 16 * (rows * d4 + bk * (d4 + 1) + bk * d4) + 4 * rows * bk + 12 * rows + 8;
}

/** The largest kernel shape for head size `d` that fits the device's limits, or null. */
export function flashConfig(
  d: number,
  limits: Readonly<Record<string, number>>,
): FlashConfig | null {
  if (d % 16 !== 0 || d < 16) return null;
  const d4 = d / 4;
  const tpr = d4 % 8 === 0 ? 8 : 4;
  const maxShared = limits.maxComputeWorkgroupStorageSize ?? 16384;
  const maxInv = Math.min(
    limits.maxComputeInvocationsPerWorkgroup ?? 256,
    limits.maxComputeWorkgroupSizeX ?? 256,
  );
  for (const [rows, bk] of [[16, 32], [16, 16], [8, 16], [16, 8], [8, 8]]) {
    const wg = rows * tpr;
    if (wg > maxInv || wg % bk !== 0 || bk % tpr !== 0) continue;
    const shared_bytes = flashSharedBytes(d, rows, bk);
    if (shared_bytes <= maxShared) return { rows, bk, tpr, wg, shared_bytes };
  }
  return null;
}

/** Compiles (cached) the flash kernel for `b`'s shape; `cache` null: K/V from the call. */
export async function flashPipeline(
  ctx: GpuContext,
  b: ForwardBatch,
  cfg: FlashConfig,
  cache: GpuKvCache | null,
) {
  const d = b.layer.head_size;
  const enc = cache === null;
  const storage = enc ? "float32" : cache.geometry.storage_dtype;
  const epw = elementsPerWord(storage);
  const bs = enc ? 16 : cache.spec.block_size;
  const source = enc
    ? `@group(0) @binding(5) var<storage, read> k_in: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> v_in: array<vec4<f32>>;
fn src_k(key: u32, h: u32, c: u32, rbase: u32) -> vec4<u32> {
  return bitcast<vec4<u32>>(k_in[((rbase + key) * U.num_kv_heads + h) * D4 + c]);
}
fn src_v(key: u32, h: u32, c: u32, rbase: u32) -> vec4<u32> {
  return bitcast<vec4<u32>>(v_in[((rbase + key) * U.num_kv_heads + h) * D4 + c]);
}
`
    : `${
      kvAccessors({
        nchunk: cache.geometry.nchunk,
        blocksPerChunk: "U.blocks_per_chunk",
        blockWords: "U.block_words",
        firstBinding: 5,
        vec4: true,
      })
    }
fn kv_row(key: u32, h: u32, rbase: u32) -> vec2<u32> {
  let block = mdw[U.off_bt + rbase + key / BS];
  let off = key % BS;
  if (NHD) {
    return vec2<u32>(block, (off * U.num_kv_heads + h) * WPR);
  }
  return vec2<u32>(block, (h * BS + off) * WPR);
}
fn src_k(key: u32, h: u32, c: u32, rbase: u32) -> vec4<u32> {
  let br = kv_row(key, h, rbase);
  return load_k4(br.x, br.y + 4u * c);
}
fn src_v(key: u32, h: u32, c: u32, rbase: u32) -> vec4<u32> {
  let br = kv_row(key, h, rbase);
  return load_v4(br.x, br.y + 4u * c);
}
`;
  const code = specialize(await loadWgsl("flash_attention.wgsl"), {
    WG: cfg.wg,
    ROWS: cfg.rows,
    BK: cfg.bk,
    TPR: cfg.tpr,
    D: d,
    BS: bs,
    NHD: enc || cache.spec.layout === "NHD",
    V4R: (d * 4) / epw / 16,
    EPW: epw,
    DECODE: decodeHelpers(storage),
    SOURCE: source,
  });
  const key = enc
    ? `flash[enc]:hd${d}:r${cfg.rows}k${cfg.bk}:wg${cfg.wg}`
    : `flash[${dtypeTag(storage)}]:hd${d}:bs${bs}:${cache.spec.layout}:c${cache.geometry.nchunk}:` +
      `r${cfg.rows}k${cfg.bk}:wg${cfg.wg}`;
  return { key, pipeline: await getComputePipeline(ctx, key, code) };
}

/** Checks what the kernel indexes: shapes, query_start_loc, seq_lens, block ids. */
export function validateFlashBatch(b: ForwardBatch, cache: GpuKvCache | null): void {
  const L = b.layer, md = b.metadata, T = b.num_tokens;
  checkQueryLayout(b);
  if (!cache) {
    for (const f of ["key", "value"] as const) {
      if (b[f]?.length !== T * L.num_kv_heads * L.head_size) {
        throw invalidBatch([{
          path: [f],
          message: `has ${
            b[f]?.length ?? "no"
          } elements, expected ${T}x${L.num_kv_heads}x${L.head_size}`,
        }]);
      }
    }
    return;
  }
  const s = cache.spec;
  if (s.num_kv_heads !== L.num_kv_heads || s.head_size !== L.head_size) {
    throw invalidBatch([{
      path: ["kv_cache"],
      message:
        `has num_kv_heads ${s.num_kv_heads}, head_size ${s.head_size}; the layer has ${L.num_kv_heads}, ${L.head_size}`,
    }]);
  }
  for (let i = 0; i < md.num_reqs; i++) {
    const n = md.seq_lens[i], qlen = md.query_start_loc[i + 1] - md.query_start_loc[i];
    if (!(n >= 0) || (L.attn_type === "decoder" && n < qlen)) {
      throw invalidBatch([{
        path: ["metadata", "seq_lens", i],
        message: `is ${n}, below query length ${qlen}`,
      }]);
    }
    const need = Math.ceil(n / s.block_size);
    if (need > md.max_blocks_per_req) {
      throw invalidBatch([{
        path: ["metadata", "block_table", i],
        message: `has ${md.max_blocks_per_req} blocks, seq_len ${n} needs ${need}`,
      }]);
    }
    for (let j = 0; j < need; j++) {
      const id = md.block_table[i * md.max_blocks_per_req + j];
      if (!(id >= 0 && id < s.num_blocks)) {
        throw invalidBatch([{
          path: ["metadata", "block_table", i, j],
          message: `block ${id} is outside the cache (${s.num_blocks} blocks)`,
        }]);
      }
    }
  }
}

/** Tiles (4 words each), per-request words, block table, ALiBi slopes and sinks in one array. */
export function buildFlashMeta(b: ForwardBatch, cfg: FlashConfig, enc: boolean) {
  const L = b.layer, md = b.metadata, G = L.num_heads / L.num_kv_heads;
  const tpt = G <= cfg.rows ? Math.floor(cfg.rows / G) : 1;
  const hchunk = Math.min(G, cfg.rows);
  const causal = L.attn_type === "encoder_decoder" ? false : L.causal;
  const w = L.sliding_window ?? 0;
  const tiles: { t: number[]; cost: number }[] = [];
  const reqs = new Int32Array(md.num_reqs * 4);
  for (let i = 0; i < md.num_reqs; i++) {
    const q0 = md.query_start_loc[i], qlen = md.query_start_loc[i + 1] - q0;
    const kvLen = enc ? qlen : md.seq_lens[i];
    const base = enc ? 0 : md.seq_lens[i] - qlen;
    reqs.set([kvLen, base - q0, 0, enc ? q0 : i * md.max_blocks_per_req], i * 4);
    for (let a = 0; a < qlen; a += tpt) {
      const cnt = Math.min(tpt, qlen - a);
      const pf = base + a, pl = pf + cnt - 1;
      const ks = w > 0 ? Math.max(0, pf - w + 1) : 0;
      const ke = causal ? Math.min(kvLen, pl + 1) : w > 0 ? Math.min(kvLen, pl + w) : kvLen;
      for (let h0 = 0; h0 < G; h0 += hchunk) {
        const hc = Math.min(hchunk, G - h0);
        tiles.push({ t: [i, q0 + a, cnt | (hc << 16), h0], cost: Math.max(0, ke - ks) });
      }
    }
  }
  tiles.sort((x, y) => y.cost - x.cost); // longest first: shorter tail
  const H = L.num_heads;
  const offReqs = tiles.length * 4, offBt = offReqs + reqs.length;
  const offAlibi = offBt + md.block_table.length, offSinks = offAlibi + H;
  const meta = new Uint32Array(offSinks + H);
  tiles.forEach((x, k) => meta.set(x.t, k * 4));
  meta.set(new Uint32Array(reqs.buffer), offReqs);
  meta.set(
    new Uint32Array(md.block_table.buffer, md.block_table.byteOffset, md.block_table.length),
    offBt,
  );
  const f = new Float32Array(meta.buffer);
  if (L.alibi_slopes) f.set(L.alibi_slopes, offAlibi);
  if (L.sinks) f.set(L.sinks, offSinks);
  return { meta, numTiles: tiles.length, causal, w, offReqs, offBt, offAlibi, offSinks };
}
