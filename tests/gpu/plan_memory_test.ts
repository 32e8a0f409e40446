/**
 * A decode step plans anew, cheaply: plan tables live in lent memory (gpu/plan_table.ts
 * TABLE_MEMORY) returned when a plan is disposed, large sections are written in place
 * (TableBuilder.addWords), Params are packed from a per-kernel field map and compiled kernels
 * are found without an await (gpu/kernel.ts). None of it may change a byte: a plan built on
 * reused memory, after other steps of the same shape, equals the plan first built for its
 * metadata and still matches CPU_REFERENCE.
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { WEBGPU_DECODE } from "../../backends/webgpu_decode.ts";
import { WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import { toFloat32 } from "../../core/data.ts";
import type { AttentionBackend } from "../../core/types.ts";
import {
  bindGpuPlan,
  bindStats,
  GPU_TIMING_SAMPLE,
  type GpuPlan,
  gpuTiming,
} from "../../gpu/gpu_plan.ts";
import { FILL } from "../../gpu/fill.ts";
import { compiledKernel, getKernel, packUniforms } from "../../gpu/kernel.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { TableBuilder, TableMemory } from "../../gpu/plan_table.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, generateBatch, smallSpec } from "../support/batches.ts";
import { assertClose } from "../support/compare.ts";
import { tolerance } from "../support/backend_check.ts";
import { freshSeed, GPU, GPU_TEST } from "./helpers.ts";

Deno.test("table memory: a reused lease is zeroed; a returned lease is lent once", () => {
  const mem = new TableMemory();
  const a = mem.acquire(5000);
  a.bytes.fill(0xab);
  a.release();
  a.release(); // idempotent: the buffer is not listed twice
  const b = mem.acquire(6000), c = mem.acquire(6000);
  assert.notEqual(b.bytes.buffer, c.bytes.buffer, "two live leases never share memory");
  assert.ok(b.bytes.every((x) => x === 0), "stale bytes of an earlier table are cleared");
  assert.deepEqual(mem.stats(), { created: 2, reused: 1 });
});

Deno.test("table builder: sections written in place equal copied ones, into lent memory", () => {
  const words = Uint32Array.from({ length: 70 }, (_, i) => i * 2654435761);
  const copied = new TableBuilder(), inPlace = new TableBuilder();
  const head = Float32Array.of(1.5, -2, 3);
  copied.add(head);
  inPlace.add(head);
  const s1 = copied.add(words);
  const s2 = inPlace.addWords(words.length, (dst) => dst.set(words));
  assert.deepEqual(s2, s1, "the same offset and bound size");
  const into = new Uint8Array(8192).fill(0); // a zeroed lease, larger than the table
  const got = inPlace.bytes(into);
  assert.equal(got.buffer, into.buffer, "made in the given memory");
  assert.deepEqual(got, copied.bytes());
});

Deno.test("packUniforms: the def's order and types; a missing or unknown field is named", () => {
  const def = {
    name: "k",
    uniforms: [["a", "u32"], ["b", "f32"], ["c", "i32"], ["d", "u32"], ["e", "u32"]] as const,
  };
  const got = packUniforms(def, { e: 7, c: -3, b: 0.5, a: 2 ** 32 - 1, d: 1 });
  const dv = new DataView(got.buffer);
  assert.equal(got.byteLength, 32, "padded to 16 bytes");
  assert.deepEqual(
    [dv.getUint32(0, true), dv.getFloat32(4, true), dv.getInt32(8, true), dv.getUint32(12, true)],
    [2 ** 32 - 1, 0.5, -3, 1],
  );
  assert.equal(dv.getUint32(16, true), 7);
  assert.throws(() => packUniforms(def, { a: 1, b: 1, c: 1, d: 1 }), /k: uniform e has no value/);
  assert.throws(
    () => packUniforms(def, { a: 1, b: 1, c: 1, d: 1, e: 1, f: 2 }),
    /k: unknown uniform f/,
  );
});

Deno.test(
  "kernels: a compiled variant is found again without an await",
  GPU_TEST,
  async () => {
    const gpu = GPU!;
    const wg = 32 + 8 * (freshSeed() % 8); // a variant this process has likely not compiled
    const before = compiledKernel(gpu, FILL, { wg });
    const k = await getKernel(gpu, FILL, { wg });
    assert.ok(before === null || before === k);
    assert.equal(compiledKernel(gpu, FILL, { wg }), k);
    assert.equal(await getKernel(gpu, FILL, { wg }), k);
  },
);

const STEP = (seq: number) =>
  smallSpec({
    requests: [{ query_len: 1, seq_len: seq }, { query_len: 1, seq_len: 70 - seq }, {
      query_len: 3,
      seq_len: 40,
    }],
  });

/** A generated batch with its GPU cache and the host copy CPU_REFERENCE reads. */
async function stepOf(spec: BatchSpec, seed: number) {
  const g = generateBatch(spec, seed);
  const cache = await GpuKvCache.fromBytes(GPU!, g.cache_spec!, g.key_cache, g.value_cache);
  return { g, cache, host: HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache) };
}

for (const backend of [WEBGPU_DECODE, WEBGPU_FLASH] as AttentionBackend<GpuPlan>[]) {
  Deno.test(
    `${backend.name}: a step re-planned on reused memory equals its first plan and the reference`,
    GPU_TEST,
    async () => {
      const gpu = GPU!;
      const seed = freshSeed();
      const { g: first, cache, host } = await stepOf(STEP(33), seed);
      try {
        const batch = validHostBatch(first.batch, cache);
        const p1 = await backend.plan(batch, { gpu });
        const bytes1 = p1.table.slice();
        const calls1 = JSON.stringify(p1.calls.map((c) => [c.name, c.kernel.key, c.grid, c.bind]));
        backend.disposePlan!(p1); // its memory goes back, dirty
        // Other steps of the same shape: their plans take (and leave) that memory.
        for (const seq of [35, 31, 37]) {
          const other = generateBatch(STEP(seq), seed + seq);
          const p = await backend.plan(validHostBatch(other.batch, cache), { gpu });
          assert.notDeepEqual(p.table, bytes1, `step ${seq} plans its own items`);
          backend.disposePlan!(p);
        }
        const p2 = await backend.plan(batch, { gpu });
        assert.deepEqual(p2.table, bytes1, "the same bytes as the first plan");
        assert.equal(
          JSON.stringify(p2.calls.map((c) => [c.name, c.kernel.key, c.grid, c.bind])),
          calls1,
        );
        const want = await CPU_REFERENCE.run({}, validHostBatch(first.batch, host), { gpu: null });
        const got = await backend.run(p2, batch, { gpu });
        try {
          assertClose(toFloat32(got.output), toFloat32(want.output), {
            ...tolerance(first.spec),
            label: `output (seed ${seed})`,
          });
          assertClose(got.lse!, want.lse!, { atol: 2e-4, rtol: 1e-5, label: `lse (seed ${seed})` });
        } finally {
          got.release?.();
          backend.disposePlan!(p2);
        }
      } finally {
        cache.destroy();
      }
    },
  );
}

Deno.test(
  "bind: a plan bound again to the same buffers reuses its calls; concurrent calls get their own",
  GPU_TEST,
  async () => {
    const gpu = GPU!, backend = WEBGPU_DECODE as AttentionBackend<GpuPlan>;
    const seed = freshSeed();
    const { g, cache, host } = await stepOf(STEP(33), seed);
    try {
      const batch = validHostBatch(g.batch, cache);
      const plan = await backend.plan(batch, { gpu });
      const a = bindGpuPlan(plan, batch, gpu);
      a.release();
      const b = bindGpuPlan(plan, batch, gpu);
      assert.equal(b.calls, a.calls, "the same buffers: the last binding's calls, groups and all");
      assert.ok(b.calls.every((c) => c.group !== undefined), "bind groups resolved at bind time");
      // While b holds its buffers, another binding of the plan gets others, and its own calls.
      const c = bindGpuPlan(plan, batch, gpu);
      assert.notEqual(c.calls, b.calls);
      assert.notEqual(c.out, b.out);
      b.release();
      c.release();
      // Two calls of one plan in flight at once (the layers of one step) answer like one.
      const want = await CPU_REFERENCE.run({}, validHostBatch(g.batch, host), { gpu: null });
      // The cache write of a repeated call rewrites the same rows: the reference is unchanged.
      const runs = await Promise.all([0, 1, 2].map(() => backend.run(plan, batch, { gpu })));
      for (const [i, r] of runs.entries()) {
        assertClose(toFloat32(r.output), toFloat32(want.output), {
          ...tolerance(g.spec),
          label: `concurrent call ${i} (seed ${seed})`,
        });
        r.release?.();
      }
      backend.disposePlan!(plan);
    } finally {
      cache.destroy();
    }
  },
);

Deno.test(
  "plans: a step whose calls equal the last step's shares its call list, else gets its own",
  GPU_TEST,
  async () => {
    const gpu = GPU!, backend = WEBGPU_DECODE as AttentionBackend<GpuPlan>;
    const seed = freshSeed();
    const { g, cache } = await stepOf(STEP(33), seed);
    const shape = (c: GpuPlan) =>
      JSON.stringify(c.calls.map((x) => [x.name, x.kernel.key, x.grid, x.bind, x.indirect]));
    try {
      const batch = validHostBatch(g.batch, cache);
      const a = await backend.plan(batch, { gpu });
      const b = await backend.plan(batch, { gpu });
      assert.notEqual(b, a);
      assert.equal(b.calls, a.calls, "the same metadata: the same calls, shared");
      let prev = b, own = 0;
      for (const seq of [34, 20, 50, 21, 35]) {
        const other = generateBatch(STEP(seq), seed + seq);
        const p = await backend.plan(validHostBatch(other.batch, cache), { gpu });
        const same = shape(p) === shape(prev);
        assert.equal(p.calls === prev.calls, same, `step ${seq}: shared exactly when equal`);
        if (!same) own++;
        prev = p;
      }
      assert.ok(own > 0, "the steps cover another decomposition");
    } finally {
      cache.destroy();
    }
  },
);

Deno.test(
  "encode: the LSE is poisoned only when returned; device timing samples a call list's calls",
  GPU_TEST,
  async () => {
    const gpu = GPU!, backend = WEBGPU_DECODE as AttentionBackend<GpuPlan>;
    const seed = freshSeed();
    const { g, cache, host } = await stepOf({ ...STEP(33), return_lse: false }, seed);
    try {
      const batch = validHostBatch(g.batch, cache);
      const plan = await backend.plan(batch, { gpu });
      const poisoned = plan.calls.filter((c) => c.name === "poison").map((c) => c.bind.dst);
      assert.deepEqual(poisoned, [{ io: "out" }], "no LSE read back: only the output poisoned");
      const withLse = await backend.plan(
        validHostBatch(generateBatch(STEP(33), seed).batch, cache),
        { gpu },
      );
      assert.deepEqual(
        withLse.calls.filter((c) => c.name === "poison").map((c) => c.bind.dst),
        [{ io: "out" }, { io: "lse" }],
      );
      const want = await CPU_REFERENCE.run({}, validHostBatch(g.batch, host), { gpu: null });
      const timed: boolean[] = [];
      for (let i = 0; i <= GPU_TIMING_SAMPLE; i++) {
        const r = await backend.run(plan, batch, { gpu });
        assertClose(toFloat32(r.output), toFloat32(want.output), {
          ...tolerance(g.spec),
          label: `call ${i} (seed ${seed})`,
        });
        assert.equal(r.lse, null);
        timed.push(r.timings?.gpu !== undefined);
        r.release?.();
      }
      if (gpu.features.has("timestamp-query") && gpuTiming() === "sampled") {
        const want = timed.map((_, i) => i % GPU_TIMING_SAMPLE === 0);
        assert.deepEqual(timed, want, "the first call and every GPU_TIMING_SAMPLE-th timed");
      }
    } finally {
      cache.destroy();
    }
  },
);

Deno.test(
  "encode: a plan's table is uploaded once per pooled buffer; another table there forgets it",
  GPU_TEST,
  async () => {
    const gpu = GPU!, backend = WEBGPU_DECODE as AttentionBackend<GpuPlan>;
    const seed = freshSeed();
    const { g, cache, host } = await stepOf(STEP(41), seed), h = generateBatch(STEP(29), seed + 1);
    try {
      const batch = validHostBatch(g.batch, cache);
      const plan = await backend.plan(batch, { gpu });
      const other = await backend.plan(validHostBatch(h.batch, cache), { gpu });
      const want = await CPU_REFERENCE.run({}, validHostBatch(g.batch, host), { gpu: null });
      const check = async (what: string) => {
        const r = await backend.run(plan, batch, { gpu });
        assertClose(toFloat32(r.output), toFloat32(want.output), {
          ...tolerance(g.spec),
          label: `${what} (seed ${seed})`,
        });
        r.release?.();
      };
      await check("first call");
      const kept0 = bindStats().tables_kept;
      await check("second call");
      assert.equal(bindStats().tables_kept, kept0 + 1, "the second call kept the table");
      // A binding that writes another plan's table into that buffer (as a bench launching
      // bound calls itself does) and never reports back: the next call uploads again.
      const b = bindGpuPlan(other, validHostBatch(h.batch, cache), gpu);
      assert.equal(b.uploads[0].data, other.table);
      gpu.device.queue.writeBuffer(b.uploads[0].buffer, 0, other.table);
      b.release();
      await check("after another table");
      assert.equal(bindStats().tables_kept, kept0 + 1, "the buffer's record was forgotten");
      await check("then kept again");
      assert.equal(bindStats().tables_kept, kept0 + 2);
    } finally {
      cache.destroy();
    }
  },
);
