/**
 * WGSL of the token-group prefill probe (bench/group_prefill_probe.ts): a portable FMA kernel
 * for causal prefill over a paged f16 cache that shares each K/V row between the T tokens and G
 * query heads of one group (R = T x G rows), which the split-KV path cannot (each token there is a
 * decode row reading its whole prefix again, and its dot products need cross-lane sums).
 *
 * One workgroup of 32 invocations per (token group, kv head, sequence), longest groups first.
 * Per step of KS = 32 x KPL keys:
 *   A. QK: invocation l takes keys k0 + kk * 32 + l (kk < KPL) and runs their whole dot products
 *      over D itself (no cross-lane sum), the scaled queries read from workgroup memory (every
 *      invocation reads the same word: one broadcast), the key row straight from the cache; the
 *      causal mask; the scores go to `ps` [key][row];
 *   B. invocations l < R take row l's new running max over the step's keys, and its rescale;
 *   C. every invocation turns its own scores into probabilities in `ps` (one exp each);
 *   D. PV: invocation l owns the 4 output columns 4l .. 4l + 3 of every row (so D = 128): it
 *      rescales, then adds P[key][row] x V[key][4l ..] over the step's keys, P read as vec4s of
 *      rows (broadcast), the V rows found through `vrow` (each key's row offset, staged in A).
 * Four barriers a step; f32 arithmetic and accumulation; f32 output. Probe only: no window, soft
 * cap, ALiBi, sinks or LSE, f16 data and cache, NHD layout, full causal prefills (position =
 * token index), every sequence S tokens.
 *
 * Bindings: 0 uniform P; 1 q: array<vec4<u32>> [tokens, HQ, D] f16 words; 2 kc: array<vec4<u32>>
 * and 3 vc: array<vec2<u32>>, the caches [blocks, BS, HKV, D] f16 words; 4 bt: array<i32>
 * [seqs, max_blocks]; 5 out: array<vec4<f32>> [tokens, HQ, D].
 * @module
 */

/** The probe's compile-time shape. */
export interface GroupShape {
  /** Tokens per group, query heads per kv head (rows R = t x g, a multiple of 4). */
  t: number;
  g: number;
  /** Keys per invocation per step (1 or 2). */
  kpl: number;
  /** Head size (128: 4 columns per invocation in PV) and block size. */
  d: number;
  bs: number;
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** The probe kernel's source for one shape. */
export function groupPrefillWgsl(s: GroupShape): string {
  const R = s.t * s.g, R4 = R / 4, KPL = s.kpl, LANES = 32;
  if (R % 4 !== 0) throw new Error(`rows ${R} (t ${s.t} x g ${s.g}) must be a multiple of 4`);
  if (s.d !== 4 * LANES) throw new Error(`head size ${s.d}: the probe needs 128`);
  const rows = range(R), quads = range(R4), keys = range(KPL);
  const lines: string[] = [];
  const add = (...l: string[]) => lines.push(...l);
  add(
    `const R: u32 = ${R}u;`,
    `const R4: u32 = ${R4}u;`,
    `const G: u32 = ${s.g}u;`,
    `const KS: u32 = ${LANES * KPL}u;`,
    `const D4: u32 = ${s.d / 4}u;`,
    `const D8: u32 = ${s.d / 8}u;`,
    `const BS: u32 = ${s.bs}u;`,
    `const NEG: f32 = -1.0e30;`,
    `struct Params { s_len: u32, hq: u32, hkv: u32, max_blocks: u32, ngroups: u32, ` +
      `seqs: u32, nwg_x: u32, scale: f32 }`,
    `@group(0) @binding(0) var<uniform> P: Params;`,
    `@group(0) @binding(1) var<storage, read> q: array<vec4<u32>>;`,
    `@group(0) @binding(2) var<storage, read> kc: array<vec4<u32>>;`,
    `@group(0) @binding(3) var<storage, read> vc: array<vec2<u32>>;`,
    `@group(0) @binding(4) var<storage, read> bt: array<i32>;`,
    `@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;`,
    `var<workgroup> qs: array<vec4<f32>, ${R * (s.d / 4)}>;`,
    `var<workgroup> ps: array<vec4<f32>, ${LANES * KPL * R4}>;`,
    `var<workgroup> vrow: array<u32, ${LANES * KPL}>;`,
    `var<workgroup> mrow: array<vec4<f32>, R4>;`,
    `var<workgroup> alpha: array<vec4<f32>, R4>;`,
    `fn h4(w: vec2<u32>) -> vec4<f32> { return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)); }`,
    `@compute @workgroup_size(32)`,
    `fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {`,
    `  let wid = wg.x + wg.y * P.nwg_x;`,
    `  let per = P.seqs * P.hkv;`,
    `  if (wid >= per * P.ngroups) { return; }`,
    `  let tg = P.ngroups - 1u - wid / per;`,
    `  let kvh = (wid % per) % P.hkv;`,
    `  let seq = (wid % per) / P.hkv;`,
    `  let pos0 = tg * ${s.t}u;`,
    `  let tok0 = seq * P.s_len + pos0;`,
    `  let kend = pos0 + ${s.t}u;`,
    `  let btb = seq * P.max_blocks;`,
    `  for (var i = l; i < R * D8; i += 32u) {`,
    `    let r = i / D8;`,
    `    let c = i % D8;`,
    `    let w = q[((tok0 + r / G) * P.hq + kvh * G + r % G) * D8 + c];`,
    `    qs[r * D4 + 2u * c] = h4(w.xy) * P.scale;`,
    `    qs[r * D4 + 2u * c + 1u] = h4(w.zw) * P.scale;`,
    `  }`,
    `  if (l < R4) { mrow[l] = vec4<f32>(NEG); }`,
    ...rows.map((r) => `  var o${r} = vec4<f32>(0.0);`),
    ...quads.map((r4) => `  var ls${r4} = vec4<f32>(0.0);`),
    `  workgroupBarrier();`,
    `  for (var k0 = 0u; k0 < kend; k0 += KS) {`,
  );
  // A. Scores of this invocation's keys.
  for (const kk of keys) {
    add(
      `    let key${kk} = k0 + ${kk * LANES}u + l;`,
      `    let kr${kk} = min(key${kk}, kend - 1u);`,
      `    let row${kk} = (u32(bt[btb + kr${kk} / BS]) * BS + kr${kk} % BS) * P.hkv + kvh;`,
      `    vrow[${kk * LANES}u + l] = row${kk};`,
      ...rows.map((r) => `    var s${kk}_${r} = 0.0;`),
    );
  }
  add(`    for (var c = 0u; c < D8; c++) {`);
  for (const kk of keys) {
    add(
      `      let w${kk} = kc[row${kk} * D8 + c];`,
      `      let ka${kk} = h4(w${kk}.xy);`,
      `      let kb${kk} = h4(w${kk}.zw);`,
    );
  }
  for (const r of rows) {
    add(
      `      let qa${r} = qs[${r}u * D4 + 2u * c];`,
      `      let qb${r} = qs[${r}u * D4 + 2u * c + 1u];`,
    );
    for (const kk of keys) {
      add(`      s${kk}_${r} += dot(qa${r}, ka${kk}) + dot(qb${r}, kb${kk});`);
    }
  }
  add(`    }`);
  for (const kk of keys) {
    for (const r4 of quads) {
      const v = range(4).map((i) => {
        const r = 4 * r4 + i;
        return `select(NEG, s${kk}_${r}, key${kk} <= pos0 + ${Math.floor(r / s.g)}u)`;
      });
      add(`    let sv${kk}_${r4} = vec4<f32>(${v.join(", ")});`);
      add(`    ps[(${kk * LANES}u + l) * R4 + ${r4}u] = sv${kk}_${r4};`);
    }
  }
  // B. Row maxima and rescales; C. probabilities; D. PV.
  add(
    `    workgroupBarrier();`,
    `    if (l < R) {`,
    `      let old = mrow[l / 4u][l % 4u];`,
    `      var mx = old;`,
    `      for (var j = 0u; j < KS; j++) { mx = max(mx, ps[j * R4 + l / 4u][l % 4u]); }`,
    `      alpha[l / 4u][l % 4u] = exp(old - mx);`,
    `      mrow[l / 4u][l % 4u] = mx;`,
    `    }`,
    `    workgroupBarrier();`,
  );
  for (const kk of keys) {
    for (const r4 of quads) {
      add(`    ps[(${kk * LANES}u + l) * R4 + ${r4}u] = exp(sv${kk}_${r4} - mrow[${r4}u]);`);
    }
  }
  add(`    workgroupBarrier();`);
  for (const r4 of quads) {
    add(`    let a${r4} = alpha[${r4}u];`, `    ls${r4} *= a${r4};`);
    for (let i = 0; i < 4; i++) add(`    o${4 * r4 + i} *= a${r4}.${"xyzw"[i]};`);
  }
  add(
    `    let nk = min(KS, kend - k0);`,
    `    for (var j = 0u; j < nk; j++) {`,
    `      let v = h4(vc[vrow[j] * D4 + l]);`,
  );
  for (const r4 of quads) {
    add(`      let p${r4} = ps[j * R4 + ${r4}u];`, `      ls${r4} += p${r4};`);
    for (let i = 0; i < 4; i++) {
      add(`      o${4 * r4 + i} = fma(vec4<f32>(p${r4}.${"xyzw"[i]}), v, o${4 * r4 + i});`);
    }
  }
  add(`    }`, `    workgroupBarrier();`, `  }`);
  for (const r of rows) {
    const t = Math.floor(r / s.g), g = r % s.g;
    add(
      `  out[((tok0 + ${t}u) * P.hq + kvh * G + ${g}u) * D4 + l] = ` +
        `o${r} / ls${Math.floor(r / 4)}.${"xyzw"[r % 4]};`,
    );
  }
  add(`}`);
  return lines.join("\n") + "\n";
}
