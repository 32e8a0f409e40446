/**
 * The finiteness check of a call's query/key/value on the device, for batches too large to
 * scan on the host cheaply (core/data.ts {@link checksFiniteOnDevice}): the host test of
 * core/data.ts `firstNonFinite` (a word's exponent fields masked, plus one unit of their lowest
 * bit, carry into the field's sign bit exactly when a field is all ones) runs over every
 * whole 32-bit word of the three tensors, and the first bad word i of each is kept as
 * `0xffffffff - i` with `atomicMax` in a flags buffer that the launch zeroes with a command
 * (`clearBuffer`: no upload of its initial value). The cache write that follows binds the
 * flags and writes nothing unless every one is clear (gpu/cache_write.ts `gated`), so a call
 * with a NaN or infinity leaves the cache as it was. (Until v0.9 a gate kernel wrote an indirect dispatch's
 * arguments instead; on the H200 a Dawn indirect dispatch cost more host time than the rest of
 * a decode call's recording: bench/NOTES.md v0.9.) The flags come back with the output;
 * {@link finiteIssues} turns a set flag into the validator's 422 issue (the tensor, the first
 * bad element and its value). Elements that do not fill a word (the odd last
 * element of a half-precision tensor) are checked on the host by the validator.
 * @module
 */
import { finiteScanBits, firstNonFiniteIn, nonFiniteMessage, wordsOf } from "../core/data.ts";
import type { DataArray, DType, GpuContext } from "../core/types.ts";
import type { Issue } from "../core/errors.ts";
import { dispatchSize } from "./batch_buffers.ts";
import { type CompiledKernel, getKernel, type KernelDef, packUniforms } from "./kernel.ts";
import type { Section, TableBuilder } from "./plan_table.ts";

const WG = 256;

/** The flag of a tensor without a bad word (a flag f names word 0xffffffff - f). */
export const FLAG_CLEAR = 0;

/** The word index a set flag names. */
const flaggedWord = (flag: number) => 0xffffffff - flag;

/** The tensors checked, in flag order. */
export const CHECKED = ["query", "key", "value"] as const;

/** Bytes of the flags buffer: one word per tensor, padded. */
export const FLAGS_BYTES = 16;

/** The check kernel, as data. */
export const FINITE_CHECK: KernelDef<{ wg: number }> = {
  name: "finite_check",
  uniforms: [
    ["n_q", "u32"],
    ["n_k", "u32"],
    ["n_v", "u32"],
    ["mask", "u32"],
    ["carry", "u32"],
    ["sign", "u32"],
    ["nwg_x", "u32"],
  ],
  bindings: () => [
    { name: "P", kind: "uniform" },
    { name: "q", kind: "read", type: "array<u32>" },
    { name: "k", kind: "read", type: "array<u32>" },
    { name: "v", kind: "read", type: "array<u32>" },
    { name: "flags", kind: "read_write", type: "array<atomic<u32>, 4>" },
  ],
  source: (c) =>
    `fn bad(w: u32) -> bool {
  return (((w & P.mask) + P.carry) & P.sign) != 0u;
}

@compute @workgroup_size(${c.wg})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wg.x + wg.y * P.nwg_x) * ${c.wg}u + lid;
  if (i < P.n_q && bad(q[i])) {
    atomicMax(&flags[0], 0xffffffffu - i);
  }
  if (i < P.n_k && bad(k[i])) {
    atomicMax(&flags[1], 0xffffffffu - i);
  }
  if (i < P.n_v && bad(v[i])) {
    atomicMax(&flags[2], 0xffffffffu - i);
  }
}
`,
};

/** A planned check: its kernel, Params section and grid. */
export interface FiniteCheckPlan {
  check: CompiledKernel;
  checkParams: Section;
  grid: [number, number];
}

/** Whole words of each checked tensor of a batch with `elements` per tensor. */
export function checkedWords(dtype: DType, elements: readonly number[]): number[] {
  return elements.map((n) => wordsOf(dtype, n));
}

/**
 * Plans the check of tensors of `elements` (query, key, value; 0 for an absent one), adding
 * its Params to `table`.
 */
export async function planFiniteCheck(
  ctx: GpuContext,
  dtype: DType,
  elements: readonly [number, number, number],
  table: TableBuilder,
): Promise<FiniteCheckPlan> {
  const [nq, nk, nv] = checkedWords(dtype, elements);
  const grid = dispatchSize(ctx, Math.ceil(Math.max(nq, nk, nv, 1) / WG));
  const { mask, carry, sign } = finiteScanBits(dtype);
  const checkParams = table.add(packUniforms(FINITE_CHECK, {
    n_q: nq,
    n_k: nk,
    n_v: nv,
    mask,
    carry,
    sign,
    nwg_x: grid[0],
  }));
  const check = await getKernel(ctx, FINITE_CHECK, { wg: WG });
  return { check, checkParams, grid };
}

/**
 * The validator's issues for the flags read back (none when all are clear): each tensor with a
 * bad word, named with its first non-finite element and that element's value.
 */
export function finiteIssues(
  flags: Uint8Array,
  tensors: Record<(typeof CHECKED)[number], DataArray | null>,
): Issue[] {
  const words = new Uint32Array(flags.buffer, flags.byteOffset, 3);
  const issues: Issue[] = [];
  CHECKED.forEach((name, t) => {
    const a = tensors[name];
    if (words[t] === FLAG_CLEAR || !a) return;
    const { per } = finiteScanBits(a.dtype);
    const w = flaggedWord(words[t]);
    const i = firstNonFiniteIn(a, w * per, Math.min(a.length, (w + 1) * per));
    if (i < 0) throw new Error(`finite_check flagged ${name} word ${w}, which is finite`);
    issues.push({ path: [name, i], message: nonFiniteMessage(a, i) });
  });
  return issues;
}
