/**
 * The K/V and query side of the subgroup-matrix prefill kernel's WGSL: 16-byte words to f16
 * (per K/V storage dtype and per data dtype; finite bf16/f32 values clamped to f16's range,
 * infinities and NaNs kept as such; fp8 exact and branch-free), the K/V sources (paged cache
 * through kvAccessorFns, or the call's K/V), the double-buffered staging code unrolled for one
 * variant (none for direct loads), and the output rounding.
 * @module
 */
import type { StorageDType } from "../core/types.ts";
import { type MmaConsts, mmaLayout, type MmaTarget, strideArg } from "./flash_mma_shape.ts";
import { kvAccessorFns, loadWgsl } from "./wgsl.ts";

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

const F16_FROM_WORDS = `let a = select(w.zw, w.xy, i == 0u);
  return vec4<f16>(bitcast<vec2<f16>>(a.x), bitcast<vec2<f16>>(a.y));`;
/** The f16 class test and the select that keep an infinity or a NaN when staged (see below). */
const KEEP_SPECIALS = `let sp = vec4<u32>(0x7f800000u);
  return select(x, nf, (b & sp) == sp);`;

/**
 * bf16 -> f16: a finite value clamped to +-65504 (outside f16's finite range a conversion is
 * indeterminate in WGSL), an infinity or a NaN (all-ones exponent, told by a bit test, not by a
 * float compare) built from bits: the sign, f16's all-ones exponent and the bf16 mantissa
 * shifted up 3 (NaN stays NaN, infinity stays infinity). clamp() would make an infinity
 * +-65504 and leaves a NaN implementation-defined (the soft cap's made it +-15).
 */
const F16_FROM_BF16 = `let a = select(w.zw, w.xy, i == 0u);
  let b = vec4<u32>(a.x << 16u, a.x & 0xffff0000u, a.y << 16u, a.y & 0xffff0000u);
  let x = vec4<f16>(clamp(bitcast<vec4<f32>>(b), vec4<f32>(-65504.0), vec4<f32>(65504.0)));
  let e = (a & vec2<u32>(0x80008000u)) | vec2<u32>(0x7c007c00u) |
          ((a & vec2<u32>(0x007f007fu)) << vec2<u32>(3u));
  let nf = vec4<f16>(bitcast<vec2<f16>>(e.x), bitcast<vec2<f16>>(e.y));
  ${KEEP_SPECIALS}`;

/**
 * f32 -> f16, as {@link F16_FROM_BF16}: finite values clamped, an infinity or a NaN built from
 * bits (a NaN's mantissa may sit below f16's 10 bits: it gets f16's quiet bit instead).
 */
const F16_FROM_F32 = `let b = w;
  let x = vec4<f16>(clamp(bitcast<vec4<f32>>(b), vec4<f32>(-65504.0), vec4<f32>(65504.0)));
  let qn = (b & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
  let h = ((b >> vec4<u32>(16u)) & vec4<u32>(0x8000u)) | vec4<u32>(0x7c00u) |
          select(vec4<u32>(0u), vec4<u32>(0x200u), qn);
  let nf = vec4<f16>(bitcast<vec2<f16>>(h.x | (h.y << 16u)), bitcast<vec2<f16>>(h.z | (h.w << 16u)));
  ${KEEP_SPECIALS}`;

/** fp8 bytes (4 in a word) to f16, exactly and without branches (e4m3fn NaN -> f16 NaN). */
export const FP8_TO_F16: Record<"fp8_e4m3" | "fp8_e5m2", string> = {
  // e5m2 is the top byte of an f16.
  fp8_e5m2: `fn fp8x4_f16(x: u32) -> vec4<f16> {
  let lo = ((x & 0xffu) << 8u) | ((x & 0xff00u) << 16u);
  let hi = ((x >> 8u) & 0xff00u) | (x & 0xff000000u);
  return vec4<f16>(bitcast<vec2<f16>>(lo), bitcast<vec2<f16>>(hi));
}
`,
  // e4m3fn, bias 7: a normal byte's bits moved into f16 positions with 8 added to the
  // exponent; a subnormal m * 2^-9 converted from f32 (an f16 normal), signed by a select; no
  // f16 subnormal is formed, so a flush-to-zero device decodes exactly too. S.1111.111 gets an
  // all-ones exponent and a nonzero mantissa (NaN). The earlier decoder (firstLeadingBit,
  // nested selects) kept the fp8 e4m3 test compiling for over 200 s on the H200 (Dawn 0.6.2,
  // driver 580.159.04); a shift-and-select decoder compiled and ran in 1.3 s.
  fp8_e4m3: `fn fp8x4_f16(x: u32) -> vec4<f16> {
  let b = (vec4<u32>(x) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
  let em = b & vec4<u32>(0x7fu);
  var h = ((b & vec4<u32>(0x80u)) << vec4<u32>(8u)) | ((em << vec4<u32>(7u)) + vec4<u32>(0x2000u));
  h = select(h, h | vec4<u32>(0x7e00u), em == vec4<u32>(0x7fu));
  let n = vec4<f16>(bitcast<vec2<f16>>(h.x | (h.y << 16u)), bitcast<vec2<f16>>(h.z | (h.w << 16u)));
  let sub = vec4<f16>(vec4<f32>(em) * 0.001953125);
  let neg = (b & vec4<u32>(0x80u)) != vec4<u32>(0u);
  return select(n, select(sub, -sub, neg), em < vec4<u32>(8u));
}
`,
};

/**
 * `fn kv16(w: vec4<u32>, i: u32) -> vec4<f16>`: elements 4i..4i+3 of a 16-byte K/V word
 * (finite bf16 and f32 values outside f16's range clamped to +-65504, infinities and NaNs
 * kept as such; fp8 always fits, exactly), and `fn q16` for the query's data dtype (bf16 as
 * bf16 K/V). Only these convert: direct and matrix-staged loads (and direct loads' last,
 * partial V tile) need an f16 cache and copy its bits.
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
      return q + fn(F16_FROM_F32);
  }
}

/**
 * round.wgsl's integer nearest-even rounding and `fn round_pair(a, b) -> u32` for `dtype`.
 * `pack`: f16 pairs inside f16's finite range take `pack2x16float` (one conversion instruction
 * where the device rounds to nearest even, as NVIDIA's cvt.rn and LLVM's fptrunc do; WGSL leaves
 * the result indeterminate only outside that range), the rest (large, infinite, NaN) the integer
 * path. `cut` (bench ablation, wrong results): the top halves of the f32 bits, no rounding.
 */
export async function roundCode(
  dtype: "float16" | "bfloat16",
  mode: "exact" | "pack" | "cut" = "exact",
): Promise<string> {
  const f = dtype === "float16" ? "f16_bits" : "bf16_bits";
  const exact = `${f}(bitcast<u32>(a)) | (${f}(bitcast<u32>(b)) << 16u)`;
  const body = mode === "cut"
    ? "  return (bitcast<u32>(a) >> 16u) | (bitcast<u32>(b) & 0xffff0000u);"
    : mode === "pack" && dtype === "float16"
    ? [
      // |a|, |b| < 65504 as integers: a float compare with NaN is not kept false by every
      // compiler (llvmpipe's GL took a NaN through it).
      "  if (max(bitcast<u32>(a) & 0x7fffffffu, bitcast<u32>(b) & 0x7fffffffu) < 0x477fe000u) {",
      "    return pack2x16float(vec2<f32>(a, b));",
      "  }",
      `  return ${exact};`,
    ].join("\n")
    : `  return ${exact};`;
  return `${await loadWgsl("round.wgsl")}
fn round_pair(a: f32, b: f32) -> u32 {
${body}
}
`;
}

/**
 * src_k / src_v: the 16-byte word c of key `key`'s row for kv head h; for `direct` loads
 * instead `kv_elem`, the f16 element offset of key `key`'s row in k0 / v0 (rows of one block
 * `kvstr` elements apart).
 */
export function sourceCode(c: MmaTarget & { direct?: boolean; mstage?: boolean }): string {
  if (c.direct || c.mstage) {
    return `fn kv_elem(key: u32, h: u32, kv_len: u32, rbase: u32) -> u32 {
  let at = blk_of(key, 0u, kv_len, rbase) * U.block_words * 2u;
  if (NHD) {
    return at + ((key % BS) * U.num_kv_heads + h) * D;
  }
  return at + (h * BS + key % BS) * D;
}
`;
  }
  const sig = "key: u32, h: u32, c: u32, rbase: u32";
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
  let br = kv_row(key, h, rbase);
  return load_${t}4(br.x, br.y + 4u * c);
}
`;
  return `${acc}
fn kv_row(key: u32, h: u32, rbase: u32) -> vec2<u32> {
  let block = mdw[U.off_bt + rbase + key / BS]; // key < kend <= kv_len: within the row
  let off = key % BS;
  if (NHD) {
    return vec2<u32>(block, (off * U.num_kv_heads + h) * WPR);
  }
  return vec2<u32>(block, (h * BS + off) * WPR);
}
${fn("k")}${fn("v")}`;
}

/** The staging placeholders of flash_mma.wgsl (see {@link stagingCode}). */
export interface StagingCode {
  /** Loads tile `kn` (the prologue's first, the loop's next) into registers. */
  STAGE_LOAD: string;
  /** Stores those registers into the buffers at `kbn` / `vbn`. */
  STAGE_STORE: string;
}

/**
 * K/V staging, unrolled over the NLD 16-byte words each invocation moves per tile:
 * STAGE_LOAD loads tile `kn`'s words (block ids from the table; zero past `kend`) into wk_i /
 * wv_i, STAGE_STORE decodes them to f16 into the buffers at `kbn` / `vbn`.
 */
export function stagingCode(c: MmaConsts): StagingCode {
  if (c.direct) return { STAGE_LOAD: "", STAGE_STORE: "" };
  if (c.mstage) return matrixStagingCode(c);
  const lay = mmaLayout(c, c), v4r = c.d / lay.e16, words = c.bk * v4r;
  const N = range(Math.ceil(words / lay.wg)), guard = words % lay.wg !== 0;
  const load = () =>
    N.flatMap((i) => [
      `var wk${i} = vec4<u32>(0u);`,
      `var wv${i} = vec4<u32>(0u);`,
      "{",
      `  let idx = t + ${i * lay.wg}u;`,
      "  let key = kn + idx / V4R;",
      `  if (${guard ? "idx < BK * V4R && " : ""}key < kend) {`,
      `    wk${i} = src_k(key, kvh, idx % V4R, rbase);`,
      `    wv${i} = src_v(key, kvh, idx % V4R, rbase);`,
      "  }",
      "}",
    ]);
  const store = () =>
    N.flatMap((i) => {
      const out = ["{", `  let idx = t + ${i * lay.wg}u;`];
      if (guard) out.push("  if (idx < BK * V4R) {");
      out.push("  let o = (idx / V4R) * KSTR + (idx % V4R) * E16;");
      for (const j of range(lay.e16 / 4)) {
        out.push(`  let a${j} = kv16(wk${i}, ${j}u);`, `  let b${j} = kv16(wv${i}, ${j}u);`);
        for (const [e, f] of ["x", "y", "z", "w"].entries()) {
          out.push(`  kt_s[kbn + o + ${4 * j + e}u] = a${j}.${f};`);
          out.push(`  vt_s[vbn + o + ${4 * j + e}u] = b${j}.${f};`);
        }
      }
      if (guard) out.push("  }");
      out.push("}");
      return out;
    });
  const ind = (xs: string[], pad = "    ") => xs.map((x) => pad + x).join("\n");
  return { STAGE_LOAD: ind(load()), STAGE_STORE: ind(store()) };
}

/**
 * `mstage` staging: tile `kn`'s (BK / MM) x (D / MK) fragments of K and V, fragment f moved by
 * subgroup f % NSG: STAGE_LOAD `subgroupMatrixLoad`s them from the f16 cache (a fragment's MM
 * rows lie in one block, kvstr apart) when the tile ends within the request (`mxn`), STAGE_STORE
 * `subgroupMatrixStore`s them; a tile that crosses kv_len is copied element by element in
 * STAGE_STORE, zero past kend (a cache slot past the request may hold NaN).
 */
function matrixStagingCode(c: MmaConsts): { STAGE_LOAD: string; STAGE_STORE: string } {
  const fc = c.d / c.k, count = (c.bk / c.m) * fc, L = "subgroup_matrix_left<f16, MK, MM>";
  const slots = range(Math.ceil(count / c.nsg));
  const guard = (i: number) => (count % c.nsg ? `sg + ${i * c.nsg}u < ${count}u` : "true");
  const R = (i: number) => `((sg + ${i * c.nsg}u) / ${fc}u) * MM`;
  const C = (i: number) => `((sg + ${i * c.nsg}u) % ${fc}u) * MK`;
  const load = ["let mxn = kn + BK <= kv_len;"];
  for (const i of slots) load.push(`var mk${i}: ${L};`, `var mv${i}: ${L};`);
  load.push("if (mxn && kn < kend) {");
  for (const i of slots) {
    load.push(
      `  if (${guard(i)}) {`,
      `    let at = kv_elem(kn + ${R(i)}, kvh, kv_len, rbase) + ${C(i)};`,
      `    mk${i} = subgroupMatrixLoad<${L}, row_major>(&k0, at, kvstr);`,
      `    mv${i} = subgroupMatrixLoad<${L}, row_major>(&v0, at, kvstr);`,
      "  }",
    );
  }
  load.push("}");
  const store = ["if (mxn) {", "  if (kn < kend) {"];
  for (const i of slots) {
    store.push(
      `    if (${guard(i)}) {`,
      `      let o = ${R(i)} * KSTR + ${C(i)};`,
      `      subgroupMatrixStore<row_major>(&kt_s, kbn + o, mk${i}, ${strideArg("m", "kstr")});`,
      `      subgroupMatrixStore<row_major>(&vt_s, vbn + o, mv${i}, ${strideArg("m", "kstr")});`,
      "    }",
    );
  }
  store.push(
    "  }",
    "} else {",
    "  for (var idx = t; idx < BK * D; idx += WG) {",
    "    let key = kn + idx / D;",
    "    var xk = f16(0.0);",
    "    var xv = f16(0.0);",
    "    if (key < kend) {",
    "      let at = kv_elem(key, kvh, kv_len, rbase) + idx % D;",
    "      xk = k0[at];",
    "      xv = v0[at];",
    "    }",
    "    let o = (idx / D) * KSTR + idx % D;",
    "    kt_s[kbn + o] = xk;",
    "    vt_s[vbn + o] = xv;",
    "  }",
    "}",
  );
  const ind = (xs: string[]) => xs.map((x) => "    " + x).join("\n");
  return { STAGE_LOAD: ind(load), STAGE_STORE: ind(store) };
}
