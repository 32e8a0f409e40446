/**
 * A tensor-core shape named by `ATTN_PREFILL_MMA_SHAPE` (WEBGPU_FLASH's `mma_shape` option) that
 * a batch cannot take on this device while the default shape can: the default ran without a
 * word (a direct shape on a bf16 cache, one over the workgroup memory), or, for a shape over the
 * device's invocations a workgroup, the whole kernel was refused though the default fits. Now
 * the default runs in both cases and the parts on the tensor core say why not the named shape
 * (`X-Attention-Path-Reasons`), with a warning line on stderr once per process and reason.
 * Fake contexts with Dawn's subgroup-matrix feature (no device): runs everywhere.
 */
import assert from "node:assert/strict";
import { flashRouting, resolveFlashOptions } from "../../backends/webgpu_flash.ts";
import { mmaConstsOf, MmaRefusal, mmaShapeNotTaken } from "../../backends/flash_mma_plan.ts";
import { DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { MMA_SHAPES, MMA_VARIANTS, type MmaShape } from "../../gpu/flash_mma_shape.ts";
import type { BatchShape, GpuContext } from "../../core/types.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, generateBatch, smallSpec } from "../support/batches.ts";
import { fakeMmaContext } from "../support/fake_device.ts";

const SUPPORT = { m: 16, n: 16, k: 16, sg: 32 };
const MIXED = [{ query_len: 1, seq_len: 40 }, { query_len: 17, seq_len: 30 }];

/** A generated batch (f16 data, head size 128) as the service plans it. */
function shape(o: Partial<BatchSpec>): BatchShape {
  const g = generateBatch(smallSpec({ head_size: 128, requests: MIXED, ...o }), 1);
  const cache = g.cache_spec
    ? HostKvCache.fromBytes(g.cache_spec, g.key_cache, g.value_cache)
    : null;
  return validHostBatch(g.batch, cache);
}

/** What `f` writes with console.error, and its result. */
function stderrOf<T>(f: () => T): [T, string[]] {
  const lines: string[] = [];
  const was = console.error;
  console.error = (...a: unknown[]) => lines.push(a.map(String).join(" "));
  try {
    return [f(), lines];
  } finally {
    console.error = was;
  }
}

/** flashRouting with `named` as the tensor-core shape, on `ctx`. */
function route(ctx: GpuContext, s: BatchShape, named?: MmaShape) {
  const o = { tile: null, decode: { ...DEFAULT_DECODE_TUNING }, mma: true, mma_shape: named };
  return flashRouting(ctx, resolveFlashOptions(o), s);
}

const notTaken = (name: string, why: string) =>
  `shape ${name} (ATTN_PREFILL_MMA_SHAPE) not taken (${why}): the default shape runs`;

Deno.test("mma shape: a direct shape on a bf16 cache: the default runs, the reason says so", () => {
  const ctx = fakeMmaContext(true);
  const s = shape({ kv_cache_dtype: "bfloat16" });
  const why = notTaken("w8r1k16-fd", "direct loads need an f16 cache, not bfloat16");
  const [[a, b], lines] = stderrOf(() => [
    route(ctx, s, MMA_VARIANTS["w8r1k16-fd"]),
    route(ctx, s, MMA_VARIANTS["w8r1k16-fd"]),
  ]);
  for (const r of [a, b]) {
    assert.ok(r.mma && !r.mma.direct, "the default shape's constants");
    assert.deepEqual(r.paths.parts, [
      { part: "decode", path: "split_kv" },
      { part: "prefill", path: "tensor_core", reason: why },
    ]);
    assert.equal(r.paths.header, "decode=split_kv, prefill=tensor_core");
    assert.equal(r.paths.reasons_header, `prefill="${why}"`);
  }
  assert.deepEqual(lines, [`warning: ${why}`], "one line for both plans");
  assert.equal(mmaShapeNotTaken(ctx, s, SUPPORT, MMA_VARIANTS["w8r1k16-fd"]), why);
});

Deno.test("mma shape: a named shape the batch takes, or none named: no reason, no line", () => {
  const ctx = fakeMmaContext(true);
  const s = shape({});
  const [rs, lines] = stderrOf(() => [
    route(ctx, s, MMA_VARIANTS["w8r1k16-fd"]),
    route(ctx, s, MMA_VARIANTS["w4r1k16-fl"]),
    route(ctx, s),
  ]);
  for (const r of rs) {
    assert.deepEqual(r.paths.parts, [
      { part: "decode", path: "split_kv" },
      { part: "prefill", path: "tensor_core" },
    ]);
    assert.equal(r.paths.reasons_header, "");
  }
  assert.ok(rs[0].mma?.direct, "the named direct shape runs on an f16 cache");
  assert.equal(rs[1].mma?.nsg, 4, "w4r1k16-fl runs");
  assert.deepEqual(lines, []);
  assert.equal(mmaShapeNotTaken(ctx, s, SUPPORT, MMA_VARIANTS["w8r1k16-fd"]), null);
  assert.equal(mmaShapeNotTaken(ctx, s, SUPPORT), null);
});

Deno.test("mma shape: one over the device's workgroup memory: the default runs", () => {
  // A shape in code (no name): its fields name it. 64 KB of tiles at head size 128.
  const big: MmaShape = { nsg: 8, rm: 2, bk: 64, tau: 8, fast: true };
  const ctx = fakeMmaContext(true, { maxComputeWorkgroupStorageSize: 32768 });
  const s = shape({});
  const c = mmaConstsOf(ctx, s, SUPPORT, undefined, big);
  assert.ok(!(c instanceof MmaRefusal) && c.bk === MMA_SHAPES[0].bk, String(c));
  const [r] = stderrOf(() => route(ctx, s, big));
  assert.match(
    r.paths.parts[1].reason ?? "",
    /^shape \{"nsg":8,"rm":2,"bk":64,"tau":8,"fast":true\} \(ATTN_PREFILL_MMA_SHAPE\) not taken \(needs \d+ B of workgroup memory \(limit 32768\)\): the default shape runs$/,
  );
  assert.equal(r.paths.parts[1].path, "tensor_core");
});

Deno.test("mma shape: one over the device's invocations: the default runs, not a refusal", () => {
  // 16 subgroups of 32: 512 invocations; the default's 8 x 32 = 256 fit WebGPU's 256 (48 KB of
  // workgroup memory: the named shape's 41 KB fit).
  const ctx = fakeMmaContext(true, {
    maxComputeInvocationsPerWorkgroup: 256,
    maxComputeWorkgroupStorageSize: 49152,
  });
  const s = shape({});
  const named = MMA_VARIANTS["w16r1k16-fld"];
  const c = mmaConstsOf(ctx, s, SUPPORT, undefined, named);
  assert.ok(!(c instanceof MmaRefusal), `the default runs (got ${String(c)})`);
  assert.equal(c.nsg, 8);
  const [r] = stderrOf(() => route(ctx, s, named));
  assert.ok(r.mma);
  assert.deepEqual(r.paths.parts[1], {
    part: "prefill",
    path: "tensor_core",
    reason: notTaken("w16r1k16-fld", "512 invocations a workgroup (limit 256)"),
  });
  // Where the default does not fit either, the kernel's refusal is the reason, as before.
  const narrow = fakeMmaContext(true, { maxComputeInvocationsPerWorkgroup: 64 });
  const [n, lines] = stderrOf(() => route(narrow, s, named));
  assert.equal(n.mma, null);
  assert.equal(
    n.paths.parts[1].reason,
    "workgroup size not supported (256 invocations a workgroup (limit 64))",
  );
  assert.deepEqual(lines, []);
});

Deno.test("mma shape: decode rows on the tensor core say both reasons", () => {
  // Head size 32: no split-KV kernel; the decode rows run with the prefill rows.
  const ctx = fakeMmaContext(true);
  const s = shape({ head_size: 32, kv_cache_dtype: "bfloat16" });
  const [r] = stderrOf(() => route(ctx, s, MMA_VARIANTS["w8r1k16-fd"]));
  const why = notTaken("w8r1k16-fd", "direct loads need an f16 cache, not bfloat16");
  assert.deepEqual(r.paths.parts, [
    {
      part: "decode",
      path: "tensor_core",
      reason: "head_size not supported (got 32; supported: 64, 80, 96, 112, 128, 192, 256); " +
        why,
    },
    { part: "prefill", path: "tensor_core", reason: why },
  ]);
});
