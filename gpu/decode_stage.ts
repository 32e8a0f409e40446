/**
 * The K/V staging of the WEBGPU_DECODE split kernel (tuning `stage_kv`): the workgroup walks
 * its slice in tiles of NKG x U keys (key group kg takes keys kg * U .. kg * U + U - 1 of a
 * tile); every invocation loads its share of the next tile's K and V vec4s into registers
 * (`sk{i}`, `sv{i}`: independent 16-byte loads, each through its own block-table lookup), and
 * at the top of each step stores them to workgroup memory `skv` (layout [K | V][key][kv head]
 * [vec4 column]) between two barriers, then issues the following tile's loads before the step's
 * arithmetic reads the current tile from `skv` (software pipelining).
 * @module
 */

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/**
 * Loads of the tile starting at key `t0` (declared in the step) into `sk{i}` / `sv{i}`: `tile`
 * vec4s (K and V), WG invocations, KH kv heads a row group, RV vec4s a row. Keys past the slice
 * are clamped to its last key (their scores are masked). `decl`: declare the registers first
 * (the prologue, for tile 0 at key kb).
 */
export function stagedLoads(
  tile: number,
  wg: number,
  kh: number,
  rv: number,
  decl: boolean,
): string[] {
  const per = tile / 2, nl = Math.ceil(per / wg), out: string[] = [];
  if (decl) {
    for (const i of range(nl)) out.push(`  var sk${i}: vec4<u32>;`, `  var sv${i}: vec4<u32>;`);
  }
  const ind = decl ? "    " : "      ";
  out.push(decl ? "  if (n_it > 0u) {" : "    if (it + 1u < n_it) {");
  out.push(`${ind}let t0 = ${decl ? "kb" : "kb + (it + 1u) * NKG * U"};`);
  for (const i of range(nl)) {
    out.push(
      `${ind}{`,
      `${ind}  let x = min(lid + ${i * wg}u, ${per - 1}u);`,
      `${ind}  let key = min(t0 + x / ${kh * rv}u, kwe - 1u);`,
      `${ind}  let wo = row_word(key % BS, kvh0 + (x / ${rv}u) % ${kh}u) + (x % ${rv}u) * 4u;`,
      `${ind}  let b = block_of(bt, key);`,
      `${ind}  sk${i} = load_k4(b, wo);`,
      `${ind}  sv${i} = load_v4(b, wo);`,
      `${ind}}`,
    );
  }
  out.push(decl ? "  }" : "    }");
  return out;
}

/** The head of a staged step: store the registers to `skv` between barriers (the previous
 * tile's reads done before, this tile's writes visible after), then load the next tile. */
export function stagedStep(tile: number, wg: number, kh: number, rv: number): string[] {
  const per = tile / 2, nl = Math.ceil(per / wg), out = ["    workgroupBarrier();"];
  for (const i of range(nl)) {
    const x = `lid + ${i * wg}u`;
    const stores = [`skv[${x}] = sk${i};`, `skv[${per}u + ${x}] = sv${i};`];
    if ((i + 1) * wg <= per) out.push(...stores.map((s) => `    ${s}`));
    else out.push(`    if (${x} < ${per}u) {`, ...stores.map((s) => `      ${s}`), "    }");
  }
  out.push("    workgroupBarrier();", ...stagedLoads(tile, wg, kh, rv, false));
  return out;
}
