/**
 * What the forward path reuses between calls, and that reuse never binds stale data: bind
 * groups are cached by the buffers they bind and timestamp query sets are pooled, so calls
 * after the first on a held cache create neither (before, every call created a bind group per
 * dispatch and a query set); a plan owns no GPU buffer (its table is written by each call into
 * a pooled buffer), so new plans in a steady state create no buffer either. Every call's
 * output and cache are checked against CPU_REFERENCE on fresh data, with calls on two caches
 * of different shapes interleaved. A launch records its calls in one compute pass each, or
 * all in one (`timing: "total"`, the forward path's default), and reports device times to
 * match.
 */
import assert from "node:assert/strict";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import type { GpuContext } from "../../core/types.ts";
import { bindGroupsOf } from "../../gpu/bind_groups.ts";
import { FILL } from "../../gpu/fill.ts";
import { getKernel, packUniforms } from "../../gpu/kernel.ts";
import { launch } from "../../gpu/launch.ts";
import { poolOf } from "../../gpu/buffer_pool.ts";
import { bindStats } from "../../gpu/gpu_plan.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import {
  type BatchSpec,
  generateBatch,
  type GeneratedBatch,
  smallSpec,
} from "../support/batches.ts";
import { freshSeed, GPU, GPU_TEST } from "./helpers.ts";
import { type CachePair, referenceCall, runChecked } from "./checked_calls.ts";

const opts = GPU_TEST;

const SPECS: BatchSpec[] = [
  smallSpec({ requests: [{ query_len: 1, seq_len: 40 }, { query_len: 1, seq_len: 17 }] }),
  smallSpec({
    dtype: "float32",
    layout: "HND",
    head_size: 128,
    num_heads: 8,
    requests: [{ query_len: 3, seq_len: 20 }, { query_len: 1, seq_len: 33 }],
  }),
];

interface Held extends CachePair {
  g: GeneratedBatch;
}

/** One call on both caches; the GPU's output, LSE and cache must match the reference's. */
async function checkedCall(gpu: GpuContext, h: Held, seed: number): Promise<void> {
  const call = await referenceCall(h.g, h, seed);
  await runChecked(gpu, null, h.g, h, call, `${h.g.spec.dtype} call, seed ${seed}`);
}

Deno.test("reuse: steady-state calls create no bind group, query set or buffer", opts, async () => {
  const gpu = GPU!, pool = poolOf(gpu), groups = bindGroupsOf(gpu.device);
  const held: Held[] = [];
  try {
    for (const s of SPECS) {
      const g = generateBatch(s, freshSeed());
      held.push({
        g,
        gpuCache: await GpuKvCache.fromBytes(gpu, g.cache_spec!, g.key_cache, g.value_cache),
        hostCache: HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache),
      });
    }
    for (const h of held) await checkedCall(gpu, h, freshSeed()); // warm: compile, fill pools
    const g0 = groups.stats(), p0 = pool.stats(), b0 = bindStats();
    for (let i = 0; i < 3; i++) for (const h of held) await checkedCall(gpu, h, freshSeed());
    const g1 = groups.stats(), p1 = pool.stats(), b1 = bindStats();
    assert.equal(g1.created, g0.created, "no bind group created after the warm-up calls");
    // Reused from the cache, or carried by a plan's calls bound again to the same buffers.
    const reused = g1.reused - g0.reused + b1.reused_groups - b0.reused_groups;
    assert.ok(reused >= 6 * 4, `bind groups reused (${reused})`);
    assert.equal(p1.query_sets_created, p0.query_sets_created, "no query set created");
    assert.equal(p1.created, p0.created, "no buffer created: plans own none");
    assert.equal(p1.in_use, 0, "every pooled buffer was released");
  } finally {
    for (const h of held) h.gpuCache.destroy();
  }
});

Deno.test(
  "launch: one pass for all calls or one each; each call's writes land",
  opts,
  async (t) => {
    const gpu = GPU!, dev = gpu.device;
    const kernel = await getKernel(gpu, FILL, { wg: 64 });
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC;
    const bufs = [dev.createBuffer({ size: 256, usage }), dev.createBuffer({ size: 256, usage })];
    const params = [7, 9].map((pattern) => {
      const p = dev.createBuffer({
        size: 16,
        usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
      });
      dev.queue.writeBuffer(p, 0, packUniforms(FILL, { n_words: 64, pattern, nwg_x: 1 }));
      return p;
    });
    const calls = bufs.map((b, i) => ({
      name: `fill${i}`,
      kernel,
      bind: { P: params[i], dst: b },
      grid: [1, 1] as const,
    }));
    const timed = gpu.features.has("timestamp-query");
    /** The device-time keys each mode reported, and the keys it must report when timed. */
    const reported: [string, string[], string[]][] = [];
    try {
      for (const timing of ["calls", "total"] as const) {
        const r = await launch(gpu, {
          label: "modes",
          uploads: [],
          calls,
          reads: bufs.map((b) => ({ buffer: b, bytes: 256 })),
          timing,
        });
        r.parts.forEach((p, i) => {
          const w = new Uint32Array(p.buffer, p.byteOffset, 64);
          assert.ok(w.every((x) => x === [7, 9][i]), `${timing}: buffer ${i}`);
        });
        const keys = Object.keys(r.gpu).sort();
        for (const k of keys) {
          assert.ok(Number.isFinite(r.gpu[k]) && r.gpu[k] >= 0, `${timing}: ${k} ${r.gpu[k]} ms`);
        }
        if (!timed) assert.deepEqual(keys, [], `${timing}: no device times without timestamps`);
        reported.push([timing, keys, timing === "calls" ? ["fill0", "fill1", "gpu"] : ["gpu"]]);
      }
    } finally {
      for (const b of [...bufs, ...params]) b.destroy();
    }
    // A software adapter may write zero timestamps: then nothing is reported at all, in either
    // mode; an adapter that writes them reports every key of both modes, never a partial set.
    const none = reported.every(([, keys]) => keys.length === 0);
    const seen = reported.map(([m, keys]) => `${m}: [${keys}]`).join(", ");
    if (timed && none) {
      console.log(
        `note: ${gpu.adapter_info.description}: timestamp-query wrote no timestamps ` +
          `(${seen}); the device-time keys are not checked`,
      );
    }
    await t.step({
      name: "device-time keys: every call's and the launch's, in both modes",
      ignore: !timed || none,
      fn: () => {
        for (const [m, keys, want] of reported) assert.deepEqual(keys, want, `${m} (${seen})`);
      },
    });
  },
);
