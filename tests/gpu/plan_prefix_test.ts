/**
 * The shape-only part of a GPU plan (gpu/plan_prefix.ts: cache write, poisoning) is built once
 * per shape and replayed: a second plan of the same shape, with other slots, block table and
 * data, reuses the first plan's prefix calls and writes its own slot_mapping into the slot
 * section, and its run matches CPU_REFERENCE (output, LSE and the cache it wrote).
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { WEBGPU_DECODE } from "../../backends/webgpu_decode.ts";
import { toFloat32 } from "../../core/data.ts";
import type { AttentionBackend } from "../../core/types.ts";
import type { GpuPlan } from "../../gpu/gpu_plan.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { generateBatch, smallSpec } from "../support/batches.ts";
import { assertClose } from "../support/compare.ts";
import { tolerance } from "../support/backend_check.ts";
import { freshSeed, GPU, GPU_TEST } from "./helpers.ts";

const opts = GPU_TEST;

const SPEC = smallSpec({
  requests: [{ query_len: 1, seq_len: 37 }, { query_len: 2, seq_len: 20 }],
});

Deno.test(
  "plan prefix: a second plan of a shape replays the first's, with its own slots",
  opts,
  async () => {
    const gpu = GPU!, b = WEBGPU_DECODE as AttentionBackend<GpuPlan>;
    // Two fresh batches whose slots differ (two random draws of this small spec may coincide).
    const slotsOf = (seed: number) => generateBatch(SPEC, seed).batch.metadata.slot_mapping;
    const seeds = [freshSeed()];
    do seeds[1] = freshSeed(); while (
      slotsOf(seeds[1]).join() === slotsOf(seeds[0]).join()
    );
    const plans: GpuPlan[] = [];
    const slotMaps: Int32Array[] = [];
    for (const seed of seeds) {
      const g = generateBatch(SPEC, seed);
      const gpuCache = await GpuKvCache.fromBytes(gpu, g.cache_spec!, g.key_cache, g.value_cache);
      const host = HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache);
      try {
        const want = await CPU_REFERENCE.run({}, validHostBatch(g.batch, host), { gpu: null });
        const batch = validHostBatch(g.batch, gpuCache);
        const plan = await b.plan(batch, { gpu });
        plans.push(plan);
        const cw = plan.calls.find((c) => c.name === "cache_write")!;
        const slots = (cw.bind.slots as { table: { offset: number } }).table.offset;
        const md = batch.metadata.slot_mapping;
        slotMaps.push(md.slice());
        assert.deepEqual(
          new Int32Array(plan.table.buffer, slots, md.length),
          md,
          `the slot section holds this batch's slot_mapping (seed ${seed})`,
        );
        const got = await b.run(plan, batch, { gpu });
        const what = `seed ${seed}`;
        assertClose(toFloat32(got.output), toFloat32(want.output), {
          ...tolerance(g.spec),
          label: `output (${what})`,
        });
        assertClose(got.lse!, want.lse!, { atol: 2e-4, rtol: 1e-5, label: `lse (${what})` });
        const [x, y] = await Promise.all([gpuCache.read(), host.read()]);
        assert.deepEqual(x.key, y.key, `key cache (${what})`);
        assert.deepEqual(x.value, y.value, `value cache (${what})`);
      } finally {
        gpuCache.destroy();
      }
    }
    const prefix = (p: GpuPlan) =>
      p.calls.filter((c) => c.name === "cache_write" || c.name === "poison");
    assert.notDeepEqual(slotMaps[0], slotMaps[1], "the two batches write other slots");
    const [a, c] = plans.map(prefix);
    assert.equal(a.length, 3);
    a.forEach((call, i) => assert.equal(c[i], call, `prefix call ${call.name} was rebuilt`));
  },
);
