/**
 * WGSL sources: loads kernel files from `wgsl/` (cached), substitutes `{{NAME}}` placeholders
 * with true compile-time values, and generates the helpers kernels share:
 * - element decoders per storage dtype, from u32 words, in core WGSL only (no `shader-f16`):
 *   f32 by bitcast, f16 by `unpack2x16float`, bf16 by shifting, fp8 e4m3/e5m2 by integer
 *   decode;
 * - the chunked-cache accessor: K and V spread over NCHUNK storage buffers `k0..`, `v0..`
 *   with `fn load_k(block: u32, word: u32) -> u32` (and `load_v`, and `store_k`/`store_v`
 *   when writable, and `load_k4`/`load_v4` for 16-byte loads).
 * Never emits `enable subgroups;` (naga rejects it); subgroup builtins work when granted.
 * @module
 */
import type { StorageDType } from "../core/types.ts";
import type { BindingDecl } from "./kernel.ts";

const sources = new Map<string, Promise<string>>();

/** The URL of a kernel file in `wgsl/`. */
export function wgslUrl(file: string): URL {
  return new URL(`../wgsl/${file}`, import.meta.url);
}

/** The text of `wgsl/<file>`, read once (Deno.readTextFile for file: URLs, fetch otherwise). */
export function loadWgsl(file: string): Promise<string> {
  let p = sources.get(file);
  if (!p) {
    const url = wgslUrl(file);
    p = url.protocol === "file:" ? Deno.readTextFile(url) : fetch(url).then((r) => {
      if (!r.ok) throw new Error(`fetching ${url}: HTTP ${r.status}`);
      return r.text();
    });
    sources.set(file, p);
    p.catch(() => sources.delete(file));
  }
  return p;
}

/** A compile-time value: numbers are written as WGSL u32 literals unless `float`/`int`. */
export type WgslValue = string | number | boolean;

/**
 * Replaces every `{{NAME}}` in `template`. Numbers become `Nu` (u32 literals) unless the
 * placeholder is written `{{NAME:f32}}`, `{{NAME:i32}}` or `{{NAME:raw}}`; booleans become
 * `true`/`false`; strings are inserted verbatim (generated code, type names).
 * @throws Error naming every placeholder without a value.
 */
export function specialize(template: string, values: Record<string, WgslValue>): string {
  const missing = new Set<string>();
  const out = template.replace(
    /\{\{([A-Z0-9_]+)(?::(f32|i32|raw))?\}\}/g,
    (_m, name: string, kind?: string) => {
      if (!(name in values)) {
        missing.add(name);
        return "";
      }
      const v = values[name];
      if (typeof v === "boolean") return v ? "true" : "false";
      if (typeof v === "string") return v;
      if (kind === "raw") return String(v);
      if (kind === "f32") return Number.isInteger(v) ? `${v}.0` : `${v}`;
      if (!Number.isInteger(v)) throw new Error(`placeholder ${name}: ${v} is not an integer`);
      return kind === "i32" ? `${v}i` : `${v}u`;
    },
  );
  if (missing.size) {
    throw new Error(`WGSL placeholders without a value: ${[...missing].join(", ")}`);
  }
  return out;
}

/** Elements of a storage dtype per u32 word. */
export function elementsPerWord(d: StorageDType): 1 | 2 | 4 {
  return d === "float32" ? 1 : d === "fp8_e4m3" || d === "fp8_e5m2" ? 4 : 2;
}

/** A short tag for pipeline keys: f32, f16, bf16, e4m3, e5m2. */
export function dtypeTag(d: StorageDType): string {
  return {
    float32: "f32",
    float16: "f16",
    bfloat16: "bf16",
    fp8_e4m3: "e4m3",
    fp8_e5m2: "e5m2",
  }[d];
}

// NaN and infinity are built from run-time values (`| (b & 0u)`): Dawn's WGSL front end
// refuses NaN/inf constant expressions, even in functions a kernel never calls.
function fp8DecodeFn(name: string, expBits: 4 | 5): string {
  // e4m3fn: bias 7, 3 mantissa bits, no inf, 0x7f/0xff NaN. e5m2: bias 15, 2 bits, IEEE.
  const mant = expBits === 4 ? 3 : 2;
  const bias = expBits === 4 ? 7 : 15;
  const maxE = (1 << expBits) - 1;
  const mmask = (1 << mant) - 1;
  const special = expBits === 4
    ? `if ((b & 0x7fu) == 0x7fu) { return bitcast<f32>(0x7fc00000u | (b & 0u)); }`
    : `if (e == ${maxE}u) { return select(bitcast<f32>(0x7fc00000u | s), bitcast<f32>(s | 0x7f800000u), m == 0u); }`;
  return `fn ${name}(b: u32) -> f32 {
  let s = (b & 0x80u) << 24u;
  let e = (b >> ${mant}u) & ${maxE}u;
  let m = b & ${mmask}u;
  ${special}
  if (e == 0u) {
    let v = f32(m) * ${2 ** (1 - bias - mant)};
    return select(v, -v, s != 0u);
  }
  return bitcast<f32>(s | ((e + ${127 - bias}u) << 23u) | (m << ${23 - mant}u));
}
`;
}

/**
 * Decoders for one storage dtype, named with `prefix` (default `kv`):
 * `const {P}_EPW: u32` (elements per word), `fn {p}_decode(w: u32) -> vec4<f32>` (the word's
 * elements in x, y, z, w order; unused lanes 0), `fn {p}_elem(w: u32, i: u32) -> f32` and
 * `fn {p}_decode16(w: vec4<u32>, i: u32) -> vec4<f32>`: elements 4i..4i+3 of a 16-byte load
 * (i < EPW; 16 bytes hold 4 * EPW elements).
 * Element i of a word sits at bits 8*i (fp8) or 16*i (16-bit), little-endian.
 */
export function decodeHelpers(d: StorageDType, prefix = "kv"): string {
  const P = prefix.toUpperCase();
  const epw = elementsPerWord(d);
  let body: string, extra = "";
  switch (d) {
    case "float32":
      body = "return vec4<f32>(bitcast<f32>(w), 0.0, 0.0, 0.0);";
      break;
    case "float16":
      body = "return vec4<f32>(unpack2x16float(w), 0.0, 0.0);";
      break;
    case "bfloat16":
      body = "return vec4<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u), 0.0, 0.0);";
      break;
    case "fp8_e4m3":
    case "fp8_e5m2": {
      const f = `${prefix}_fp8_byte`;
      extra = fp8DecodeFn(f, d === "fp8_e4m3" ? 4 : 5);
      body = `return vec4<f32>(${f}(w & 0xffu), ${f}((w >> 8u) & 0xffu), ` +
        `${f}((w >> 16u) & 0xffu), ${f}(w >> 24u));`;
      break;
    }
  }
  const d16 = epw === 1 ? "return bitcast<vec4<f32>>(w);" : epw === 2
    ? `if (i == 0u) {
    return vec4<f32>(${prefix}_decode(w.x).xy, ${prefix}_decode(w.y).xy);
  }
  return vec4<f32>(${prefix}_decode(w.z).xy, ${prefix}_decode(w.w).xy);`
    : `return ${prefix}_decode(w[i]);`;
  return `${extra}const ${P}_EPW: u32 = ${epw}u;
fn ${prefix}_decode(w: u32) -> vec4<f32> {
  ${body}
}
fn ${prefix}_elem(w: u32, i: u32) -> f32 {
  return ${prefix}_decode(w)[i];
}
fn ${prefix}_decode16(w: vec4<u32>, i: u32) -> vec4<f32> {
  ${d16}
}
`;
}

/** Options of {@link kvAccessors}. */
export interface KvAccessorOptions {
  /** Buffers per tensor (compile-time). */
  nchunk: number;
  /** Blocks held by each chunk but the last: a number, or a WGSL expression. */
  blocksPerChunk: number | string;
  /** u32 words per block: a number, or a WGSL expression (e.g. `u.block_words`). */
  blockWords: number | string;
  /** Bind group of the buffers (default 0). */
  group?: number;
  /** Binding of k0; k1.. follow, then v0..v{N-1}. */
  firstBinding: number;
  /** "read" (default) or "read_write" (adds store_k/store_v). */
  access?: "read" | "read_write";
  /**
   * Declare the buffers as `array<vec4<u32>>` and also emit `load_k4(block, word)`/`load_v4`
   * (16-byte loads; `word` and the words per block must be multiples of 4).
   */
  vec4?: boolean;
}

function lit(v: number | string): string {
  return typeof v === "number" ? `${v}u` : `(${v})`;
}

/** The binding declarations `k0..k{N-1}, v0..v{N-1}` (in that order) as kernel-entry data. */
export function kvBindingDecls(
  nchunk: number,
  access: "read" | "read_write" = "read",
  vec4 = false,
): BindingDecl[] {
  const type = vec4 ? "array<vec4<u32>>" : "array<u32>";
  const out: BindingDecl[] = [];
  for (const t of ["k", "v"]) {
    for (let c = 0; c < nchunk; c++) out.push({ name: `${t}${c}`, kind: access, type });
  }
  return out;
}

/** The accessors over bindings `k0.., v0..` (see the module doc); no declarations. */
export function kvAccessorFns(o: Omit<KvAccessorOptions, "group" | "firstBinding">): string {
  const n = o.nchunk;
  if (!(Number.isInteger(n) && n >= 1)) throw new Error(`nchunk must be >= 1, got ${n}`);
  const access = o.access ?? "read";
  const bpc = lit(o.blocksPerChunk), bw = lit(o.blockWords);
  let s = "";
  const index = n === 1
    ? (w: string) => `let i = block * ${bw} + ${w};`
    : (w: string) => `let c = block / ${bpc};\n  let i = (block - c * ${bpc}) * ${bw} + ${w};`;
  const dispatch = (t: string, op: (buf: string) => string) => {
    if (n === 1) return `  ${op(`${t}0`)}\n`;
    let sw = "  switch c {\n";
    for (let c = 0; c < n - 1; c++) sw += `    case ${c}u: { ${op(`${t}${c}`)} }\n`;
    sw += `    default: { ${op(`${t}${n - 1}`)} }\n  }\n`;
    return sw;
  };
  for (const t of ["k", "v"]) {
    s += `fn load_${t}(block: u32, word: u32) -> u32 {\n  ${index("word")}\n${
      dispatch(t, (b) => o.vec4 ? `return ${b}[i >> 2u][i & 3u];` : `return ${b}[i];`)
    }}\n`;
    if (o.vec4) {
      s += `fn load_${t}4(block: u32, word: u32) -> vec4<u32> {\n  ${index("word")}\n${
        dispatch(t, (b) => `return ${b}[i >> 2u];`)
      }}\n`;
    }
    if (access === "read_write") {
      s += `fn store_${t}(block: u32, word: u32, value: u32) {\n  ${index("word")}\n${
        dispatch(t, (b) => o.vec4 ? `${b}[i >> 2u][i & 3u] = value;` : `${b}[i] = value;`)
      }}\n`;
    }
  }
  return s;
}

/** The bindings `k0.., v0..` declared at `firstBinding` and their accessors (see the module doc). */
export function kvAccessors(o: KvAccessorOptions): string {
  const group = o.group ?? 0;
  const decls = kvBindingDecls(o.nchunk, o.access ?? "read", o.vec4 ?? false);
  return decls.map((d, i) =>
    `@group(${group}) @binding(${
      o.firstBinding + i
    }) var<storage, ${d.kind}> ${d.name}: ${d.type};\n`
  ).join("") + kvAccessorFns(o);
}

/**
 * `tanh_rel`: tanh with a small relative error near 0, for the soft cap. `cap * tanh(s / cap)`
 * multiplies tanh's error at s / cap by the cap, and WGSL's `tanh` (as lavapipe computes it, and
 * as the spec lets any device) is accurate there in absolute terms only: at a cap of 1e4 the
 * logits were off by 6e-4 against float64, 4e-3 at 1e5 (a numerics audit). Below |x| 0.125 the
 * odd series to x^7 (its next term 62 x^9 / 2835 is under 1.3e-9 of x there) replaces it. Every
 * kernel with a soft cap includes it (placeholder `TANH_REL`).
 */
export const TANH_REL_FN = `fn tanh_rel(x: f32) -> f32 {
  let x2 = x * x;
  let series = x * (1.0 + x2 * (-0.33333334 + x2 * (0.13333334 + x2 * -0.053968254)));
  return select(tanh(x), series, abs(x) < 0.125);
}`;

/**
 * `cap * tanh_rel(clamp(x / div, -15, 15))` (the soft cap, {@link TANH_REL_FN}; `div` "" when x
 * is already divided), except
 * that a NaN x (from a NaN stored in the cache) stays NaN, as in float64: clamp() would make it
 * +-15. The NaN test is on the bits, which no compiler folds away.
 */
export function nanKeepingCap(x: string, cap: string, div: string): string {
  const arg = div ? `${x} / ${div}` : x;
  return `select(${cap} * tanh_rel(clamp(${arg}, -15.0, 15.0)), ${x}, ` +
    `(bitcast<u32>(${x}) & 0x7fffffffu) > 0x7f800000u)`;
}
