/**
 * Planning the prefill rows of a batch on the portable flash kernel (gpu/flash_kernel.ts):
 * the kernel shape for a head size and the device limits ({@link flashConfig}), the tile
 * table + metadata (tiles, per-request words, block table, ALiBi slopes, sinks;
 * {@link buildFlashMeta}) and the planned dispatch ({@link planPrefillRows}).
 * @module
 */
import { warnOnce } from "../core/warn_once.ts";
import type { BatchShape, GpuContext } from "../core/types.ts";
import { dispatchSize } from "../gpu/batch_buffers.ts";
import { FLASH_ATTENTION, type FlashConsts } from "../gpu/flash_kernel.ts";
import type { PlannedCall } from "../gpu/gpu_plan.ts";
import { getKernel, type KernelDef, packUniforms } from "../gpu/kernel.ts";
import { type KvChunkGeometry, kvChunkGeometry } from "../gpu/kv_cache.ts";
import type { TableBuilder } from "../gpu/plan_table.ts";
import { type EnvSetting, mustBe, readSetting } from "../core/env.ts";

/** A kernel shape: the register tile (see gpu/flash_codegen.ts) and what follows from it. */
export interface FlashConfig {
  /** Threads along keys / output columns and along rows; rows and keys per thread. */
  tx: number;
  ty: number;
  rm: number;
  rn: number;
  /** Query rows (TY * RM) and keys (TX * RN) per tile, workgroup size (TX * TY). */
  rows: number;
  bk: number;
  wg: number;
  /** Unrolled score and PV loops (gpu/flash_codegen.ts). */
  unroll: boolean;
  /** Workgroup memory it needs, in bytes. */
  shared_bytes: number;
  /**
   * Where a named tile (`ATTN_FLASH_TILE`, or WEBGPU_FLASH's `tile` option) cannot run this
   * head size on this device: why, and which tile runs instead ({@link flashConfig}); absent
   * where the named tile runs or none was named.
   */
  replaced?: string;
}

/**
 * A register tile, as written in `ATTN_FLASH_TILE` and the bench: `TXxTYxRMxRN`, with an
 * optional suffix `u` (unrolled loops) or `l` (loops); without one, unrolled on GPUs and loops
 * on software adapters (same speed there, half the compile time).
 */
export type FlashTile = readonly [
  tx: number,
  ty: number,
  rm: number,
  rn: number,
  unroll?: boolean,
];

/**
 * The tiles tried in order (the first that fits the head size and the device wins): 8x8x4x4
 * needs 38.5 KiB at head size 128 (GPUs with 48 KiB of workgroup memory); 4x8x4x4 is the
 * fastest measured on lavapipe (32 KiB).
 */
export const FLASH_TILES: readonly FlashTile[] = [
  [8, 8, 4, 4],
  [4, 8, 4, 4],
  [8, 8, 4, 2],
  [4, 16, 2, 4],
  [8, 8, 2, 2],
  [4, 8, 2, 4],
  [8, 8, 2, 1],
  [4, 8, 2, 2],
  [8, 4, 2, 1],
  [4, 4, 2, 1],
  [4, 4, 1, 1],
];

/** Most vec4 output accumulators per thread (RM x D4 / TX) a tile may keep in registers. */
const MAX_ACC = 32;

/** Workgroup memory of a tile for head size `d`: Qs, KVs, Ps and the row partials. */
export function flashSharedBytes(d: number, t: FlashTile): number {
  const [tx, ty, rm, rn] = t, d4 = d / 4, bq = ty * rm, bk = tx * rn;
  return 16 * (d4 * bq + bk * (d4 + 1)) + 4 * bq * (bk + tx) + 4 * bq * tx;
}

/** The most invocations a workgroup any WebGPU adapter grants (D3D12 and Metal: exactly this). */
const MOST_INVOCATIONS = 1024;

/** `TXxTYxRMxRN` as a tile, or an error naming the text. */
export function parseFlashTile(text: string): FlashTile {
  const suffix = text.match(/[ul]$/)?.[0];
  const parts = (suffix ? text.slice(0, -1) : text).split("x");
  const v = parts.map(Number);
  if (v.length !== 4 || !parts.every((x) => /^\d+$/.test(x)) || !v.every((x) => x > 0)) {
    throw new Error(`flash tile ${JSON.stringify(text)}: expected TXxTYxRMxRN, e.g. 8x8x4x4`);
  }
  if (![1, 2, 4, 8, 16, 32].includes(v[0]) || v[0] % 4 !== 0) {
    throw new Error(`flash tile ${JSON.stringify(text)}: TX must be 4, 8, 16 or 32`);
  }
  if (v[0] * v[1] > MOST_INVOCATIONS) {
    throw new Error(
      `flash tile ${JSON.stringify(text)}: TX x TY = ${v[0] * v[1]} invocations, over the ` +
        `${MOST_INVOCATIONS} any WebGPU device grants a workgroup`,
    );
  }
  const t = v as unknown as [number, number, number, number];
  return suffix ? [...t, suffix === "u"] : t;
}

/** The most invocations one workgroup may have on a device with `limits` (WebGPU's 256 default). */
export function maxWorkgroupInvocations(limits: Readonly<Record<string, number>>): number {
  return Math.min(
    limits.maxComputeInvocationsPerWorkgroup ?? 256,
    limits.maxComputeWorkgroupSizeX ?? 256,
  );
}

/** Why tile `t` cannot run head size `d` on a device with `limits`, or null when it can. */
export function flashTileUnfit(
  d: number,
  t: FlashTile,
  limits: Readonly<Record<string, number>>,
  maxAcc = MAX_ACC,
): string | null {
  const [tx, ty, rm] = t, d4 = d / 4;
  if (d % 16 !== 0 || d < 16) return `head size ${d} is not a multiple of 16`;
  if (d4 % tx !== 0) return `TX ${tx} does not divide the ${d4} vec4 columns of head size ${d}`;
  if (rm * (d4 / tx) > maxAcc) return `${rm * (d4 / tx)} vec4 accumulators > ${maxAcc}`;
  const maxInv = maxWorkgroupInvocations(limits);
  if (tx * ty > maxInv) return `${tx * ty} invocations > ${maxInv}`;
  const shared = flashSharedBytes(d, t), max = limits.maxComputeWorkgroupStorageSize ?? 16384;
  if (shared > max) return `${shared} B of workgroup memory > ${max}`;
  return null;
}

function configOf(d: number, t: FlashTile, unroll: boolean): FlashConfig {
  const [tx, ty, rm, rn] = t;
  return {
    tx,
    ty,
    rm,
    rn,
    rows: ty * rm,
    bk: tx * rn,
    wg: tx * ty,
    unroll: t[4] ?? unroll,
    shared_bytes: flashSharedBytes(d, t),
  };
}

/** A tile as `ATTN_FLASH_TILE` writes it: `TXxTYxRMxRN`, and its unroll suffix where it has one. */
export function flashTileName(t: FlashTile): string {
  const suffix = t[4] === undefined ? "" : t[4] ? "u" : "l";
  return `${t.slice(0, 4).join("x")}${suffix}`;
}

/**
 * The kernel shape for head size `d` on a device with `limits`: `tile` when given and it fits,
 * else the first of {@link FLASH_TILES} that fits (the last resort ignores the register
 * budget); null when none does. `unroll` applies to tiles without an unroll suffix.
 *
 * A named tile that does not fit is not fatal (ATTN_FLASH_TILE is one value for every head
 * size a server sees, and start-up knows none of them): the automatic tile runs, the config
 * says why in `replaced`, and a warning line says it on stderr, once per process for each head
 * size and device limits that refuse the tile.
 */
export function flashConfig(
  d: number,
  limits: Readonly<Record<string, number>>,
  tile?: FlashTile | null,
  unroll = true,
): FlashConfig | null {
  const fits = (t: FlashTile, acc?: number) => !flashTileUnfit(d, t, limits, acc);
  if (tile && fits(tile, Infinity)) return configOf(d, tile, unroll);
  const t = FLASH_TILES.find((x) => fits(x)) ?? FLASH_TILES.find((x) => fits(x, Infinity));
  if (!tile) return t ? configOf(d, t, unroll) : null;
  const why = flashTileUnfit(d, tile, limits, Infinity);
  const replaced = `flash tile ${flashTileName(tile)} (ATTN_FLASH_TILE) does not fit head size ` +
    `${d} on this device (${why}): ${t ? `tile ${flashTileName(t)} runs instead` : "no tile fits"}`;
  warnOnce(replaced);
  return t ? { ...configOf(d, t, unroll), replaced } : null;
}

/**
 * `ATTN_FLASH_TILE`: a tile {@link parseFlashTile} takes (unset or empty: automatic). Whether it
 * fits depends on the head size and the device, known only when a batch is planned: one that
 * does not is replaced there by the automatic tile, visibly ({@link flashConfig}).
 */
export const FLASH_TILE_SETTING: EnvSetting<FlashTile | null> = {
  name: "ATTN_FLASH_TILE",
  unset: null,
  parse(text) {
    try {
      return parseFlashTile(text);
    } catch (e) {
      const why = (e as Error).message;
      throw mustBe("ATTN_FLASH_TILE", text, "a tile TXxTYxRMxRN (e.g. 8x8x4x4)", why);
    }
  },
};

/** The tile `ATTN_FLASH_TILE` names, or null when unset (EnvValueError where it names none). */
export function envFlashTile(): FlashTile | null {
  return readSetting(FLASH_TILE_SETTING);
}

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
