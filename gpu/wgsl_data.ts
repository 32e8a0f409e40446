/**
 * WGSL accessors for data tensors (query / key / value / output) bound in their request
 * dtype, so the host uploads the request's bytes as they came and reads the output back in
 * the dtype it answers with:
 * - {@link dataLoads}: `fn NAME_bits(i) -> u32` (element i's f32 bits) over `array<u32>`, or
 *   `fn NAME_4(i4) -> vec4<f32>` (elements 4 i4 .. 4 i4 + 3) over `array<vec4<u32>>` (f32) or
 *   `array<vec2<u32>>` (f16, bf16);
 * - {@link dataStores}: `fn NAME_put4(i4, v: vec4<f32>)`, rounding to nearest even in integer
 *   arithmetic (wgsl/round.wgsl, byte-exact with core/dtype.ts).
 * All of it is core WGSL (no `shader-f16`).
 * @module
 */
import type { DType } from "../core/types.ts";

/** A data binding: its WGSL type and its accessor functions. */
export interface DataAccess {
  type: string;
  code: string;
}

/** Loads from a data tensor bound as `name`. */
export function dataLoads(name: string, dtype: DType, width: 1 | 4): DataAccess {
  if (width === 1) {
    const body = dtype === "float32"
      ? `return ${name}[i];`
      : dtype === "float16"
      ? `return bitcast<u32>(unpack2x16float(${name}[i >> 1u])[i & 1u]);`
      : `return ((${name}[i >> 1u] >> (16u * (i & 1u))) & 0xffffu) << 16u;`;
    return { type: "array<u32>", code: `fn ${name}_bits(i: u32) -> u32 {\n  ${body}\n}\n` };
  }
  if (dtype === "float32") {
    return {
      type: "array<vec4<u32>>",
      code: `fn ${name}_4(i4: u32) -> vec4<f32> {\n  return bitcast<vec4<f32>>(${name}[i4]);\n}\n`,
    };
  }
  const body = dtype === "float16"
    ? "return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));"
    : "return vec4<f32>(bitcast<f32>(w.x << 16u), bitcast<f32>(w.x & 0xffff0000u), " +
      "bitcast<f32>(w.y << 16u), bitcast<f32>(w.y & 0xffff0000u));";
  return {
    type: "array<vec2<u32>>",
    code: `fn ${name}_4(i4: u32) -> vec4<f32> {\n  let w = ${name}[i4];\n  ${body}\n}\n`,
  };
}

/** Stores of 4 elements at a time into a data tensor bound as `name` (needs round.wgsl). */
export function dataStores(name: string, dtype: DType): DataAccess {
  if (dtype === "float32") {
    return {
      type: "array<vec4<u32>>",
      code: `fn ${name}_put4(i4: u32, v: vec4<f32>) {\n  ${name}[i4] = bitcast<vec4<u32>>(v);\n}\n`,
    };
  }
  const f = dtype === "float16" ? "f16_bits" : "bf16_bits";
  return {
    type: "array<vec2<u32>>",
    code: `fn ${name}_put4(i4: u32, v: vec4<f32>) {
  let b = bitcast<vec4<u32>>(v);
  ${name}[i4] = vec2<u32>(${f}(b.x) | (${f}(b.y) << 16u), ${f}(b.z) | (${f}(b.w) << 16u));
}
`,
  };
}

/** The NaN pattern of a dtype, repeated over one u32 word (what outputs are poisoned with). */
export function nanWord(dtype: DType): number {
  return dtype === "float32" ? 0x7fc00000 : dtype === "float16" ? 0x7e007e00 : 0x7fc07fc0;
}
