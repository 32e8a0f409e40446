/**
 * vLLM's 13 attention batch specs (vllm_specs.ts: `small_decode` … `medium_encoder_prefill`,
 * the names and per-request `seq_lens`/`query_lens` of vLLM's
 * tests/v1/attention/test_attention_backends.py) through every backend of builtinBackends(),
 * each forced through the selector (`BackendRegistry.select(cfg, { backend })`, as a request
 * naming a backend does). Issue 8: a backend that accepts a configuration runs it; it refuses
 * only for a capability reason the selector reports.
 *
 * Per spec and backend, one of:
 * - accepted: the backend imports the batch's cache, plans and runs the same fresh random
 *   hostile batch as CPU_REFERENCE (tests/support/batches.ts: random block permutation, a
 *   NaN null block and NaN in every slot no request may read); a GPU plan must poison its
 *   output (NaN) before any call writes it, so an element no kernel writes reads NaN, never a
 *   pooled buffer's earlier answer. Then check.ts's `checkRun` against CPU_REFERENCE's float64
 *   run of that batch: no non-finite element, the output within the dtype's tolerance
 *   (`outputTolerance`: float16/bfloat16 atol 1e-2, rtol 1e-2, vLLM's own; float32 atol 1e-4,
 *   rtol 1e-5; the same over fp8 caches), the written cache slots holding the reference's bytes
 *   exactly and every other cache byte unchanged. Any throw from an accepted backend fails: it refused a configuration it declares
 *   it supports. CPU_REFERENCE, forced, is the oracle: its run is the reference every other
 *   backend is compared with (computed once a spec), and is itself checked for finiteness and an
 *   untouched cache outside the written slots (the oracle is cross-checked against a naive
 *   float64 attention in reference_cross_test.ts).
 * - refused: the forced selection's 422 names exactly the reasons `validateConfiguration` gives
 *   for that backend, configuration and device (what auto selection and `GET /v1/backends`
 *   report), and the step's name carries them.
 *
 * Scaled down from vLLM, to stay affordable on a 2-core CI machine with lavapipe: 4 query heads
 * over 2 KV heads (GQA 2) of head size 64, where vLLM's test takes Meta-Llama-3-8B's 32 query /
 * 8 KV heads (GQA 4) of size 128, 16x the multiply-adds. The float64 reference is most of the
 * cost (it runs in CPU_REFERENCE's workers, the next specs' runs started while the GPU backends
 * run the current one): 10-20 s on 2 cores with lavapipe or llvmpipe (GL), plus about 25 s on GL
 * while Mesa's shader cache is cold (llvmpipe's GL compile of WEBGPU_FLASH's non-causal prefill
 * kernel). `VLLM_SPECS_SCALE=full` runs vLLM's heads, for a real GPU and a many-core reference
 * (about 2.5 minutes on a 16-core H100 host). Everything else is vLLM's: the 13 specs' lengths
 * unchanged (up to 4096-token contexts, a 2048-token non-causal encoder prefill), block size 16,
 * a randomly permuted block table, the NHD layout and a cache in the data dtype, float16 by
 * default, causal except the two encoder-only specs. Not here: vLLM's tensor-parallel head
 * splits and fp8 caches (conformance_test.ts runs fp8 on its own shapes).
 *
 * Env: SEED (reproduce a run; printed), VLLM_SPECS_DTYPE (float16, the default; bfloat16 or
 * float32), VLLM_SPECS_SCALE (`full`: vLLM's heads, see above), VLLM_SPECS_FILTER (substring of
 * "BACKEND | spec" to run a subset).
 * @module
 */
import assert from "node:assert/strict";
import { builtinBackends } from "../../backends/index.ts";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { BackendRegistry } from "../../backends/registry.ts";
import type { BackendContext, DType, PlanContract, SelectorConfig } from "../../core/types.ts";
import type { PlannedCall } from "../../gpu/gpu_plan.ts";
import { deriveSeed, generateBatch } from "../support/batches.ts";
import { GPU } from "../support/gpu.ts";
import {
  assertPoisonsFirst,
  checkRun,
  forcedReasons,
  outputTolerance,
  type Run,
  runOn,
  runSeed,
  sharedReferences,
} from "./check.ts";
import { VLLM_SPECS, vllmBatchSpec, type VllmLayer, type VllmSpec } from "./vllm_specs.ts";

const SEED = runSeed();
const DTYPES: readonly DType[] = ["float16", "bfloat16", "float32"];
const DTYPE = (Deno.env.get("VLLM_SPECS_DTYPE") ?? "float16") as DType;
if (!DTYPES.includes(DTYPE)) throw new Error(`VLLM_SPECS_DTYPE: one of ${DTYPES.join(", ")}`);
const FILTER = Deno.env.get("VLLM_SPECS_FILTER") ?? "";
const SCALE = Deno.env.get("VLLM_SPECS_SCALE") === "full" ? "full" : "small";
/** The layer: scaled down (see the module doc), or vLLM's Meta-Llama-3-8B with `full`. */
const LAYER: VllmLayer = SCALE === "full"
  ? { dtype: DTYPE, num_heads: 32, num_kv_heads: 8, head_size: 128 }
  : { dtype: DTYPE, num_heads: 4, num_kv_heads: 2, head_size: 64 };
const opts = { sanitizeOps: false, sanitizeResources: false };

const gpu = GPU;
const ctx: BackendContext = { gpu };
const BACKENDS = builtinBackends();
const registry = new BackendRegistry(BACKENDS, () => gpu);
console.log(
  `vllm specs: seed ${SEED} (rerun: SEED=${SEED}), scale ${SCALE}, ${DTYPE}, ${LAYER.num_heads} q / ` +
    `${LAYER.num_kv_heads} kv heads, head size ${LAYER.head_size}, tolerance ${
      JSON.stringify(outputTolerance(DTYPE, null))
    }, adapter: ${
      gpu
        ? `${gpu.adapter_info.description || gpu.adapter_info.device} (${
          [...gpu.features].join(", ")
        })`
        : "none"
    }, ` +
    `backends: ${registry.names().join(", ")}`,
);

/** The reasons a forced selection of `name` gives for `cfg` ([]: accepted). */
const forcedRefusal = (name: string, cfg: SelectorConfig) =>
  forcedReasons(registry, registry.get(name), cfg, ctx);

/** What each backend did with each spec, for the summary. */
const outcomes = new Map<string, string[]>(registry.names().map((n) => [n, []]));

Deno.test("vllm specs: the 13 specs, by vLLM's names and lengths", () => {
  assert.deepEqual(VLLM_SPECS.map((s) => s.name), [
    "small_decode",
    "small_prefill",
    "mixed_small",
    "medium_decode",
    "medium_prefill",
    "mixed_medium",
    "large_decode",
    "large_prefill",
    "mixed_large",
    "single_decode",
    "single_prefill",
    "small_encoder_prefill",
    "medium_encoder_prefill",
  ]);
  for (const s of VLLM_SPECS) {
    assert.equal(s.seq_lens.length, s.query_lens.length, s.name);
    s.query_lens.forEach((q, i) => {
      assert.ok(q >= 1 && q <= s.seq_lens[i], `${s.name}: request ${i}`);
      if (s.encoder_only) assert.equal(q, s.seq_lens[i], `${s.name}: encoder request ${i}`);
    });
    const spec = vllmBatchSpec(s, LAYER);
    assert.equal(spec.block_size, 16);
    assert.equal(spec.attn_type ?? "decoder", s.encoder_only ? "encoder_only" : "decoder");
    const g = generateBatch({ ...spec, requests: spec.requests.slice(0, 1) }, 1);
    assert.equal(g.batch.layer.causal, !s.encoder_only, `${s.name}: causal`);
  }
  assert.ok(BACKENDS.includes(CPU_REFERENCE), "CPU_REFERENCE is registered");
  assert.ok(BACKENDS.length > 1, "backends besides the reference are registered");
});

/** The backends of a spec the filter keeps, by priority (the GPU ones before the reference). */
const namesOf = (vs: VllmSpec) =>
  registry.names().filter((n) => `${n} | ${vs.name}`.includes(FILTER));
const { batchOf, referenceOf, forget } = sharedReferences((vs: VllmSpec) =>
  generateBatch(vllmBatchSpec(vs, LAYER), deriveSeed(SEED, vs.name))
);

VLLM_SPECS.forEach((vs, i) => {
  const names = namesOf(vs);
  Deno.test({ name: `vllm specs: ${vs.name}`, ignore: names.length === 0, ...opts }, async (t) => {
    const g = batchOf(vs);
    const seedNote = `(spec seed ${g.seed}, run SEED=${SEED})`;
    try {
      // The oracle: CPU_REFERENCE, forced, runs every spec; the next specs' runs start now too,
      // one per worker of its pool.
      assert.deepEqual(forcedRefusal(CPU_REFERENCE.name, g.selector), [], "CPU_REFERENCE refuses");
      const reference = referenceOf(vs);
      const ahead = VLLM_SPECS.slice(i + 1).filter((n) => namesOf(n).length > 0);
      for (const n of ahead.slice(0, CPU_REFERENCE.pool.size)) referenceOf(n);
      for (const name of names) {
        const backend = registry.get(name);
        const full = `${name} | ${vs.name}`;
        // As the selector reports it (validateConfiguration, registry.validate, auto selection).
        const refused = forcedRefusal(name, g.selector);
        if (refused.length > 0) {
          outcomes.get(name)!.push(`${vs.name}: refused (${refused.join("; ")})`);
          await t.step({ name: `${name} — refused: ${refused.join("; ")}`, ignore: true, fn() {} });
          continue;
        }
        // The oracle's own step checks only what comparing it with itself can: finite values and
        // no cache byte changed outside the written slots.
        const step = backend === CPU_REFERENCE
          ? `${name} (the oracle: finite, no stray cache write)`
          : name;
        await t.step(step, async () => {
          const started = performance.now();
          let ms = 0;
          try {
            let got: Run;
            if (backend === CPU_REFERENCE) got = await reference;
            else {
              got = await runOn(backend, g, ctx, (p) => assertPoisonsFirst(p, g.batch.return_lse));
              ms = performance.now() - started;
            }
            checkRun(g, got, await reference);
          } catch (e) {
            if (e instanceof Error) {
              e.message = `${full} (${DTYPE}), accepted when forced: ${e.message} ${seedNote}`;
            }
            throw e;
          }
          outcomes.get(name)!.push(`${vs.name}: ok${ms ? ` (run ${ms.toFixed(0)} ms)` : ""}`);
        });
      }
    } finally {
      forget(vs);
    }
  });
});

Deno.test({
  name: "vllm specs: a GPU plan that writes its output or LSE before poisoning it fails",
  ignore: gpu === null,
  ...opts,
}, async () => {
  const spec = { ...vllmBatchSpec(VLLM_SPECS[0], LAYER), return_lse: true };
  const g = generateBatch(spec, deriveSeed(SEED, "mutant"));
  let checked = 0;
  for (const name of registry.names()) {
    const backend = registry.get(name);
    if (backend === CPU_REFERENCE || forcedRefusal(name, g.selector).length > 0) continue;
    await runOn(backend, g, ctx, (plan) => {
      assertPoisonsFirst(plan, true);
      const calls = (plan as PlanContract & { calls: PlannedCall[] }).calls;
      const rest = calls.filter((c) => c.name !== "poison");
      for (const io of ["out", "lse"]) {
        const lse = io === "lse";
        const isPoison = (c: PlannedCall) =>
          c.name === "poison" && "io" in c.bind.dst && c.bind.dst.io === io;
        const poison = calls.filter(isPoison);
        assert.equal(poison.length, 1, `one poisoning of ${io}`);
        // No poisoning at all; the poisoning moved after the kernels.
        assert.throws(() => assertPoisonsFirst({ ...plan, calls: rest }, lse), /not its poisoning/);
        const late = [...calls.filter((c) => !isPoison(c)), ...poison];
        assert.throws(
          () => assertPoisonsFirst({ ...plan, calls: late }, lse),
          new RegExp(`binding ${io} is .*, not its poisoning`),
        );
      }
      checked++;
    });
  }
  assert.ok(checked > 0, "no GPU backend accepted small_decode");
});

Deno.test("vllm specs: summary", () => {
  for (const [name, lines] of outcomes) {
    console.log(`  ${name}: ${lines.length} specs\n    ${lines.join("\n    ")}`);
  }
  // Unfiltered, every backend runs most of vLLM's specs (a regression that refused them all
  // would pass every step).
  if (!FILTER) {
    for (const [name, lines] of outcomes) {
      const ok = lines.filter((l) => /: ok\b/.test(l)).length;
      assert.ok(ok >= lines.length / 2, `${name} ran ${ok} of ${lines.length} specs`);
    }
  }
});
