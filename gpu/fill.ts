/**
 * The fill kernel: writes one u32 pattern over a buffer's first `n_words` words. Plans put it
 * first in a call to poison the output and LSE buffers (pooled buffers hold an earlier
 * call's data), so an element a kernel fails to write reads NaN, never a stale answer.
 * @module
 */
import { dispatchSize } from "./batch_buffers.ts";
import type { GpuContext } from "../core/types.ts";
import { getKernel, type KernelDef, packUniforms } from "./kernel.ts";
import type { Section, TableBuilder } from "./plan_table.ts";
import type { CompiledKernel } from "./kernel.ts";

const WG = 256;

/** The fill kernel, as data. */
export const FILL: KernelDef<{ wg: number }> = {
  name: "fill",
  uniforms: [["n_words", "u32"], ["pattern", "u32"], ["nwg_x", "u32"]],
  bindings: () => [
    { name: "P", kind: "uniform" },
    { name: "dst", kind: "read_write", type: "array<u32>" },
  ],
  source: (c) =>
    `@compute @workgroup_size(${c.wg})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wg.x + wg.y * P.nwg_x) * ${c.wg}u + lid;
  if (i < P.n_words) {
    dst[i] = P.pattern;
  }
}
`,
};

/** A planned fill of `words` words with `pattern`. */
export interface FillPlan {
  kernel: CompiledKernel;
  params: Section;
  grid: [number, number];
}

/** Plans a fill, adding its Params to `table`. */
export async function planFill(
  ctx: GpuContext,
  words: number,
  pattern: number,
  table: TableBuilder,
): Promise<FillPlan> {
  const kernel = await getKernel(ctx, FILL, { wg: WG });
  const grid = dispatchSize(ctx, Math.ceil(words / WG));
  const params = table.add(packUniforms(FILL, { n_words: words, pattern, nwg_x: grid[0] }));
  return { kernel, params, grid };
}
