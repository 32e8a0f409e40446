/**
 * The compiled-kernel cache keeps at most `ATTN_KERNEL_CACHE_LIMIT` variants a device, dropping
 * the least recently used compiled one: a soak over every cache setting grew the server by
 * ~2.4 MB a pipeline on lavapipe to 1.8 GB, and the cache never let go. A dropped variant is
 * compiled again when asked for.
 */
import assert from "node:assert/strict";
import { compiledKernelKeys, getKernel, type KernelDef } from "../../gpu/kernel.ts";
import { GPU, NO_GPU } from "./helpers.ts";
import { withEnv } from "../support/env.ts";

/** A trivial kernel whose variants differ by a constant. */
const TINY: KernelDef<{ v: number }> = {
  name: "cache_limit_probe",
  uniforms: [["n", "u32"]],
  bindings:
    () => [{ name: "P", kind: "uniform" }, { name: "out", kind: "read_write", type: "array<u32>" }],
  source: (c) => `@compute @workgroup_size(1) fn main() { if (P.n > 0u) { out[0] = ${c.v}u; } }`,
};

const mine = () =>
  compiledKernelKeys({ device: GPU!.device } as never).filter((k) => k.startsWith(TINY.name));

Deno.test("kernel cache: at most the limit a device, least recently used out", {
  ignore: NO_GPU,
}, async () => {
  // Two a device: other tests' variants, all older than ours, go first.
  await withEnv({ ATTN_KERNEL_CACHE_LIMIT: "2" }, async () => {
    for (const v of [0, 1, 2]) await getKernel(GPU!, TINY, { v });
    await getKernel(GPU!, TINY, { v: 0 }); // used again: the most recent with v = 2
    await getKernel(GPU!, TINY, { v: 3 });
    const all = compiledKernelKeys({ device: GPU!.device } as never);
    assert.deepEqual(all, ["cache_limit_probe(v=0)", "cache_limit_probe(v=3)"]);
    const again = await getKernel(GPU!, TINY, { v: 1 }); // dropped: compiled again
    assert.equal(again.key, "cache_limit_probe(v=1)");
    assert.deepEqual(mine(), ["cache_limit_probe(v=1)", "cache_limit_probe(v=3)"]);
  });
});
