/**
 * Planning the prefill rows of a batch on the portable flash kernel (gpu/flash_kernel.ts):
 * the tile table + metadata (tiles, per-request words, block table, ALiBi slopes, sinks;
 * {@link buildFlashMeta}) and the planned dispatch ({@link planPrefillRows}). The kernel shape
 * for a head size and the device limits ({@link flashConfig}) and `ATTN_FLASH_TILE` live in
 * backends/flash_tile.ts (re-exported here).
 * @module
 */
import type { BatchShape, GpuContext } from "../core/types.ts";
import { dispatchSize } from "../gpu/batch_buffers.ts";
import { FLASH_ATTENTION, type FlashConsts } from "../gpu/flash_kernel.ts";
import type { PlannedCall } from "../gpu/gpu_plan.ts";
import { getKernel, type KernelDef, packUniforms } from "../gpu/kernel.ts";
import { type KvChunkGeometry, kvChunkGeometry } from "../gpu/kv_cache.ts";
import type { TableBuilder } from "../gpu/plan_table.ts";
import type { FlashConfig } from "./flash_tile.ts";

export {
  envFlashTile,
  FLASH_TILE_SETTING,
  FLASH_TILES,
  type FlashConfig,
  flashConfig,
  flashSharedBytes,
  type FlashTile,
  flashTileName,
  flashTileUnfit,
  maxWorkgroupInvocations,
  parseFlashTile,
} from "./flash_tile.ts";

const isEncoder = (s: BatchShape) =>
  s.layer.attn_type === "encoder" || s.layer.attn_type === "encoder_only";

/**
 * Whether a request `reqs` selects has query tokens: else there is no tile to plan, and where
 * there is one, {@link buildFlashMeta} makes at least one tile.
 */
export function hasRows(s: BatchShape, reqs: (i: number) => boolean): boolean {
  const q = s.metadata.query_start_loc;
  for (let i = 0; i < s.metadata.num_reqs; i++) if (q[i + 1] > q[i] && reqs(i)) return true;
  return false;
}

/**
 * Tiles (4 words each) of the requests `reqs` selects, per-request words, block table, ALiBi
 * slopes and sinks in one array. Tiles are sorted longest first (a shorter tail).
 */
export function buildFlashMeta(
  s: BatchShape,
  cfg: Pick<FlashConfig, "rows">,
  reqs: (i: number) => boolean,
) {
  const L = s.layer, md = s.metadata, G = L.num_heads / L.num_kv_heads, enc = isEncoder(s);
  const tpt = G <= cfg.rows ? Math.floor(cfg.rows / G) : 1;
  const hchunk = Math.min(G, cfg.rows);
  const causal = L.attn_type === "encoder_decoder" ? false : L.causal;
  const w = L.sliding_window ?? 0;
  const tiles: { t: number[]; cost: number }[] = [];
  const reqWords = new Int32Array(md.num_reqs * 4);
  for (let i = 0; i < md.num_reqs; i++) {
    const q0 = md.query_start_loc[i], qlen = md.query_start_loc[i + 1] - q0;
    const kvLen = enc ? qlen : md.seq_lens[i];
    const base = enc ? 0 : md.seq_lens[i] - qlen;
    reqWords.set([kvLen, base - q0, 0, enc ? q0 : i * md.max_blocks_per_req], i * 4);
    if (!reqs(i)) continue;
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
  tiles.sort((x, y) => y.cost - x.cost);
  const H = L.num_heads;
  const offReqs = tiles.length * 4, offBt = offReqs + reqWords.length;
  const offAlibi = offBt + md.block_table.length, offSinks = offAlibi + H;
  const meta = new Uint32Array(offSinks + H);
  tiles.forEach((x, k) => meta.set(x.t, k * 4));
  meta.set(new Uint32Array(reqWords.buffer), offReqs);
  meta.set(
    new Uint32Array(md.block_table.buffer, md.block_table.byteOffset, md.block_table.length),
    offBt,
  );
  const f = new Float32Array(meta.buffer);
  if (L.alibi_slopes) f.set(L.alibi_slopes, offAlibi);
  if (L.sinks) f.set(L.sinks, offSinks);
  return { meta, numTiles: tiles.length, causal, w, offReqs, offBt, offAlibi, offSinks };
}

/**
 * The Params, metadata sections, bindings and grid of a tiled prefill kernel (the portable and
 * the tensor-core kernels share them): one workgroup per (tile, kv head). `extra`: the def's
 * own further Params words.
 */
export function flashTileCall(
  ctx: GpuContext,
  s: BatchShape,
  m: ReturnType<typeof buildFlashMeta>,
  def: Pick<KernelDef<never>, "name" | "uniforms">,
  g: KvChunkGeometry | null,
  enc: boolean,
  table: TableBuilder,
  extra: Record<string, number> = {},
): { bind: PlannedCall["bind"]; grid: [number, number] } {
  const L = s.layer;
  const fp8 = g !== null && (g.storage_dtype === "fp8_e4m3" || g.storage_dtype === "fp8_e5m2");
  const grid = dispatchSize(ctx, m.numTiles * L.num_kv_heads);
  const params = table.add(packUniforms(def, {
    num_tiles: m.numTiles,
    num_heads: L.num_heads,
    num_kv_heads: L.num_kv_heads,
    group: L.num_heads / L.num_kv_heads,
    num_tokens: s.num_tokens,
    nwg_x: grid[0],
    causal: m.causal ? 1 : 0,
    window: Math.min(m.w, 2 ** 30),
    softcap: L.logits_soft_cap ?? 0,
    scale_qk: L.scale * (fp8 ? L.k_scale : 1),
    v_scale: fp8 ? L.v_scale : 1,
    flags: (L.alibi_slopes ? 1 : 0) | (L.sinks ? 2 : 0),
    off_reqs: m.offReqs,
    off_bt: m.offBt,
    off_alibi: m.offAlibi,
    off_sinks: m.offSinks,
    block_words: g?.block_words ?? 0,
    blocks_per_chunk: g?.blocks_per_chunk ?? 0,
    ...extra,
  }));
  const meta = table.add(m.meta);
  const bind: PlannedCall["bind"] = {
    U: { table: params },
    q: { io: "query" },
    mdw: { table: meta },
    out: { io: "out" },
    lse: { io: "lse" },
  };
  if (enc) Object.assign(bind, { k_in: { io: "key" }, v_in: { io: "value" } });
  return { bind, grid };
}

/** Plans the rows of the requests `reqs` selects on the portable flash kernel. */
export async function planPrefillRows(
  ctx: GpuContext,
  s: BatchShape,
  cfg: FlashConfig,
  reqs: (i: number) => boolean,
  table: TableBuilder,
): Promise<{ calls: PlannedCall[]; key: string; tiles: number } | null> {
  const L = s.layer, enc = isEncoder(s);
  if (!hasRows(s, reqs)) return null;
  const m = buildFlashMeta(s, cfg, reqs);
  const g = enc ? null : kvChunkGeometry(ctx, s.cache_spec!);
  const consts: FlashConsts = {
    kv: g ? g.storage_dtype : s.dtype,
    dtype: s.dtype,
    enc,
    d: L.head_size,
    bs: g ? s.cache_spec!.block_size : 16,
    nhd: g ? s.cache_spec!.layout === "NHD" : true,
    nchunk: g ? g.nchunk : 0,
    tx: cfg.tx,
    ty: cfg.ty,
    rm: cfg.rm,
    rn: cfg.rn,
    cap: (L.logits_soft_cap ?? 0) > 0,
    alibi: L.alibi_slopes !== null,
    unroll: cfg.unroll,
  };
  // Sections first, then the kernel (see planDecodeRows): a layout independent of timing.
  const { bind, grid } = flashTileCall(ctx, s, m, FLASH_ATTENTION, g, enc, table);
  const kernel = await getKernel(ctx, FLASH_ATTENTION, consts);
  return {
    calls: [{ name: "prefill", kernel, bind, cache: !enc, grid }],
    key: kernel.key,
    tiles: m.numTiles,
  };
}
