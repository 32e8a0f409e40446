/**
 * Runs a one-pass test kernel over u32 words: `body` (WGSL statements of `main`, given `i`, the
 * invocation's index below `n`) reads `src` and writes `dst[i]`; `prelude` holds the functions it
 * calls. The output is poisoned first and read back as u32 bits (NaN payloads kept). For the GPU
 * tests of WGSL helpers (round_pair, div_rn) against their host references.
 * @module
 */
import { BatchBuffers } from "../../gpu/batch_buffers.ts";
import { getComputePipeline } from "../../gpu/pipelines.ts";
import { gpu } from "./helpers.ts";

/** `n` u32 results of `body` over the words `src`, on the shared test device. */
export async function runWordKernel(
  label: string,
  prelude: string,
  body: string,
  src: Uint32Array,
  n: number,
): Promise<Uint32Array> {
  const ctx = gpu();
  const code = `${prelude}
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.x;
  if (i >= ${n}u) { return; }
${body}
}`;
  const p = await getComputePipeline(ctx, `test.${label}`, code);
  const bb = new BatchBuffers(ctx, "t");
  try {
    const out = bb.poisoned(n);
    const enc = ctx.device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(p);
    pass.setBindGroup(
      0,
      ctx.device.createBindGroup({
        layout: p.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: { buffer: bb.storage(new Uint8Array(src.buffer)) } },
          { binding: 1, resource: { buffer: out } },
        ],
      }),
    );
    pass.dispatchWorkgroups(Math.ceil(n / 64));
    pass.end();
    const read = bb.readback(enc, [{ buffer: out, floats: n }]);
    ctx.device.queue.submit([enc.finish()]);
    const [got] = await read();
    return new Uint32Array(got.buffer, got.byteOffset, n).slice();
  } finally {
    bb.destroy();
  }
}
