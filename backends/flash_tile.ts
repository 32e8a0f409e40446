/**
 * The portable flash kernel's shape (gpu/flash_kernel.ts): its register tiles ({@link FLASH_TILES},
 * `ATTN_FLASH_TILE`), whether one fits a head size and the device limits, and the kernel shape
 * chosen for them ({@link flashConfig}).
 * @module
 */
import { warnOnce } from "../core/warn_once.ts";
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
