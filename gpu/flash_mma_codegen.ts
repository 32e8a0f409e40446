/**
 * WGSL generator for the subgroup-matrix prefill kernel (`wgsl/flash_mma.wgsl`): the kernel's
 * shape ({@link MmaShape}: subgroups, row blocks, keys per tile, lazy-rescale threshold), its
 * layout in workgroup memory ({@link mmaLayout}), and the straight-line matrix code unrolled
 * for one shape: Q fragments, S = Q K^T, O += P V, and the O passes (rescale, output) through
 * workgroup memory. Also the f16 staging decoders (per cache dtype and per data dtype) and
 * the integer round-to-nearest-even output packing.
 * @module
 */
import type { KvLayout, StorageDType } from "../core/types.ts";
import { decodeHelpers, dtypeTag, kvAccessors, loadWgsl, specialize } from "./wgsl.ts";

/** Dimensions of the device's f16 x f16 -> f32 subgroup matrices (M x K times K x N). */
export interface MmaDims {
  m: number;
  n: number;
  k: number;
}

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

/** What the kernel is compiled for besides its shape. */
export interface MmaKernelSpec {
  head_size: number;
  /** Query / output dtype. */
  dtype: "float16" | "bfloat16";
  /** The cache's storage dtype; null: K/V from the call (encoder types), in `dtype`. */
  storage: StorageDType | null;
  layout: KvLayout;
  block_size: number;
  /** Buffers per cache tensor (see gpu/kv_cache.ts). */
  nchunk: number;
  /** Subgroup size of the device (the workgroup is nsg of them). */
  subgroup_size: number;
  dims: MmaDims;
}

/** Derived compile-time sizes of one kernel. */
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

/** Why `shape` cannot be compiled for `spec` (within `maxShared` bytes), or null. */
export function mmaShapeProblem(
  spec: MmaKernelSpec,
  shape: MmaShape,
  maxShared = Infinity,
): string | null {
  const { m, n, k } = spec.dims, d = spec.head_size, sg = spec.subgroup_size;
  const mr = m * shape.rm;
  if (d % n || d % k || d % 16) return `head_size ${d} is not a multiple of ${Math.max(n, k, 16)}`;
  if (shape.bk % n || shape.bk % k) return `bk ${shape.bk} is not a multiple of ${n} and ${k}`;
  if (sg % mr && mr % sg) return `subgroup size ${sg} and ${mr} rows per subgroup do not nest`;
  if (shape.bk / Math.max(1, sg / mr) < 2) return `bk ${shape.bk} leaves a lane under 2 keys`;
  if (!(shape.tau >= 0 && shape.tau <= 11)) return `tau ${shape.tau} is outside 0..11`;
  const bytes = mmaLayout(spec, shape).shared_bytes;
  if (bytes > maxShared) return `needs ${bytes} B of workgroup memory (limit ${maxShared})`;
  return null;
}

/** Shapes in order of preference: the first that fits the device is the default. */
export const MMA_SHAPES: readonly MmaShape[] = [
  { nsg: 4, rm: 1, bk: 64, tau: 8 },
  { nsg: 4, rm: 1, bk: 32, tau: 8 },
  { nsg: 4, rm: 1, bk: 16, tau: 8 },
  { nsg: 2, rm: 1, bk: 32, tau: 8 },
  { nsg: 2, rm: 1, bk: 16, tau: 8 },
  { nsg: 1, rm: 1, bk: 16, tau: 8 },
];

/** The first of {@link MMA_SHAPES} that compiles for `spec` within `maxShared` bytes. */
export function chooseMmaShape(spec: MmaKernelSpec, maxShared: number): MmaShape | null {
  return MMA_SHAPES.find((s) => mmaShapeProblem(spec, s, maxShared) === null) ?? null;
}

/** Sizes of the kernel's arrays (see wgsl/flash_mma.wgsl). */
export function mmaLayout(spec: MmaKernelSpec, shape: MmaShape): MmaLayout {
  const d = spec.head_size, sg = spec.subgroup_size, mr = spec.dims.m * shape.rm;
  const rows = mr * shape.nsg, kstr = d + 8, sstr = shape.bk + 4, pstr = shape.bk + 8;
  const ktLen = Math.max(shape.bk * kstr, rows * pstr, mr * kstr);
  const qpass = Math.min(rows, Math.floor(ktLen / kstr / mr) * mr);
  const nbt = spec.storage === null ? 0 : Math.floor((shape.bk - 1) / spec.block_size) + 2;
  const e16 = 16 / BYTES[spec.storage ?? spec.dtype];
  const shared_bytes = 2 * ktLen + 2 * shape.bk * kstr + 4 * rows * sstr + 4 * (2 * nbt + 1) +
    12;
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

/** A readable pipeline key, e.g. `flash_mma[f16<f16]:hd128:bs16:NHD:c1:m16x16x16:sg32:w4r1k32:t8`. */
export function flashMmaKey(spec: MmaKernelSpec, shape: MmaShape): string {
  const { m, n, k } = spec.dims;
  const src = spec.storage === null
    ? "enc"
    : `${dtypeTag(spec.storage)}:bs${spec.block_size}:${spec.layout}:c${spec.nchunk}`;
  return `flash_mma[${dtypeTag(spec.dtype)}]:hd${spec.head_size}:${src}:m${m}x${n}x${k}:` +
    `sg${spec.subgroup_size}:w${shape.nsg}r${shape.rm}k${shape.bk}:t${shape.tau}`;
}

const F16_FROM_WORDS = `let a = select(w.zw, w.xy, i == 0u);
  return vec4<f16>(bitcast<vec2<f16>>(a.x), bitcast<vec2<f16>>(a.y));`;
const F16_FROM_BF16 = `let a = select(w.zw, w.xy, i == 0u);
  let x = vec4<f32>(bitcast<f32>(a.x << 16u), bitcast<f32>(a.x & 0xffff0000u),
                    bitcast<f32>(a.y << 16u), bitcast<f32>(a.y & 0xffff0000u));
  return vec4<f16>(clamp(x, vec4<f32>(-65504.0), vec4<f32>(65504.0)));`;

/**
 * `fn kv16(w: vec4<u32>, i: u32) -> vec4<f16>`: elements 4i..4i+3 of a 16-byte cache word
 * (values outside f16's range clamped to +-65504), and `fn q16` for the query's data dtype.
 */
export function stagingDecoders(storage: StorageDType, dtype: "float16" | "bfloat16"): string {
  const q = `fn q16(w: vec4<u32>, i: u32) -> vec4<f16> {
  ${dtype === "float16" ? F16_FROM_WORDS : F16_FROM_BF16}
}
`;
  if (storage === "float16") {
    return `${q}fn kv16(w: vec4<u32>, i: u32) -> vec4<f16> {\n  ${F16_FROM_WORDS}\n}\n`;
  }
  // Tint rejects NaN as a constant: make the fp8 decoders' NaN a runtime value.
  const dec = decodeHelpers(storage).replaceAll(
    "bitcast<f32>(0x7fc00000u)",
    "bitcast<f32>(0x7fc00000u | (b & 0u))",
  );
  return `${q}${dec}fn kv16(w: vec4<u32>, i: u32) -> vec4<f16> {
  return vec4<f16>(clamp(kv_decode16(w, i), vec4<f32>(-65504.0), vec4<f32>(65504.0)));
}
`;
}

/** `fn round_pair(a: f32, b: f32) -> u32`: two f32 as f16 or bf16 bits, nearest-even. */
export function roundHelpers(dtype: "float16" | "bfloat16"): string {
  // The same integer rounding as wgsl/cache_write.wgsl (byte-exact with core/dtype.ts).
  const bits = dtype === "float16"
    ? `fn out_bits(b: u32) -> u32 {
  let s = (b >> 16u) & 0x8000u;
  let e = (b >> 23u) & 0xffu;
  let m = b & 0x7fffffu;
  if (e == 0xffu) {
    return s | select(0x7c00u, 0x7e00u, m != 0u);
  }
  if (e >= 143u) {
    return s | 0x7c00u;
  }
  if (e >= 113u) {
    let h = ((e - 112u) << 10u) | (m >> 13u);
    let rem = m & 0x1fffu;
    return s | (h + select(0u, 1u, rem > 0x1000u || (rem == 0x1000u && (h & 1u) == 1u)));
  }
  if (e < 102u) {
    return s;
  }
  let full = m | 0x800000u;
  let shift = 126u - e;
  let h = full >> shift;
  let rem = full & ((1u << shift) - 1u);
  let half = 1u << (shift - 1u);
  return s | (h + select(0u, 1u, rem > half || (rem == half && (h & 1u) == 1u)));
}`
    : `fn out_bits(b: u32) -> u32 {
  if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu) != 0u) {
    return ((b >> 16u) | 0x40u) & 0xffffu;
  }
  return ((b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u) & 0xffffu;
}`;
  return `${bits}
fn round_pair(a: f32, b: f32) -> u32 {
  return out_bits(bitcast<u32>(a)) | (out_bits(bitcast<u32>(b)) << 16u);
}
`;
}

/** src_k / src_v: the 16-byte word c of key `key`'s row for kv head h. */
function sourceCode(spec: MmaKernelSpec): string {
  const sig = "key: u32, h: u32, c: u32, kt: u32, par: u32, rbase: u32";
  if (spec.storage === null) {
    const fn = (t: string) =>
      `fn src_${t}(${sig}) -> vec4<u32> {
  return ${t}_in[((rbase + key) * U.num_kv_heads + h) * V4R + c];
}
`;
    return `@group(0) @binding(5) var<storage, read> k_in: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> v_in: array<vec4<u32>>;
${fn("k")}${fn("v")}`;
  }
  const acc = kvAccessors({
    nchunk: spec.nchunk,
    blocksPerChunk: "U.blocks_per_chunk",
    blockWords: "U.block_words",
    firstBinding: 5,
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

/** The unrolled matrix fragments of flash_mma.wgsl for one kernel. */
export function generateMatrixCode(spec: MmaKernelSpec, shape: MmaShape): Record<string, string> {
  const { m, n, k } = spec.dims, d = spec.head_size, bk = shape.bk;
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
        `  let kf = subgroupMatrixLoad<${Rt}, col_major>(&kt_s, ${c * n * kstr + kk * k}u, KSTR);`,
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
      `let p_${r}_${kk} = subgroupMatrixLoad<${L}, row_major>(&kt_s, (sgr + ${r * m}u) * PSTR + ${
        kk * k
      }u, PSTR);`
    )
  );
  for (const c of DN) {
    for (const kk of KB) {
      pv.push(`{`);
      pv.push(
        `  let vf = subgroupMatrixLoad<${Rt}, row_major>(&vt_s, ${kk * k * kstr + c * n}u, KSTR);`,
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

/** The full WGSL of one kernel. */
export async function flashMmaWgsl(spec: MmaKernelSpec, shape: MmaShape): Promise<string> {
  const problem = mmaShapeProblem(spec, shape);
  if (problem) throw new Error(`flash_mma: ${problem}`);
  const lay = mmaLayout(spec, shape);
  const { m, n, k } = spec.dims;
  return specialize(await loadWgsl("flash_mma.wgsl"), {
    MM: m,
    MN: n,
    MK: k,
    SG: spec.subgroup_size,
    NSG: shape.nsg,
    RM: shape.rm,
    BK: shape.bk,
    D: spec.head_size,
    BS: spec.storage === null ? 16 : spec.block_size,
    NHD: spec.storage === null || spec.layout === "NHD",
    TAU: shape.tau,
    E16: lay.e16,
    KT_LEN: lay.ktLen,
    QPASS: lay.qpass,
    LPR: lay.lpr,
    RPL: lay.rpl,
    NBT: lay.nbt,
    DECODE: stagingDecoders(spec.storage ?? spec.dtype, spec.dtype),
    SOURCE: sourceCode(spec),
    ROUND: roundHelpers(spec.dtype),
    ...generateMatrixCode(spec, shape),
  });
}
