/**
 * The tensor-core kernel's fp8 -> f16 staging decoders (gpu/flash_mma_staging.ts) against
 * core/dtype.ts's tables on all 256 codes of e4m3fn and e5m2: exact, NaN where the format has
 * NaN, infinities for e5m2. Needs a device with `shader-f16` through Dawn (the subgroup-matrix
 * device of gpu/flash_mma_device.ts); skipped with the reason elsewhere.
 */
import assert from "node:assert/strict";
import { mmaTestDevice } from "../support/mma_case.ts";
import { FP8_E4M3_TABLE, FP8_E5M2_TABLE } from "../../core/dtype.ts";
import { FP8_TO_F16 } from "../../gpu/flash_mma_staging.ts";
import { dispatchIntoBuffer } from "../support/dispatch.ts";

const ctx = await mmaTestDevice("flash_mma fp8 staging test");

async function decodeAll(code: string): Promise<Float32Array> {
  const dev = ctx!.device;
  const module = dev.createShaderModule({
    code: `enable f16;
@group(0) @binding(0) var<storage, read_write> o: array<f32>;
${code}
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) x: u32) {
  let c = 4u * x;
  let v = fp8x4_f16(c | ((c + 1u) << 8u) | ((c + 2u) << 16u) | ((c + 3u) << 24u));
  o[c] = f32(v.x);
  o[c + 1u] = f32(v.y);
  o[c + 2u] = f32(v.z);
  o[c + 3u] = f32(v.w);
}`,
  });
  const pipeline = await dev.createComputePipelineAsync({
    layout: "auto",
    compute: { module, entryPoint: "main" },
  });
  return new Float32Array(await dispatchIntoBuffer(dev, pipeline, 1024));
}

Deno.test({
  name: "flash_mma: fp8 -> f16 staging is exact on all 256 codes (e4m3fn, e5m2)",
  ignore: ctx === null,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    for (
      const [dt, table] of [["fp8_e4m3", FP8_E4M3_TABLE], ["fp8_e5m2", FP8_E5M2_TABLE]] as const
    ) {
      const got = await decodeAll(FP8_TO_F16[dt]);
      for (let c = 0; c < 256; c++) {
        const want = table[c];
        assert.ok(
          Object.is(got[c], want) || (Number.isNaN(got[c]) && Number.isNaN(want)) ||
            (got[c] === want),
          `${dt} code ${c}: ${got[c]} vs ${want}`,
        );
      }
    }
  },
});
