/**
 * The finiteness of a large call's query/key/value checked on the device (gpu/finite_check.ts):
 * the service leaves the host scan of a batch of at least deviceFiniteCheckBytes() to a GPU
 * plan that checks before it writes (`checks_finite`). A NaN or infinity anywhere in any of
 * the three tensors still fails the call with the validator's 422 naming the tensor, the first
 * bad element and its value, and the held cache is left exactly as it was (the gated cache
 * write dispatched no workgroup); the same call with finite data matches CPU_REFERENCE. A plan
 * without the check (a host backend) gets the host scan instead, with the same answer.
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { WEBGPU_DECODE } from "../../backends/webgpu_decode.ts";
import { WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import { checksFiniteOnDevice, deviceFiniteCheckBytes, toFloat32 } from "../../core/data.ts";
import { ServiceError } from "../../core/errors.ts";
import type { AttentionBackend, ForwardBatch, ValidBatch } from "../../core/types.ts";
import type { GpuPlan } from "../../gpu/gpu_plan.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { AttentionService } from "../../service/service.ts";
import { hostInput, validHostBatch } from "../../service/host_input.ts";
import { attachCache, validateForward } from "../../service/validate.ts";
import { builtinBackends } from "../../backends/index.ts";
import { generateBatch, Rng, smallSpec } from "../support/batches.ts";
import { assertClose, assertSameBytes } from "../support/compare.ts";
import { MANAGER } from "../support/gpu.ts";
import { freshSeed, GPU, GPU_TEST } from "./helpers.ts";

const opts = GPU_TEST;

/**
 * 1400 decode requests of 1 to 7 keys: 4.2 MB of f16 query/key/value (over the device-check
 * threshold) that are cheap to attend on a software adapter.
 */
const SPEC = smallSpec({
  head_size: 128,
  num_heads: 8,
  requests: Array.from({ length: 1400 }, (_, i) => ({ query_len: 1, seq_len: 1 + (i % 7) })),
  return_lse: false,
});

type Tensor = "query" | "key" | "value";

/** `b` with a NaN, +inf or -inf at a random element of a random tensor. */
function poisoned(b: Omit<ForwardBatch, "cache">, rng: Rng): {
  batch: Omit<ForwardBatch, "cache">;
  name: Tensor;
  at: number;
  value: number;
} {
  const name = (["query", "key", "value"] as const)[rng.int(3)];
  const a = b[name]!.slice();
  const at = rng.int(a.length), value = [NaN, Infinity, -Infinity][rng.int(3)];
  a[at] = value;
  return { batch: { ...b, [name]: a }, name, at, value };
}

/**
 * `b` validated as the service does (a large batch's scan left to the device: no throw,
 * `finite_deferred`) and attached to `cache`.
 */
function deferredBatch(b: Omit<ForwardBatch, "cache">, cache: GpuKvCache): ValidBatch {
  const v = validateForward(
    hostInput(b, "c"),
    { spec: cache.spec, storage: "webgpu" },
    undefined,
    { deferFinite: true },
  );
  assert.equal(v.finite_deferred, true);
  return attachCache(v.batch, cache);
}

/** Equal bytes, else a failure naming the first difference (no multi-megabyte diff). */
function assertNonFinite422(e: unknown, name: Tensor, at: number, value: number): void {
  assert.ok(e instanceof ServiceError, String(e));
  assert.equal(e.status, 422);
  assert.equal(e.code, "invalid_batch");
  const hit = e.issues?.find((i) => i.path[0] === name);
  assert.deepEqual(hit?.path, [name, at], JSON.stringify(e.issues));
  assert.match(hit!.message, new RegExp(`element ${at} is ${value} in float16`));
}

Deno.test(
  "finite check: the batch is over the threshold; GPU plans check, and say so",
  opts,
  async () => {
    const g = generateBatch(SPEC, freshSeed());
    const cache = await GpuKvCache.fromBytes(GPU!, g.cache_spec!, g.key_cache, g.value_cache);
    try {
      const batch = validHostBatch(g.batch, cache);
      assert.ok(checksFiniteOnDevice(batch), `${deviceFiniteCheckBytes()} B threshold`);
      for (const b of [WEBGPU_FLASH, WEBGPU_DECODE] as AttentionBackend<GpuPlan>[]) {
        const plan = await b.plan(batch, { gpu: GPU });
        assert.equal(plan.checks_finite, true, b.name);
        assert.deepEqual(plan.calls.slice(0, 2).map((c) => c.name), [
          "finite_check",
          "cache_write",
        ]);
        // The write reads the flags itself: no indirect dispatch (Dawn validates each one
        // with a pass of its own, ~0.1-0.3 ms of host time a call).
        assert.deepEqual(plan.calls[1].bind.flags, { io: "flags" });
        assert.ok(!plan.calls.some((c) => c.indirect), "no indirect dispatch");
      }
      // A small batch keeps the host scan: no check calls.
      const small = generateBatch({ ...SPEC, requests: SPEC.requests.slice(0, 8) }, freshSeed());
      const c2 = await GpuKvCache.fromBytes(
        GPU!,
        small.cache_spec!,
        small.key_cache,
        small.value_cache,
      );
      const plan = await WEBGPU_FLASH.plan(validHostBatch(small.batch, c2), { gpu: GPU });
      assert.equal((plan as GpuPlan).checks_finite, false);
      assert.ok(!(plan as GpuPlan).calls.some((c) => c.name.startsWith("finite")));
      c2.destroy();
    } finally {
      cache.destroy();
    }
  },
);

Deno.test("finite check: a deferred NaN fails on the device and writes nothing", opts, async () => {
  const seed = freshSeed(), rng = new Rng(seed);
  const g = generateBatch(SPEC, seed);
  const cache = await GpuKvCache.fromBytes(GPU!, g.cache_spec!, g.key_cache, g.value_cache);
  try {
    const before = await cache.read();
    for (const b of [WEBGPU_FLASH, WEBGPU_DECODE] as AttentionBackend<GpuPlan>[]) {
      const p = poisoned(g.batch, rng);
      const batch = deferredBatch(p.batch, cache);
      const plan = await b.plan(batch, { gpu: GPU });
      await assert.rejects(
        () => b.run(plan, batch, { gpu: GPU }),
        (e) => (assertNonFinite422(e, p.name, p.at, p.value), true),
        `${b.name}, seed ${seed}`,
      );
      const after = await cache.read();
      assertSameBytes(after.key, before.key, `key cache unchanged (${b.name}, seed ${seed})`);
      assertSameBytes(after.value, before.value, `value cache unchanged (${b.name})`);
    }
  } finally {
    cache.destroy();
  }
});

Deno.test(
  "finite check: through the service, on a GPU cache and on a host cache",
  opts,
  async () => {
    const seed = freshSeed(), rng = new Rng(seed);
    const g = generateBatch(SPEC, seed);
    const svc = new AttentionService({
      backends: builtinBackends(),
      device: MANAGER,
      memoryBudgetBytes: 1 << 30,
    });
    const spec = g.cache_spec!;
    const zeros = new Uint8Array(g.key_cache.byteLength);
    const req = { ...spec, dtype: spec.dtype, kv_cache_dtype: spec.kv_cache_dtype };
    try {
      for (const backend of [undefined, "CPU_REFERENCE"]) {
        const c = await svc.createCache({ ...req, backend });
        assert.equal(c.storage, backend ? "host" : "webgpu");
        for (let i = 0; i < 2; i++) {
          const p = poisoned(g.batch, rng);
          await assert.rejects(
            () => svc.forward(hostInput(p.batch, c.id)),
            (e) => (assertNonFinite422(e, p.name, p.at, p.value), true),
            `${c.backend}, seed ${seed}`,
          );
        }
        const unchanged = await svc.cacheData(c.id);
        assertSameBytes(unchanged.key, zeros, `${c.backend}: key cache unchanged`);
        assertSameBytes(unchanged.value, zeros, `${c.backend}: value cache unchanged`);
        // The finite call runs and matches the reference on the same (zero) cache.
        const got = await svc.forward(hostInput(g.batch, c.id));
        const ref = HostKvCache.fromBytes(spec, zeros, zeros);
        const want = await CPU_REFERENCE.run({}, validHostBatch(g.batch, ref), { gpu: null });
        assertClose(toFloat32(got.result.output), toFloat32(want.output), {
          atol: 1e-2,
          rtol: 1e-2,
          label: `${c.backend} output (seed ${seed})`,
        });
        const [x, y] = [await svc.cacheData(c.id), await ref.read()];
        assertSameBytes(x.key, y.key, `${c.backend}: key cache after the call`);
        assertSameBytes(x.value, y.value, `${c.backend}: value cache after the call`);
        await svc.deleteCache(c.id);
      }
    } finally {
      await svc.close();
    }
  },
);

Deno.test(
  "finite check: with several bad elements in each tensor, each tensor's first is named",
  opts,
  async () => {
    const seed = freshSeed(), rng = new Rng(seed);
    const g = generateBatch(SPEC, seed);
    const cache = await GpuKvCache.fromBytes(GPU!, g.cache_spec!, g.key_cache, g.value_cache);
    try {
      const b: Omit<ForwardBatch, "cache"> = { ...g.batch };
      const first: Record<Tensor, number> = { query: 0, key: 0, value: 0 };
      for (const name of ["query", "key", "value"] as const) {
        const a = b[name]!.slice();
        const at = Array.from({ length: 3 }, () => rng.int(a.length));
        for (const i of at) a[i] = NaN;
        first[name] = Math.min(...at);
        b[name] = a;
      }
      const batch = deferredBatch(b, cache);
      for (const be of [WEBGPU_FLASH, WEBGPU_DECODE] as AttentionBackend<GpuPlan>[]) {
        const plan = await be.plan(batch, { gpu: GPU });
        // Twice: the second call's flags buffer comes from the pool, set by the first.
        for (let i = 0; i < 2; i++) {
          await assert.rejects(() => be.run(plan, batch, { gpu: GPU }), (e) => {
            assert.ok(e instanceof ServiceError, String(e));
            const paths = (e.issues ?? []).map((x) => x.path);
            assert.deepEqual(
              paths,
              (["query", "key", "value"] as const).map((n) => [n, first[n]]),
              `${be.name}, seed ${seed}`,
            );
            return true;
          });
        }
      }
    } finally {
      cache.destroy();
    }
  },
);
