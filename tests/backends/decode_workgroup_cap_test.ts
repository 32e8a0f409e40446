/**
 * WEBGPU_DECODE's `workgroup_size` within the device's invocations a workgroup: the tuning's rule
 * allows up to 1024 (the most any WebGPU adapter grants), but a device may grant as few as 256
 * (`maxComputeInvocationsPerWorkgroup`, `maxComputeWorkgroupSizeX`). The plan used the tuning's
 * value as it was, and the kernel failed to compile there (500 `shader_compile_failed`); the
 * shape now takes the largest multiple of the lanes a key row within the device's limit. A fake
 * GPU context (no device) for the shape; a plan with lowered limits on the suite's device (which
 * grants more, so the planned kernel also runs) for the plan's count and the output.
 */
import assert from "node:assert/strict";
import { decodeShape } from "../../backends/decode_shape.ts";
import { DEFAULT_DECODE_TUNING, makeWebGpuDecode } from "../../backends/webgpu_decode.ts";
import type { AttentionBackend, GpuContext } from "../../core/types.ts";
import { checkBackend } from "../support/backend_check.ts";
import { decodePlanInfo, FP8_HND_SPEC } from "../support/decode_knob_specs.ts";
import { FAKE_SHAPE_LAYER, FAKE_SHAPE_SPEC, fakeMmaContext } from "../support/fake_device.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

const LAYER = FAKE_SHAPE_LAYER, SPEC = FAKE_SHAPE_SPEC;
/** The GPU kernel shape (several key groups a workgroup), 1024 invocations asked for. */
const WIDE = { ...DEFAULT_DECODE_TUNING, workgroup_size: 1024, keys_per_iter: 4 };

Deno.test("decode shape: workgroup_size within the device's invocations a workgroup", () => {
  // A GPU like an H100 under Dawn (subgroups of 32), granting 1024 or WebGPU's 256.
  const wgOf = (limits: Record<string, number>, t = WIDE) =>
    decodeShape(fakeMmaContext(false, limits), t, LAYER, SPEC, "float16").wg;
  assert.equal(wgOf({}), 1024, "a device granting 1024 takes it");
  assert.equal(wgOf({ maxComputeInvocationsPerWorkgroup: 256 }), 256);
  assert.equal(wgOf({ maxComputeWorkgroupSizeX: 512 }), 512, "the x dimension's limit too");
  // WebGPU's defaults where the context reports neither limit.
  const unset = fakeMmaContext(false);
  delete (unset.limits as Record<string, number>).maxComputeInvocationsPerWorkgroup;
  delete (unset.limits as Record<string, number>).maxComputeWorkgroupSizeX;
  assert.equal(decodeShape(unset, WIDE, LAYER, SPEC, "float16").wg, 256, "WebGPU's 256");
  // A multiple of the lanes a key row (8 here: max_lanes) within 100 invocations.
  const narrow = { ...WIDE, max_lanes: 8 };
  assert.equal(wgOf({ maxComputeInvocationsPerWorkgroup: 100 }, narrow), 96);
  // Smaller sizes are untouched.
  assert.equal(
    wgOf({ maxComputeInvocationsPerWorkgroup: 256 }, { ...WIDE, workgroup_size: 128 }),
    128,
  );
});

Deno.test(
  "decode plan: workgroup_size 1024 on a device granting 256 plans 256 invocations, right",
  { ignore: NO_GPU, sanitizeResources: false, sanitizeOps: false },
  async () => {
    const limited: GpuContext = {
      ...GPU!,
      limits: {
        ...GPU!.limits,
        maxComputeInvocationsPerWorkgroup: 256,
        maxComputeWorkgroupSizeX: 256,
      },
    };
    const b = makeWebGpuDecode({ ...WIDE, max_lanes: 8 }) as AttentionBackend;
    const info = await decodePlanInfo(limited, b, FP8_HND_SPEC);
    assert.ok(info.decode_wg_invocations <= 256, JSON.stringify(info));
    assert.ok(info.decode_wg_invocations >= 8, JSON.stringify(info));
    await checkBackend(b, limited, FP8_HND_SPEC);
  },
);
