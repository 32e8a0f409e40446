/**
 * WGSL generator for the subgroup-matrix prefill kernel (`wgsl/flash_mma.wgsl`): the compile-time
 * values of one variant ({@link MmaConsts}: what the batch and device fix, plus the kernel
 * shape {@link MmaShape}), its workgroup-memory layout ({@link mmaLayout}), the shapes tried in
 * order ({@link MMA_SHAPES}), and the straight-line matrix code unrolled for one variant: Q
 * fragments, S = Q K^T, O += P V, and the O passes (rescale, output) through workgroup memory;
 * also the f16 staging decoders per K/V dtype and per data dtype.
 * @module
 */
import type { StorageDType } from "../core/types.ts";
import { kvAccessorFns, loadWgsl, specialize } from "./wgsl.ts";

/** A kernel shape. Rows per workgroup = nsg * rm * m. */
export interface MmaShape {
  /** Subgroups per workgroup. */
  nsg: number;
  /** Row blocks (of m rows) per subgroup. */
  rm: number;
  /** Keys per K/V tile. */
  bk: number;
  /** Lazy-rescale threshold (natural log units, 0..11); 0 rescales on every new max. */
  tau: number;
}

/** What the batch and the device fix: data and K/V dtypes, layout, matrix dims, subgroup size. */
export interface MmaTarget {
  /** K/V element type: the cache's storage dtype, or the data dtype for encoder types. */
  kv: StorageDType;
  /** Query / output dtype. */
  dtype: "float16" | "bfloat16";
  /** K/V from the call (encoder types) instead of the cache. */
  enc: boolean;
  d: number;
  bs: number;
  nhd: boolean;
  /** Buffers per cache tensor (0 for encoder types). */
  nchunk: number;
  /** f16 x f16 -> f32 subgroup-matrix dims (M x K times K x N). */
  m: number;
  n: number;
  k: number;
  /** The device's subgroup size. */
  sg: number;
}

/** Every compile-time value of one variant (the pipeline key names them all). */
export interface MmaConsts extends MmaTarget, MmaShape {
  [k: string]: string | number | boolean;
}

/** Derived compile-time sizes of one variant. */
export interface MmaLayout {
  rows: number;
  wg: number;
  ktLen: number;
  qpass: number;
  lpr: number;
  rpl: number;
  nbt: number;
  e16: number;
  /** Workgroup memory in bytes. */
  shared_bytes: number;
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);
const BYTES: Record<StorageDType, number> = {
  float32: 4,
  float16: 2,
  bfloat16: 2,
  fp8_e4m3: 1,
  fp8_e5m2: 1,
};

/** Why `shape` cannot be compiled for `t` (within `maxShared` bytes), or null. */
export function mmaShapeProblem(
  t: MmaTarget,
  shape: MmaShape,
  maxShared = Infinity,
): string | null {
  const { m, n, k, d, sg } = t;
  const mr = m * shape.rm;
  if (d % n || d % k || d % 16) return `head_size ${d} is not a multiple of ${Math.max(n, k, 16)}`;
  if (shape.bk % n || shape.bk % k) return `bk ${shape.bk} is not a multiple of ${n} and ${k}`;
  if (sg % mr && mr % sg) return `subgroup size ${sg} and ${mr} rows per subgroup do not nest`;
  if (shape.bk / Math.max(1, sg / mr) < 2) return `bk ${shape.bk} leaves a lane under 2 keys`;
  if (!(shape.tau >= 0 && shape.tau <= 11)) return `tau ${shape.tau} is outside 0..11`;
  const bytes = mmaLayout(t, shape).shared_bytes;
  if (bytes > maxShared) return `needs ${bytes} B of workgroup memory (limit ${maxShared})`;
  return null;
}

/** Shapes in order of preference: the first that fits the device is the default. */
export const MMA_SHAPES: readonly MmaShape[] = [
  { nsg: 8, rm: 1, bk: 16, tau: 8 },
  { nsg: 4, rm: 1, bk: 16, tau: 8 },
  { nsg: 4, rm: 1, bk: 32, tau: 8 },
  { nsg: 2, rm: 1, bk: 16, tau: 8 },
  { nsg: 2, rm: 1, bk: 8, tau: 8 },
  { nsg: 1, rm: 1, bk: 8, tau: 8 },
];

/** The first of {@link MMA_SHAPES} that compiles for `t` within `maxShared` bytes. */
export function chooseMmaShape(t: MmaTarget, maxShared: number): MmaShape | null {
  return MMA_SHAPES.find((s) => mmaShapeProblem(t, s, maxShared) === null) ?? null;
}

/** Sizes of the kernel's arrays (see wgsl/flash_mma.wgsl). */
export function mmaLayout(t: MmaTarget, shape: MmaShape): MmaLayout {
  const { d, sg } = t, mr = t.m * shape.rm;
  const rows = mr * shape.nsg, kstr = d + 8, sstr = shape.bk + 4, pstr = shape.bk + 8;
  const ktLen = Math.max(shape.bk * kstr, rows * pstr, mr * kstr);
  const qpass = Math.min(rows, Math.floor(ktLen / kstr / mr) * mr);
  const nbt = t.enc ? 0 : Math.floor((shape.bk - 1) / t.bs) + 2;
  const e16 = 16 / BYTES[t.kv];
  const shared_bytes = 2 * (2 * ktLen + 2 * shape.bk * kstr) + 4 * rows * sstr +
    4 * (2 * nbt + 1) + 12;
  return {
    rows,
    wg: sg * shape.nsg,
    ktLen,
    qpass,
    lpr: Math.max(1, sg / mr),
    rpl: Math.max(1, mr / sg),
    nbt,
    e16,
    shared_bytes,
  };
}

const F16_FROM_WORDS = `let a = select(w.zw, w.xy, i == 0u);
  return vec4<f16>(bitcast<vec2<f16>>(a.x), bitcast<vec2<f16>>(a.y));`;
const F16_FROM_BF16 = `let a = select(w.zw, w.xy, i == 0u);
  let x = vec4<f32>(bitcast<f32>(a.x << 16u), bitcast<f32>(a.x & 0xffff0000u),
                    bitcast<f32>(a.y << 16u), bitcast<f32>(a.y & 0xffff0000u));
  return vec4<f16>(clamp(x, vec4<f32>(-65504.0), vec4<f32>(65504.0)));`;

/** fp8 bytes (4 in a word) to f16, exactly and without branches (e4m3fn NaN -> f16 NaN). */
export const FP8_TO_F16: Record<"fp8_e4m3" | "fp8_e5m2", string> = {
  // e5m2 is the top byte of an f16.
  fp8_e5m2: `fn fp8x4_f16(x: u32) -> vec4<f16> {
  let lo = ((x & 0xffu) << 8u) | ((x & 0xff00u) << 16u);
  let hi = ((x >> 8u) & 0xff00u) | (x & 0xff000000u);
  return vec4<f16>(bitcast<vec2<f16>>(lo), bitcast<vec2<f16>>(hi));
}
`,
  // e4m3fn: exponent + 8 for normals; a subnormal m * 2^-9 is an f16 normal built from m's
  // leading bit; 0x7f/0xff are NaN.
  fp8_e4m3: `fn fp8x4_f16(x: u32) -> vec4<f16> {
  let b = (vec4<u32>(x) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
  let em = b & vec4<u32>(0x7fu);
  let m = em & vec4<u32>(7u);
  let p = firstLeadingBit(max(m, vec4<u32>(1u)));
  let sub = ((p + 6u) << vec4<u32>(10u)) | ((m ^ (vec4<u32>(1u) << p)) << (10u - p));
  var h = select((em << vec4<u32>(7u)) + 0x2000u, select(sub, vec4<u32>(0u), m == vec4<u32>(0u)), em < vec4<u32>(8u));
  h = select(h, vec4<u32>(0x7e00u), em == vec4<u32>(0x7fu));
  let w = ((b & vec4<u32>(0x80u)) << vec4<u32>(8u)) | h;
  return vec4<f16>(bitcast<vec2<f16>>(w.x | (w.y << 16u)), bitcast<vec2<f16>>(w.z | (w.w << 16u)));
}
`,
};

/**
 * `fn kv16(w: vec4<u32>, i: u32) -> vec4<f16>`: elements 4i..4i+3 of a 16-byte K/V word
 * (bf16 and f32 values outside f16's range clamped to +-65504; fp8 always fits, exactly),
 * and `fn q16` for the query's data dtype.
 */
export function stagingDecoders(storage: StorageDType, dtype: "float16" | "bfloat16"): string {
  const q = `fn q16(w: vec4<u32>, i: u32) -> vec4<f16> {
  ${dtype === "float16" ? F16_FROM_WORDS : F16_FROM_BF16}
}
`;
  const fn = (body: string) => `fn kv16(w: vec4<u32>, i: u32) -> vec4<f16> {\n  ${body}\n}\n`;
  switch (storage) {
    case "float16":
      return q + fn(F16_FROM_WORDS);
    case "bfloat16":
      return q + fn(F16_FROM_BF16);
    case "fp8_e4m3":
    case "fp8_e5m2":
      return q + FP8_TO_F16[storage] + fn("return fp8x4_f16(w[i]);");
    case "float32":
      return q + fn(
        "return vec4<f16>(clamp(bitcast<vec4<f32>>(w), vec4<f32>(-65504.0), vec4<f32>(65504.0)));",
      );
  }
}

/** round.wgsl's integer nearest-even rounding and `fn round_pair(a, b) -> u32` for `dtype`. */
export async function roundCode(dtype: "float16" | "bfloat16"): Promise<string> {
  const f = dtype === "float16" ? "f16_bits" : "bf16_bits";
  return `${await loadWgsl("round.wgsl")}
fn round_pair(a: f32, b: f32) -> u32 {
  return ${f}(bitcast<u32>(a)) | (${f}(bitcast<u32>(b)) << 16u);
}
`;
}

/** src_k / src_v: the 16-byte word c of key `key`'s row for kv head h. */
function sourceCode(c: MmaTarget): string {
  const sig = "key: u32, h: u32, c: u32, kt: u32, par: u32, rbase: u32";
  if (c.enc) {
    return ["k", "v"].map((t) =>
      `fn src_${t}(${sig}) -> vec4<u32> {
  return ${t}_in[((rbase + key) * U.num_kv_heads + h) * V4R + c];
}
`
    ).join("");
  }
  const acc = kvAccessorFns({
    nchunk: c.nchunk,
    blocksPerChunk: "U.blocks_per_chunk",
    blockWords: "U.block_words",
    vec4: true,
  });
  const fn = (t: string) =>
    `fn src_${t}(${sig}) -> vec4<u32> {
  let br = kv_row(key, h, kt, par);
  return load_${t}4(br.x, br.y + 4u * c);
}
`;
  return `${acc}
fn kv_row(key: u32, h: u32, kt: u32, par: u32) -> vec2<u32> {
  let block = s_blk[par * NBT + key / BS - kt / BS];
  let off = key % BS;
  if (NHD) {
    return vec2<u32>(block, (off * U.num_kv_heads + h) * WPR);
  }
  return vec2<u32>(block, (h * BS + off) * WPR);
}
${fn("k")}${fn("v")}`;
}

/**
 * The softmax step of one lane, unrolled: for each of its RPL rows, KPL scores read from S,
 * capped, biased and masked (`score`), the row max over the LPR lanes, the lazy rescale, and
 * p = exp(s - m) as f16 into P; sets the workgroup's rescale flag when an accumulated row moved.
 */
export function softmaxCode(c: MmaConsts): string {
  const lay = mmaLayout(c, c), kpl = c.bk / lay.lpr, E = range(kpl);
  const out = ["var flag = false;"];
  for (const i of range(lay.rpl)) {
    const tree = (xs: string[]): string =>
      xs.length === 1
        ? xs[0]
        : `max(${tree(xs.slice(0, xs.length / 2))}, ${tree(xs.slice(xs.length / 2))})`;
    out.push(
      "{",
      `  let rl = ln / LPR + ${i * (c.sg / lay.lpr)}u;`,
      "  let sb = (sgr + rl) * SSTR + lq * KPL;",
      "  let pb = (sgr + rl) * PSTR + lq * KPL;",
      "  let k0 = kt + lq * KPL;",
      ...E.map((e) =>
        `  let x${e} = select(MASK, score(s_s[sb + ${e}u], rpos[${i}], rslope[${i}], k0 + ${e}u, kend), rok[${i}]);`
      ),
      `  var tmax = ${tree(E.map((e) => `x${e}`))};`,
      "  for (var o = 1u; o < LPR; o <<= 1u) {",
      "    tmax = max(tmax, subgroupShuffleXor(tmax, o));",
      "  }",
      `  if (tmax > m[${i}] + TAU) {`,
      `    alpha[${i}] = exp(m[${i}] - tmax);`,
      `    l[${i}] *= alpha[${i}];`,
      `    m[${i}] = tmax;`,
      `    flag = flag || seen[${i}];`,
      "  }",
      ...E.map((e) =>
        `  let p${e} = f16(select(0.0, exp(x${e} - m[${i}]), x${e} > MASK));\n  kt_s[kb + pb + ${e}u] = p${e};`
      ),
      `  l[${i}] += ${E.map((e) => `f32(p${e})`).join(" + ")};`,
      `  seen[${i}] = seen[${i}] || tmax > MASK;`,
      "}",
    );
  }
  out.push("if (flag) {", "  s_resc = 1u;", "}");
  return out.map((x) => x.split("\n").map((y) => "      " + y).join("\n")).join("\n");
}

/**
 * K/V staging, unrolled over the NLD 16-byte words each invocation moves per tile:
 * STAGE_LOAD loads tile `kn`'s words (block ids in slot `sn`; zero past `kend`) into wk_i /
 * wv_i, STAGE_STORE decodes them to f16 into the buffers at `kbn` / `vbn`.
 */
export function stagingCode(c: MmaConsts): { STAGE_LOAD: string; STAGE_STORE: string } {
  const lay = mmaLayout(c, c), v4r = c.d / lay.e16, words = c.bk * v4r;
  const N = range(Math.ceil(words / lay.wg)), guard = words % lay.wg !== 0;
  const load: string[] = [], store: string[] = [];
  for (const i of N) {
    load.push(
      `var wk${i} = vec4<u32>(0u);`,
      `var wv${i} = vec4<u32>(0u);`,
      "{",
      `  let idx = t + ${i * lay.wg}u;`,
      "  let key = kn + idx / V4R;",
      `  if (${guard ? "idx < BK * V4R && " : ""}key < kend) {`,
      `    wk${i} = src_k(key, kvh, idx % V4R, kn, sn, rbase);`,
      `    wv${i} = src_v(key, kvh, idx % V4R, kn, sn, rbase);`,
      "  }",
      "}",
    );
    store.push("{", `  let idx = t + ${i * lay.wg}u;`);
    if (guard) store.push("  if (idx < BK * V4R) {");
    store.push("  let o = (idx / V4R) * KSTR + (idx % V4R) * E16;");
    for (const j of range(lay.e16 / 4)) {
      store.push(`  let a${j} = kv16(wk${i}, ${j}u);`, `  let b${j} = kv16(wv${i}, ${j}u);`);
      for (const [e, f] of ["x", "y", "z", "w"].entries()) {
        store.push(`  kt_s[kbn + o + ${4 * j + e}u] = a${j}.${f};`);
        store.push(`  vt_s[vbn + o + ${4 * j + e}u] = b${j}.${f};`);
      }
    }
    if (guard) store.push("  }");
    store.push("}");
  }
  const ind = (xs: string[]) => xs.map((x) => "    " + x).join("\n");
  return { STAGE_LOAD: ind(load), STAGE_STORE: ind(store) };
}

/** The unrolled matrix fragments of flash_mma.wgsl for one kernel. */
export function generateMatrixCode(c: MmaConsts): Record<string, string> {
  const { m, n, k, d, bk } = c, shape = c;
  const kstr = d + 8;
  const RM = range(shape.rm), KD = range(d / k), NB = range(bk / n), KB = range(bk / k);
  const DN = range(d / n);
  const L = `subgroup_matrix_left<f16, MK, MM>`, Rt = `subgroup_matrix_right<f16, MN, MK>`;
  const Res = `subgroup_matrix_result<f32, MN, MM>`;
  const mma = "subgroupMatrixMultiplyAccumulate";
  const ind = (s: string[], pad: string) => s.map((x) => pad + x).join("\n");
  const qDecl = RM.flatMap((r) => KD.map((c) => `var q_${r}_${c}: ${L};`));
  const qLoad = RM.flatMap((r) =>
    KD.map((c) =>
      `q_${r}_${c} = subgroupMatrixLoad<${L}, row_major>(&kt_s, qb + ${
        r * m * kstr + c * k
      }u, KSTR);`
    )
  );
  const oDecl = RM.flatMap((r) => DN.map((c) => `var o_${r}_${c} = ${Res}();`));
  const qk = RM.flatMap((r) => NB.map((c) => `var s_${r}_${c} = ${Res}();`));
  for (const c of NB) {
    for (const kk of KD) {
      qk.push(`{`);
      qk.push(
        `  let kf = subgroupMatrixLoad<${Rt}, col_major>(&kt_s, kb + ${
          c * n * kstr + kk * k
        }u, KSTR);`,
      );
      for (const r of RM) qk.push(`  s_${r}_${c} = ${mma}(q_${r}_${kk}, kf, s_${r}_${c});`);
      qk.push(`}`);
    }
  }
  for (const r of RM) {
    for (const c of NB) {
      qk.push(
        `subgroupMatrixStore<row_major>(&s_s, (sgr + ${r * m}u) * SSTR + ${
          c * n
        }u, s_${r}_${c}, SSTR);`,
      );
    }
  }
  const pv = RM.flatMap((r) =>
    KB.map((kk) =>
      `let p_${r}_${kk} = subgroupMatrixLoad<${L}, row_major>(&kt_s, kb + (sgr + ${
        r * m
      }u) * PSTR + ${kk * k}u, PSTR);`
    )
  );
  for (const c of DN) {
    for (const kk of KB) {
      pv.push(`{`);
      pv.push(
        `  let vf = subgroupMatrixLoad<${Rt}, row_major>(&vt_s, vb + ${
          kk * k * kstr + c * n
        }u, KSTR);`,
      );
      for (const r of RM) pv.push(`  o_${r}_${c} = ${mma}(p_${r}_${kk}, vf, o_${r}_${c});`);
      pv.push(`}`);
    }
  }
  // O passes: columns [c0, c0 + bk) through s_s.
  const passes = range(Math.ceil(d / bk)).map((p) => {
    const c0 = p * bk;
    const frags = RM.flatMap((r) =>
      DN.filter((c) => c * n >= c0 && c * n < c0 + bk).map((c) => ({
        name: `o_${r}_${c}`,
        at: `(sgr + ${r * m}u) * SSTR + ${c * n - c0}u`,
      }))
    );
    return { c0, frags };
  });
  const store = (fs: { name: string; at: string }[]) =>
    fs.map((f) => `subgroupMatrixStore<row_major>(&s_s, ${f.at}, ${f.name}, SSTR);`);
  const rescale: string[] = [], output: string[] = [];
  passes.forEach(({ c0, frags }, i) => {
    rescale.push(...store(frags), "workgroupBarrier();", "scale_rows(sgr, ln, alpha);");
    rescale.push("workgroupBarrier();");
    rescale.push(
      ...frags.map((f) =>
        `${f.name} = subgroupMatrixLoad<${Res}, row_major>(&s_s, ${f.at}, SSTR);`
      ),
    );
    rescale.push("workgroupBarrier();");
    output.push(...store(frags), "workgroupBarrier();", `write_rows(sgr, ln, ${c0}u, tb, inv);`);
    if (i < passes.length - 1) output.push("workgroupBarrier();");
  });
  return {
    QFRAG_DECL: ind(qDecl, "  "),
    QFRAG_LOAD: ind(qLoad, "      "),
    O_DECL: ind(oDecl, "  "),
    QK: ind(qk, "      "),
    PV: ind(pv, "      "),
    O_RESCALE: ind(rescale, "      "),
    O_OUTPUT: ind(output, "  "),
  };
}

/** The kernel source after the generated header (gpu/kernel.ts adds enables and bindings). */
export async function flashMmaSource(c: MmaConsts): Promise<string> {
  const problem = mmaShapeProblem(c, c);
  if (problem) throw new Error(`flash_mma: ${problem}`);
  const lay = mmaLayout(c, c);
  return specialize(await loadWgsl("flash_mma.wgsl"), {
    MM: c.m,
    MN: c.n,
    MK: c.k,
    SG: c.sg,
    NSG: c.nsg,
    RM: c.rm,
    BK: c.bk,
    D: c.d,
    BS: c.bs,
    NHD: c.nhd,
    TAU: c.tau,
    E16: lay.e16,
    KT_LEN: lay.ktLen,
    QPASS: lay.qpass,
    LPR: lay.lpr,
    RPL: lay.rpl,
    NBT: lay.nbt,
    DECODE: stagingDecoders(c.kv, c.dtype),
    SOURCE: sourceCode(c),
    ROUND: await roundCode(c.dtype),
    SOFTMAX: softmaxCode(c),
    ...stagingCode(c),
    ...generateMatrixCode(c),
  });
}
