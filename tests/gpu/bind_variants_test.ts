/**
 * The layers of an engine step: one plan (the step's metadata), each layer on its own cache.
 * gpu/plan_bind.ts keeps bound states per call list and cache, so after the first step every
 * layer's call finds its own bindings; one kept state per call list was bound anew on every
 * call as the caches alternated. Every call's output, LSE and cache are checked against
 * CPU_REFERENCE on fresh data.
 */
import assert from "node:assert/strict";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import type { AttentionBackend, GpuContext } from "../../core/types.ts";
import { bindStats, type GpuPlan } from "../../gpu/gpu_plan.ts";
import { BOUND_VARIANTS } from "../../gpu/bound_calls.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { generateBatch, type GeneratedBatch, smallSpec } from "../support/batches.ts";
import { freshSeed, GPU, GPU_TEST } from "./helpers.ts";
import {
  type CachePair as Layer,
  type ReferenceCall,
  referenceCall,
  runChecked,
} from "./checked_calls.ts";

const SPEC = smallSpec({
  requests: [{ query_len: 1, seq_len: 40 }, { query_len: 1, seq_len: 17 }],
});

/** `layers` caches holding the same start bytes, as an engine's layers of one shape. */
async function layersOf(gpu: GpuContext, g: GeneratedBatch, layers: number): Promise<Layer[]> {
  const out: Layer[] = [];
  for (let i = 0; i < layers; i++) {
    out.push({
      gpuCache: await GpuKvCache.fromBytes(gpu, g.cache_spec!, g.key_cache, g.value_cache),
      hostCache: HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache),
    });
  }
  return out;
}

/** One layer's call on `plan` with fresh data, checked. */
async function layerCall(
  gpu: GpuContext,
  plan: GpuPlan,
  g: GeneratedBatch,
  l: Layer,
  what: string,
) {
  await runChecked(gpu, plan, g, l, await referenceCall(g, l), what);
}

/** What one round is given: the plan, the batch, the layers' caches and the round's number. */
type Round = (plan: GpuPlan, g: GeneratedBatch, held: Layer[], round: number) => Promise<void>;

/** `rounds` rounds of calls on one plan over `layers` caches; the bindings made after the first. */
async function boundAfterFirst(layers: number, rounds: number, run: Round): Promise<number> {
  const gpu = GPU!;
  const g = generateBatch(SPEC, freshSeed());
  const held = await layersOf(gpu, g, layers);
  try {
    const plan = await (WEBGPU_FLASH as AttentionBackend<GpuPlan>).plan(
      validHostBatch(g.batch, held[0].gpuCache),
      { gpu },
    );
    let bound0 = 0;
    for (let r = 0; r < rounds; r++) {
      if (r === 1) bound0 = bindStats().bound;
      await run(plan, g, held, r);
    }
    return bindStats().bound - bound0;
  } finally {
    for (const l of held) l.gpuCache.destroy();
  }
}

/** Steps of `layers` calls on one plan, one layer after another. */
function steps(layers: number, count: number): Promise<number> {
  return boundAfterFirst(layers, count, async (plan, g, held, s) => {
    for (let i = 0; i < layers; i++) {
      await layerCall(GPU!, plan, g, held[i], `step ${s}, layer ${i} of ${layers}`);
    }
  });
}

/**
 * Rounds of one call per cache, all in flight at once, each round in another order (a
 * permutation: the service serialises a cache's calls). Every call of a round binds before any
 * ends, each holding its buffers until then.
 */
function concurrentRounds(layers: number, rounds: number): Promise<number> {
  return boundAfterFirst(layers, rounds, async (plan, g, held, round) => {
    const order = held.map((_, i) =>
      round % 2 ? (layers - 1 - i + round) % layers : (i + round) % layers
    );
    const calls: ReferenceCall[] = [];
    for (const i of order) calls.push(await referenceCall(g, held[i]));
    await Promise.all(
      order.map((i, k) =>
        runChecked(GPU!, plan, g, held[i], calls[k], `round ${round}, cache ${i}`)
      ),
    );
  });
}

Deno.test(
  "bound states: each layer of a step finds its own after the first step",
  GPU_TEST,
  async () => {
    assert.equal(await steps(4, 3), 0, "no call bound anew after the first step");
  },
);

Deno.test(
  "bound states: a deep model's layers (more than the states kept per cache) each keep theirs",
  GPU_TEST,
  async () => {
    // One list of kept states per call list took the layers in turn: past its length, every
    // call was bound anew. Per cache, each of these 3 x BOUND_VARIANTS layers finds its own.
    assert.equal(await steps(3 * BOUND_VARIANTS, 2), 0, "no call bound anew in the second step");
  },
);

Deno.test(
  "bound states: concurrent calls on several caches each get their cache's last buffers back",
  GPU_TEST,
  async () => {
    // Six caches' calls in flight at once: from a plain LIFO pool each cache got other calls'
    // last buffers, a combination its kept states did not hold.
    assert.equal(await concurrentRounds(6, 4), 0, "no call bound anew after the first round");
  },
);
