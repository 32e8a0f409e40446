/**
 * Why the tensor-core kernel refuses a batch, as data: the kind mmaConstsOf
 * (backends/flash_mma_plan.ts) gives each refusal, and the path reason WEBGPU_FLASH words each
 * kind as (`MMA_REFUSAL_REASONS`, sent in `X-Attention-Path-Reasons`), end to end through
 * `flashRouting`. Fake contexts (no device): runs everywhere.
 */
import assert from "node:assert/strict";
import {
  flashRouting,
  MMA_REFUSAL_REASONS,
  resolveFlashOptions,
} from "../../backends/webgpu_flash.ts";
import { mmaConstsOf, MmaRefusal, type MmaRefusalKind } from "../../backends/flash_mma_plan.ts";
import { DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { MMA_FEATURE } from "../../gpu/flash_mma_kernel.ts";
import { MMA_VARIANTS } from "../../gpu/flash_mma_shape.ts";
import type { BatchShape, GpuContext } from "../../core/types.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, generateBatch, smallSpec } from "../support/batches.ts";
import { fakeMmaContext } from "../support/fake_device.ts";

const SUPPORT = { m: 16, n: 16, k: 16, sg: 32 };

/** A fake device with Dawn's subgroup-matrix feature (f16 -> f32 16x16x16, subgroup 32). */
const fakeCtx = (limits: Record<string, number> = {}) => fakeMmaContext(true, limits);

/** A generated batch with a decode and a prefill request, as the service plans it. */
function shape(o: Partial<BatchSpec>): BatchShape {
  const g = generateBatch(
    smallSpec({
      head_size: 128,
      requests: [{ query_len: 1, seq_len: 40 }, { query_len: 17, seq_len: 30 }],
      ...o,
    }),
    1,
  );
  const cache = g.cache_spec
    ? HostKvCache.fromBytes(g.cache_spec, g.key_cache, g.value_cache)
    : null;
  return validHostBatch(g.batch, cache);
}

/** The refusal `c` is, with its kind and detail (fails where `c` is constants). */
function refusalOf(c: unknown): { kind: MmaRefusalKind; detail: string } {
  assert.ok(c instanceof MmaRefusal, `a refusal, got ${JSON.stringify(c)}`);
  return { kind: c.kind, detail: c.detail };
}

/** The prefill part's path reason on `ctx`. */
function prefillReason(ctx: GpuContext, s: BatchShape): string | undefined {
  const opts = { tile: null, decode: { ...DEFAULT_DECODE_TUNING }, mma: true };
  return flashRouting(ctx, resolveFlashOptions(opts), s).paths.parts[1].reason;
}

Deno.test("mma refusal: each kind worded for the path reasons", () => {
  const f32 = shape({ dtype: "float32" });
  const words: Record<MmaRefusalKind, string> = {
    support: "subgroup matrices not supported (why)",
    dtype: "dtype not supported (got float32; supported: float16, bfloat16)",
    shape: "kernel shape not supported (why)",
    workgroup_memory: "workgroup memory not sufficient (why)",
    invocations: "workgroup size not supported (why)",
  };
  for (const [kind, want] of Object.entries(words)) {
    assert.equal(MMA_REFUSAL_REASONS[kind as MmaRefusalKind]("why", f32), want, kind);
  }
  assert.deepEqual(Object.keys(MMA_REFUSAL_REASONS).sort(), Object.keys(words).sort());
});

Deno.test("mma refusal: the kind of each refusal mmaConstsOf gives", () => {
  const ctx = fakeCtx();
  const f16 = shape({}), bf16Cache = shape({ kv_cache_dtype: "bfloat16" });
  assert.deepEqual(refusalOf(mmaConstsOf(ctx, f16, null)), {
    kind: "support",
    detail: "the device has no f16 -> f32 subgroup matrices",
  });
  assert.deepEqual(refusalOf(mmaConstsOf(ctx, shape({ dtype: "float32" }), SUPPORT)), {
    kind: "dtype",
    detail: "float32 data keeps the exact f32 path",
  });
  const direct = MMA_VARIANTS["w8r1k16-fd"];
  assert.deepEqual(refusalOf(mmaConstsOf(ctx, bf16Cache, SUPPORT, direct)), {
    kind: "shape",
    detail: "direct loads need an f16 cache, not bfloat16",
  });
  // A shape problem is a shape problem even where the memory would not do either.
  const tiny = fakeCtx({ maxComputeWorkgroupStorageSize: 1024 });
  const hd72 = shape({ head_size: 72 });
  assert.equal(refusalOf(mmaConstsOf(tiny, hd72, SUPPORT, direct)).kind, "shape");
  const big = { nsg: 64, rm: 4, bk: 256, tau: 8 };
  const tooBig = refusalOf(mmaConstsOf(ctx, f16, SUPPORT, big));
  assert.equal(tooBig.kind, "workgroup_memory");
  assert.match(tooBig.detail, /^needs \d+ B of workgroup memory \(limit 32768\)$/);
  const small = fakeCtx({ maxComputeWorkgroupStorageSize: 4096 });
  assert.deepEqual(refusalOf(mmaConstsOf(small, f16, SUPPORT)), {
    kind: "workgroup_memory",
    detail: "no kernel shape fits head_size 128 in 4096 B of workgroup memory",
  });
  // No shape compiles for head_size 72 whatever the memory: a shape refusal, not memory.
  assert.deepEqual(refusalOf(mmaConstsOf(small, hd72, SUPPORT)), {
    kind: "shape",
    detail: "head_size 72 is not a multiple of 16",
  });
  const narrow = fakeCtx({ maxComputeInvocationsPerWorkgroup: 64 });
  assert.deepEqual(refusalOf(mmaConstsOf(narrow, f16, SUPPORT)), {
    kind: "invocations",
    detail: "256 invocations a workgroup (limit 64)",
  });
  // A refusal reads as its detail (String(), template strings).
  assert.equal(String(mmaConstsOf(narrow, f16, SUPPORT)), "256 invocations a workgroup (limit 64)");
  assert.ok(!(mmaConstsOf(ctx, f16, SUPPORT) instanceof MmaRefusal));
});

Deno.test("mma refusal: the prefill path reasons flashRouting sends, one per kind it meets", () => {
  assert.equal(
    prefillReason(fakeCtx(), shape({ dtype: "float32" })),
    "dtype not supported (got float32; supported: float16, bfloat16)",
  );
  assert.equal(
    prefillReason(fakeCtx({ maxComputeWorkgroupStorageSize: 4096 }), shape({})),
    "workgroup memory not sufficient (no kernel shape fits head_size 128 in 4096 B of " +
      "workgroup memory)",
  );
  assert.equal(
    prefillReason(fakeCtx({ maxComputeInvocationsPerWorkgroup: 64 }), shape({})),
    "workgroup size not supported (256 invocations a workgroup (limit 64))",
  );
  const noFeature = { ...fakeCtx(), features: new Set(["shader-f16", "subgroups"]) };
  assert.equal(
    prefillReason(noFeature as GpuContext, shape({})),
    `subgroup matrices not supported (feature ${MMA_FEATURE} not granted)`,
  );
  assert.equal(prefillReason(fakeCtx(), shape({})), undefined);
});
