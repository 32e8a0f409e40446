/**
 * The tile staging of the subgroup-matrix ceiling probe (bench/mma_ceiling_wgsl.ts, and the
 * ladders of bench/mma_ladder_wgsl.ts and bench/mma_ladder2_wgsl.ts): a step's A and B tiles
 * moved into workgroup memory by 16-byte loads and f16 stores (`wg`) or by subgroupMatrixLoad
 * from storage and subgroupMatrixStore (`wx`) ({@link stagingCode}).
 * @module
 */
import type { Ceiling, ceilingLayout, CeilingSize, MatrixDims } from "./mma_ceiling_shape.ts";

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** A staged tile (see {@link stagingTiles}). */
type Tile = ReturnType<typeof stagingTiles>[number];

/** What the moves of every tile share: the arrangement, its lanes and extents, the lines. */
interface Staging {
  v: Ceiling;
  d: MatrixDims;
  nsg: number;
  wg: number;
  K: number;
  N: number;
  load: string[];
  store: string[];
}

/**
 * Staging of the tile at step start `kn` into buffer `nb`: `load` fetches into registers (moved
 * before the step's matrix work), `store` writes workgroup memory (after it; under `more`).
 */
export function stagingCode(
  v: Ceiling,
  d: MatrixDims,
  size: CeilingSize,
  lay: ReturnType<typeof ceilingLayout>,
): { load: string[]; store: string[] } {
  const nsg = v.wm * v.wn, wg = nsg * d.sg, K = size.k, N = size.n;
  const tiles = stagingTiles(v, lay, K, N);
  const load: string[] = [], store: string[] = [];
  const sx: Staging = { v, d, nsg, wg, K, N, load, store };
  const size0 = (s: string) => (s === "as" ? lay.aTile : lay.bTile);
  for (const tl of tiles) {
    const base = `nb * ${size0(tl.s)}u`;
    if (v.src === "wg") {
      wgMoves(sx, tl, base);
    } else {
      wxMoves(sx, tl, base);
    }
  }
  return { load, store };
}

/** The tiles a step stages: A's (not under `flash`) and B's, with their storage addresses. */
function stagingTiles(v: Ceiling, lay: ReturnType<typeof ceilingLayout>, K: number, N: number) {
  const flash = v.loop === "flash";
  // Tiles: [array, rows, cols (f16), storage row of tile row `r`, storage col, row stride].
  const tiles: { s: string; g: string; rows: number; cols: number; at: string; ld: number }[] = [];
  if (!flash) {
    tiles.push({
      s: "as",
      g: "a",
      rows: lay.bm,
      cols: lay.bks,
      at: `(r0 + R) * ${K}u + kn + C`,
      ld: lay.astr,
    });
  }
  if (v.bn) {
    tiles.push({
      s: "bs",
      g: "b",
      rows: lay.bks,
      cols: lay.bn,
      at: `(kn + R) * ${N}u + c0 + C`,
      ld: lay.bstr,
    });
  } else {
    const row = flash ? "kn + R" : "c0 + R", col = flash ? "C" : "kn + C";
    tiles.push({
      s: "bs",
      g: "b",
      rows: lay.bn,
      cols: lay.bks,
      at: `(${row}) * ${K}u + ${col}`,
      ld: lay.astr,
    });
  }
  return tiles;
}

/** `wg`: a tile's 16-byte words, loaded by every lane and stored as f16s. */
function wgMoves(sx: Staging, tl: Tile, base: string): void {
  const { wg, load, store } = sx;
  const words = (tl.rows * tl.cols) / 8, wpr = tl.cols / 8;
  for (const w of range(Math.ceil(words / wg))) {
    const idx = `(t + ${w * wg}u)`, guard = words % wg ? `${idx} < ${words}u` : "true";
    const R = `${idx} / ${wpr}u`, C = `(${idx} % ${wpr}u) * 8u`;
    const at = tl.at.replace("R", R).replace("C", C);
    load.push(`var ${tl.s}w${w} = vec4<u32>(0u);`);
    load.push(`if (more && ${guard}) { ${tl.s}w${w} = ${tl.g}4[(${at}) / 8u]; }`);
    store.push(`if (${guard}) {`, `  let o = ${base} + (${R}) * ${tl.ld}u + ${C};`);
    for (const e of range(8)) {
      const half = `bitcast<vec2<f16>>(${tl.s}w${w}.${"xyzw"[e >> 1]})[${e & 1}]`;
      store.push(`  ${tl.s}_s[o + ${e}u] = ${half};`);
    }
    store.push("}");
  }
}

/** `wx`: a tile's fragments, moved by subgroupMatrixLoad and subgroupMatrixStore. */
function wxMoves(sx: Staging, tl: Tile, base: string): void {
  const { v, d, nsg, K, N, load, store } = sx;
  // wx: fragments of the tile, subgroup sg moves fragments sg, sg + NSG, ...
  const isA = tl.s === "as";
  const fm = isA ? d.m : v.bn ? d.k : d.n, fn = isA ? d.k : v.bn ? d.n : d.k;
  const T = isA
    ? `subgroup_matrix_left<f16, ${d.k}, ${d.m}>`
    : `subgroup_matrix_right<f16, ${d.n}, ${d.k}>`;
  const major = isA || v.bn ? "row_major" : "col_major";
  const fr = tl.rows / fm, fc = tl.cols / fn, count = fr * fc;
  for (const w of range(Math.ceil(count / nsg))) {
    const f = `(sg + ${w * nsg}u)`, guard = count % nsg ? `${f} < ${count}u` : "true";
    const R = `(${f} / ${fc}u) * ${fm}u`, C = `(${f} % ${fc}u) * ${fn}u`;
    const at = tl.at.replace("R", R).replace("C", C);
    load.push(`var ${tl.s}f${w}: ${T};`);
    load.push(`if (more && ${guard}) {`);
    load.push(
      `  ${tl.s}f${w} = subgroupMatrixLoad<${T}, ${major}>(&${tl.g}, ${at}, ${
        isA ? K : v.bn ? N : K
      }u);`,
    );
    load.push("}");
    store.push(`if (${guard}) {`);
    store.push(
      `  subgroupMatrixStore<${major}>(&${tl.s}_s, ${base} + (${R}) * ${tl.ld}u + ${C}, ` +
        `${tl.s}f${w}, ${tl.ld}u);`,
    );
    store.push("}");
  }
}
