/**
 * The tensor-core kernel's bf16 / f32 -> f16 staging (gpu/flash_mma_staging.ts `kv16`, `q16`)
 * keeps an infinity an infinity and a NaN a NaN: finite values beyond f16's range clamp to
 * +-65504, but a bare clamp() made +-Infinity +-65504 (finite) and left a NaN
 * implementation-defined (the soft cap's clamp made one +-15 on the GPU). Checked three ways:
 * - the generated kernel source, every shape: no clamp outside a select that a bit test picks;
 * - the generated decoders evaluated on the CPU by a small model of the WGSL they use, where
 *   what WGSL leaves indeterminate (clamp of a NaN, an f32 -> f16 conversion outside f16's
 *   finite range) is poison that must not reach a result; the old decoder fails it;
 * - the decoders run on the Dawn subgroup-matrix device the kernel runs on, bit for bit
 *   (skipped with the reason elsewhere: Deno's naga cannot compile `bitcast<vec2<f16>>`, and
 *   Dawn finds no adapter on the dev VM's lavapipe).
 * And the generic softmax (non-fast shapes) keeps a NaN score's p NaN instead of masking it to 0
 * (source text). The whole kernel over a cache holding NaN or an infinity: nan_read_slot_test.ts.
 * @module
 */
import assert from "node:assert/strict";
import { flashMmaSource } from "../../gpu/flash_mma_codegen.ts";
import { fullShape, MMA_VARIANTS } from "../../gpu/flash_mma_shape.ts";
import { stagingDecoders } from "../../gpu/flash_mma_staging.ts";
import type { StorageDType } from "../../core/types.ts";
import { dispatchIntoBuffer } from "../support/dispatch.ts";
import { H200_F16_TARGET, mmaTestDevice } from "../support/mma_case.ts";

/** The select every converting decoder returns through (gpu/flash_mma_staging.ts). */
const KEEP = "return select(x, nf, (b & sp) == sp);";

/** The source without comment lines. */
const code = (s: string) => s.split("\n").filter((x) => !x.trimStart().startsWith("//")).join("\n");

/** `fn name`'s body in `src` (up to the closing brace at column 0). */
function fnBody(src: string, name: string): string | null {
  const at = src.indexOf(`fn ${name}(`);
  if (at < 0) return null;
  return src.slice(at, src.indexOf("\n}", at));
}

Deno.test("flash_mma staging: no clamp reaches a staged NaN or infinity (generated source)", async () => {
  // Every shape over the dtypes it takes: bf16 caches (word stores, early and late, generic and
  // fast softmax), f16 caches with bf16 data (direct and matrix staging copy f16 bits), soft cap
  // on (its clamps are the other clamps of the kernel: nanKeepingCap's form).
  let checked = 0;
  for (const [name, shape] of Object.entries(MMA_VARIANTS)) {
    const sh = fullShape(shape);
    const kvs: StorageDType[] = sh.direct || sh.mstage ? ["float16"] : ["bfloat16", "float16"];
    for (const kv of kvs) {
      for (const enc of sh.direct || sh.mstage ? [false] : [false, true]) {
        const t = { ...H200_F16_TARGET, kv, dtype: "bfloat16", enc, softcap: true };
        const src = code(await flashMmaSource({ ...t, ...sh } as never));
        const label = `${name}, ${kv} cache${enc ? " (encoder K/V)" : ""}`;
        const decoders = ["kv16", "q16"].map((f) => fnBody(src, f));
        for (const [i, body] of decoders.entries()) {
          assert.ok(body, `${label}: ${["kv16", "q16"][i]} is generated`);
          if (!body.includes("clamp(")) continue;
          assert.match(body, /let x = vec4<f16>\(clamp\(/, `${label}: the clamp is x`);
          assert.ok(body.trimEnd().endsWith(KEEP), `${label}: x is returned only through ${KEEP}`);
          assert.equal(body.split("clamp(").length, 2, `${label}: one clamp`);
        }
        // Any other clamp is the soft cap's, behind its own NaN select.
        for (const line of src.split("\n").filter((x) => x.includes("clamp("))) {
          if (decoders.some((b) => b!.includes(line))) continue;
          assert.match(line, /select\(.*tanh_rel\(clamp\(.*\), *\w+, /, `${label}: ${line.trim()}`);
          checked++;
        }
      }
    }
  }
  assert.ok(checked > 0, "the soft cap's clamps were seen");
  // bf16 data, f32 K/V (the f32 decoder: no shape plans it today, as f32 data keeps the exact
  // path, but it stays right).
  for (const dtype of ["bfloat16", "float16"] as const) {
    for (const kv of ["bfloat16", "float32"] as const) {
      const src = stagingDecoders(kv, dtype);
      const kv16 = fnBody(src, "kv16")!;
      assert.ok(kv16.trimEnd().endsWith(KEEP), `${kv} kv16 keeps specials`);
      const q16 = fnBody(src, "q16")!;
      assert.ok(!q16.includes("clamp(") || q16.trimEnd().endsWith(KEEP), `${dtype} q16`);
    }
  }
});

Deno.test("flash_mma softmax: a NaN score keeps p = NaN (generated source, generic softmax)", async () => {
  // The generic softmax selects p = 0 for masked keys; a `x > MASK` test is false for a NaN
  // score as well and dropped it (the H100 answered finite where float64 gives NaN).
  let seen = 0;
  for (const [name, shape] of Object.entries(MMA_VARIANTS)) {
    const sh = fullShape(shape);
    if (sh.fast) continue;
    const t = { ...H200_F16_TARGET, kv: "float16", dtype: "float16" };
    const src = code(await flashMmaSource({ ...t, ...sh } as never));
    const ps = src.split("\n").filter((x) => /let p\d+ = f16\(/.test(x));
    assert.ok(ps.length > 0, `${name}: p stores`);
    for (const line of ps) {
      assert.match(line, /select\(exp\(x\d+ - m\[\d+\]\), 0\.0, x\d+ <= MASK\)/, name);
    }
    seen++;
  }
  assert.ok(seen > 0, "generic-softmax shapes exist");
});

// Values as the cache holds them, and the f16 bits each must stage as ("nan": any f16 NaN, of
// the value's sign).
type Want = number | "nan" | "-nan";
const BF16_CASES: [number, Want][] = [
  [0x7fc0, "nan"], // the usual quiet NaN
  [0xffc0, "-nan"],
  [0x7f81, "nan"], // a signalling NaN, lowest mantissa bit only
  [0xff81, "-nan"],
  [0x7f80, 0x7c00], // +Infinity
  [0xff80, 0xfc00], // -Infinity
  [0x7f7f, 0x7bff], // bf16's largest finite: clamped to 65504
  [0xff7f, 0xfbff],
  [0x4780, 0x7bff], // 65536: beyond f16, clamped
  [0xc780, 0xfbff],
  [0x477f, 0x7bf8], // 65280: within f16, exact
  [0x3f80, 0x3c00], // 1
  [0xc010, 0xc080], // -2.25
  [0x0000, 0x0000],
  [0x8000, 0x8000],
  [0x4049, 0x4248], // 3.140625
];
const F32_CASES: [number, Want][] = [
  [0x7fc00000, "nan"],
  [0xffc00000, "-nan"],
  [0x7f800001, "nan"], // mantissa only below f16's 10 bits: still NaN
  [0x7fa00000, "nan"], // a signalling NaN
  [0x7f800000, 0x7c00],
  [0xff800000, 0xfc00],
  [0x477fe000, 0x7bff], // 65504
  [0x477ff000, 0x7bff], // 65520: rounds to infinity unclamped; clamped
  [0xc77ff000, 0xfbff],
  [0x7149f2ca, 0x7bff], // 1e30
  [0x7f7fffff, 0x7bff], // f32's largest finite
  [0xff7fffff, 0xfbff],
  [0x3fc00000, 0x3e00], // 1.5
  [0xc0100000, 0xc080], // -2.25
  [0x00000000, 0x0000],
  [0x80000000, 0x8000],
];

/** Does f16 `bits` match `want`? */
function matches(bits: number, want: Want): boolean {
  const nan = (bits & 0x7c00) === 0x7c00 && (bits & 0x3ff) !== 0;
  if (want === "nan") return nan && (bits & 0x8000) === 0;
  if (want === "-nan") return nan && (bits & 0x8000) !== 0;
  return bits === want;
}

/** 16-byte words holding `vals` (bf16: two a u32; f32: one), padded with zeros. */
function words(vals: number[], bf16: boolean): Uint32Array {
  const per = bf16 ? 8 : 4, n = Math.ceil(vals.length / per) * per;
  const out = new Uint32Array(n / (bf16 ? 2 : 1));
  for (let i = 0; i < n; i++) {
    const v = vals[i] ?? 0;
    if (bf16) out[i >> 1] |= v << (16 * (i & 1));
    else out[i] = v;
  }
  return out;
}

// ---- A model of the WGSL the decoders use (let, return, vecN constructors and conversions,
// swizzles, select, clamp, bitcast, & | << >> == != < >), values as bits; null marks a lane
// WGSL leaves indeterminate.

type Scalar = "u32" | "f32" | "f16" | "bool";
interface Val {
  t: Scalar;
  /** Lanes (a scalar has one); u32 / f32 / f16 as their bits, bool as 0 / 1; null: indeterminate. */
  v: (number | null)[];
  vec: boolean;
}
interface Ty {
  t: Scalar;
  n: number;
}

const f32buf = new Float32Array(1), u32buf = new Uint32Array(f32buf.buffer);
const f16buf = new Float16Array(1), u16buf = new Uint16Array(f16buf.buffer);
const f32Of = (bits: number) => (u32buf[0] = bits, f32buf[0]);
const bitsOf32 = (x: number) => (f32buf[0] = x, u32buf[0]);
const lanes = (x: Val, n: number) => (x.vec ? x.v : Array(n).fill(x.v[0]));

function tokenize(src: string): string[] {
  const re =
    /\s*(0x[0-9a-fA-F]+u?|\d+\.\d*(?:e[+-]?\d+)?f?|\d+u?|[A-Za-z_]\w*|<<|>>|==|!=|<=|>=|[-&|^<>(),.;=])/y;
  const out: string[] = [];
  let end = 0;
  for (let m; (m = re.exec(src));) [out[out.length], end] = [m[1], re.lastIndex];
  assert.equal(src.slice(end).trim(), "", `tokenized all of: ${src}`);
  return out;
}

/** Runs a decoder body (`let` statements, then `return`) with its parameters bound. */
function evalWgsl(body: string, env: Map<string, Val>): Val {
  const tk = tokenize(body);
  let p = 0;
  const peek = () => tk[p], next = () => tk[p++];
  const expect = (x: string) => assert.equal(next(), x, `at token ${p} of ${body}`);
  const closeAngle = () => {
    if (tk[p] === ">>") tk[p] = ">"; // `vec2<f16>>`: close one of two
    else expect(">");
  };
  const type = (): Ty => {
    const name = next();
    if (/^vec[234]$/.test(name)) {
      expect("<");
      const t = type();
      closeAngle();
      return { t: t.t, n: Number(name[3]) };
    }
    assert.ok(["u32", "f32", "f16", "bool"].includes(name), `type ${name}`);
    return { t: name as Scalar, n: 1 };
  };
  const lit = (x: string): Val => {
    if (/^(0x[0-9a-fA-F]+|\d+)u$/.test(x)) {
      return { t: "u32", v: [Number(x.slice(0, -1)) >>> 0], vec: false };
    }
    assert.match(x, /^\d+\.\d*/, `literal ${x}`);
    return { t: "f32", v: [bitsOf32(parseFloat(x))], vec: false };
  };
  const primary = (): Val => {
    const x = next();
    if (x === "(") {
      const e = expr(0);
      expect(")");
      return e;
    }
    if (x === "-") {
      const e = primary();
      assert.equal(e.t, "f32", "negation of a float");
      return { ...e, v: e.v.map((b) => (b === null ? null : (b ^ 0x80000000) >>> 0)) };
    }
    if (/^[\d]/.test(x)) return lit(x);
    if (/^vec[234]$/.test(x)) {
      p--;
      const ty = type();
      return construct(ty, args());
    }
    if (x === "bitcast") {
      expect("<");
      const ty = type();
      closeAngle();
      return bitcast(ty, args()[0]);
    }
    if (x === "select") {
      const [f, t, c] = args();
      const n = Math.max(f.v.length, t.v.length, c.v.length);
      const [F, T, C] = [lanes(f, n), lanes(t, n), lanes(c, n)];
      return { t: f.t, v: C.map((b, k) => (b === null ? null : b ? T[k] : F[k])), vec: f.vec };
    }
    if (x === "clamp") {
      const [e, lo, hi] = args();
      assert.equal(e.t, "f32", "clamp of f32");
      const n = e.v.length, [L, H] = [lanes(lo, n), lanes(hi, n)];
      // clamp(NaN, lo, hi) is implementation-defined; an infinity clamps like any value.
      const v = e.v.map((b, k) => {
        if (b === null || L[k] === null || H[k] === null || Number.isNaN(f32Of(b))) return null;
        return bitsOf32(Math.min(Math.max(f32Of(b), f32Of(L[k]!)), f32Of(H[k]!)));
      });
      return { ...e, v };
    }
    const bound = env.get(x);
    assert.ok(bound, `unknown name ${x}`);
    return bound;
  };
  const args = (): Val[] => {
    expect("(");
    const out: Val[] = [];
    while (peek() !== ")") {
      out.push(expr(0));
      if (peek() === ",") next();
    }
    expect(")");
    return out;
  };
  const postfix = (): Val => {
    let e = primary();
    while (peek() === ".") {
      next();
      const sw = next();
      const v = [...sw].map((c) => e.v["xyzw".indexOf(c)]);
      assert.ok(e.vec && v.every((x) => x !== undefined), `swizzle .${sw}`);
      e = { t: e.t, v, vec: sw.length > 1 };
    }
    return e;
  };
  const PREC: Record<string, number> = {
    "==": 1,
    "!=": 1,
    "<": 1,
    ">": 1,
    "|": 2,
    "^": 3,
    "&": 4,
    "<<": 5,
    ">>": 5,
  };
  const binary = (op: string, a: Val, b: Val): Val => {
    const n = Math.max(a.v.length, b.v.length), [A, B] = [lanes(a, n), lanes(b, n)];
    assert.ok(a.t === "u32" && b.t === "u32", `${op} on ${a.t}, ${b.t}`);
    const f: Record<string, (x: number, y: number) => number> = {
      "==": (x, y) => +(x === y),
      "!=": (x, y) => +(x !== y),
      "<": (x, y) => +(x < y),
      ">": (x, y) => +(x > y),
      "|": (x, y) => (x | y) >>> 0,
      "^": (x, y) => (x ^ y) >>> 0,
      "&": (x, y) => (x & y) >>> 0,
      "<<": (x, y) => (x << (y & 31)) >>> 0,
      ">>": (x, y) => x >>> (y & 31),
    };
    const v = A.map((x, k) => (x === null || B[k] === null ? null : f[op](x, B[k]!)));
    return { t: PREC[op] === 1 ? "bool" : "u32", v, vec: a.vec || b.vec };
  };
  const expr = (min: number): Val => {
    let e = postfix();
    while (PREC[peek()] !== undefined && PREC[peek()] > min) {
      const op = next();
      e = binary(op, e, expr(PREC[op]));
    }
    return e;
  };
  for (;;) {
    const kw = next();
    if (kw === "return") return expr(0);
    assert.equal(kw, "let", `statement ${kw}`);
    const name = next();
    expect("=");
    env.set(name, expr(0));
    expect(";");
  }
}

/** `vecN<T>(args)`: a splat, a conversion (f32 -> f16 outside f16's range: indeterminate), or lanes. */
function construct(ty: Ty, xs: Val[]): Val {
  if (xs.length === 1 && xs[0].t !== ty.t) {
    assert.ok(xs[0].t === "f32" && ty.t === "f16", `conversion ${xs[0].t} -> ${ty.t}`);
    const v = xs[0].v.map((b) => {
      if (b === null) return null;
      const x = f32Of(b);
      if (!(Math.abs(x) <= 65504)) return null; // outside f16's finite range, or NaN
      f16buf[0] = x;
      return u16buf[0];
    });
    return { t: "f16", v, vec: true };
  }
  const v = xs.length === 1 && !xs[0].vec ? Array(ty.n).fill(xs[0].v[0]) : xs.flatMap((x) => x.v);
  assert.ok(xs.every((x) => x.t === ty.t) && v.length === ty.n, `vec${ty.n}<${ty.t}> of its lanes`);
  return { t: ty.t, v, vec: ty.n > 1 };
}

/** `bitcast<T>(x)` between u32, f32 and f16 lanes of the same total width (little-endian). */
function bitcast(ty: Ty, x: Val): Val {
  const width = (t: Scalar) => (t === "f16" ? 16 : 32);
  assert.equal(width(ty.t) * ty.n, width(x.t) * x.v.length, "bitcast keeps the width");
  if (width(ty.t) === width(x.t)) return { t: ty.t, v: x.v, vec: ty.n > 1 };
  assert.equal(ty.t, "f16", "bitcast to f16 lanes");
  const v = x.v.flatMap((b) => (b === null ? [null, null] : [b & 0xffff, b >>> 16]));
  return { t: "f16", v, vec: true };
}

/** The body of `fn name` in `src`, between its braces. */
function bodyOf(src: string, name: string): string {
  const f = fnBody(src, name)!;
  return f.slice(f.indexOf("{") + 1);
}

/** Evaluates decoder `body` on 16-byte word `w`, half `i`: the four f16 lanes' bits or null. */
function decode(body: string, w: Uint32Array, i: number): (number | null)[] {
  const env = new Map<string, Val>([
    ["w", { t: "u32", v: [...w], vec: true }],
    ["i", { t: "u32", v: [i], vec: false }],
  ]);
  const r = evalWgsl(body, env);
  assert.ok(r.t === "f16" && r.v.length === 4, "a vec4<f16>");
  return r.v;
}

/** Runs `body` over `cases` on the CPU; the first mismatch, or null. */
function modelMismatch(
  body: string,
  cases: readonly [number, Want][],
  bf16: boolean,
): string | null {
  const ws = words(cases.map(([v]) => v), bf16), per = bf16 ? 2 : 1;
  const hex = (x: number) => `0x${x.toString(16)}`;
  for (let j = 0; j < ws.length / 4; j++) {
    for (let i = 0; i < per; i++) {
      const got = decode(body, ws.subarray(4 * j, 4 * j + 4), i);
      for (const [l, bits] of got.entries()) {
        const c = cases[(j * per + i) * 4 + l];
        if (!c) continue;
        const [v, want] = c;
        if (bits === null) return `${hex(v)} stages as an indeterminate value`;
        if (!matches(bits, want)) return `${hex(v)} stages as ${hex(bits)}, want ${want}`;
      }
    }
  }
  return null;
}

/** The decoder before the fix (a bare clamp), to show the model catches it. */
const OLD_BF16 = `let a = select(w.zw, w.xy, i == 0u);
  let x = vec4<f32>(bitcast<f32>(a.x << 16u), bitcast<f32>(a.x & 0xffff0000u),
                    bitcast<f32>(a.y << 16u), bitcast<f32>(a.y & 0xffff0000u));
  return vec4<f16>(clamp(x, vec4<f32>(-65504.0), vec4<f32>(65504.0)));`;

Deno.test("flash_mma staging: the generated decoders keep NaN and infinities (CPU model)", () => {
  for (const dtype of ["bfloat16", "float16"] as const) {
    const bf = stagingDecoders("bfloat16", dtype);
    assert.equal(modelMismatch(bodyOf(bf, "kv16"), BF16_CASES, true), null, `bf16 kv16 (${dtype})`);
    const f32 = stagingDecoders("float32", dtype);
    assert.equal(modelMismatch(bodyOf(f32, "kv16"), F32_CASES, false), null, `f32 kv16 (${dtype})`);
  }
  const q = bodyOf(stagingDecoders("float16", "bfloat16"), "q16");
  assert.equal(modelMismatch(q, BF16_CASES, true), null, "bf16 q16");
  // An f16 cache's words are its bits (NaN, infinities and all).
  const f16 = bodyOf(stagingDecoders("float16", "float16"), "kv16");
  const F16_CASES: [number, Want][] = [
    0x7e00,
    0xfe00,
    0x7c01,
    0x7c00,
    0xfc00,
    0x7bff,
    0x3c00,
    0x8000,
  ]
    .map((b) => [b, (b & 0x7c00) === 0x7c00 && (b & 0x3ff) ? (b & 0x8000 ? "-nan" : "nan") : b]);
  assert.equal(modelMismatch(f16, F16_CASES, true), null, "f16 kv16");
  // The bare clamp: +-Infinity staged as +-65504, a NaN as whatever clamp() gives.
  const old = modelMismatch(OLD_BF16, BF16_CASES, true);
  assert.match(String(old), /^0x7fc0 stages as an indeterminate value$/, "the old decoder fails");
  const oldInf = modelMismatch(OLD_BF16, BF16_CASES.filter(([, w]) => typeof w === "number"), true);
  assert.equal(
    oldInf,
    "0x7f80 stages as 0x7bff, want 31744",
    "the old decoder made +Infinity finite",
  );
});

/**
 * Runs `fn` (kv16 or q16) of `decoders` on `input`'s 16-byte words (elements 4i..4i+3 for
 * i < `per`) on `dev`; the f16 bits of each element, in order.
 */
async function stage(
  dev: GPUDevice,
  decoders: string,
  fn: "kv16" | "q16",
  input: Uint32Array,
  per: number,
): Promise<Uint16Array> {
  const n4 = input.length / 4;
  const module = dev.createShaderModule({
    code: `enable f16;
@group(0) @binding(0) var<storage, read_write> o: array<f16>;
var<private> W: array<vec4<u32>, ${n4}> = array<vec4<u32>, ${n4}>(${
      Array.from({ length: n4 }, (_, j) =>
        `vec4<u32>(${
          [...input.subarray(4 * j, 4 * j + 4)].map((x) => `${x >>> 0}u`).join(", ")
        })`)
        .join(", ")
    });
${decoders}
@compute @workgroup_size(1)
fn main() {
  for (var j = 0u; j < ${n4}u; j++) {
    for (var i = 0u; i < ${per}u; i++) {
      let v = ${fn}(W[j], i);
      let at = (j * ${per}u + i) * 4u;
      o[at] = v.x;
      o[at + 1u] = v.y;
      o[at + 2u] = v.z;
      o[at + 3u] = v.w;
    }
  }
}`,
  });
  const info = await module.getCompilationInfo();
  const errors = info.messages.filter((m) => m.type === "error");
  assert.equal(errors.length, 0, errors.map((m) => m.message).join("\n"));
  const pipeline = await dev.createComputePipelineAsync({
    layout: "auto",
    compute: { module, entryPoint: "main" },
  });
  return new Uint16Array(await dispatchIntoBuffer(dev, pipeline, n4 * per * 8));
}

/** Checks kv16 (bf16 and f32 caches) and q16 (bf16 data) on `dev`. */
async function checkDecoders(dev: GPUDevice, where: string): Promise<void> {
  const runs = [
    ["bf16 cache (kv16)", "bfloat16", "kv16", BF16_CASES],
    ["bf16 query (q16)", "bfloat16", "q16", BF16_CASES],
    ["f32 cache (kv16)", "float32", "kv16", F32_CASES],
  ] as const;
  for (const [what, kv, fn, cases] of runs) {
    const bf16 = kv === "bfloat16";
    const got = await stage(
      dev,
      stagingDecoders(kv, "bfloat16"),
      fn,
      words(cases.map(([v]) => v), bf16),
      bf16 ? 2 : 1,
    );
    for (const [i, [v, want]] of cases.entries()) {
      const hex = (x: number) => `0x${x.toString(16)}`;
      const w = typeof want === "number" ? hex(want) : want;
      assert.ok(
        matches(got[i], want),
        `${where}, ${what}: ${hex(v)} staged as ${hex(got[i])}, want ${w}`,
      );
    }
  }
}

const MMA = await mmaTestDevice("flash_mma staging decoders on the Dawn device");

Deno.test({
  name: "flash_mma staging: bf16/f32 -> f16 keeps NaN and infinities, clamps finite values (Dawn)",
  ignore: MMA === null,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: () => checkDecoders(MMA!.device, "Dawn subgroup-matrix device"),
});
