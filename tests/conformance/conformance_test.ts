/**
 * Backend conformance: every backend in builtinBackends() (the reference excepted) runs
 * every case of cases.ts, unchanged, and must match CPU_REFERENCE on the same fresh random
 * batch: the output (and lse when asked) within the dtype's tolerance, no NaN anywhere, and
 * the cache after the write (read back through `cache.read()`): written slots close to the
 * reference's, every other byte (-1 padding slots, the NaN null block, unused slots)
 * untouched. A case a backend cannot run is skipped only when the registry's
 * `validateConfiguration` says so, and the step's name carries those reasons.
 *
 * Env: SEED (reproduce a run; the seed is printed), CONFORMANCE_SCALE=big (larger shapes),
 * CONFORMANCE_FILTER (substring of "BACKEND | case name" to run a subset).
 * @module
 */
import assert from "node:assert/strict";
import { builtinBackends } from "../../backends/index.ts";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { validateConfiguration } from "../../backends/capabilities.ts";
import { GPU } from "../support/gpu.ts";
import type { BackendContext } from "../../core/types.ts";
import { cacheIndex, deriveSeed, generateBatch, type GeneratedBatch } from "../support/batches.ts";
import { checkRun, type Run, runOn, runSeed } from "./check.ts";
import { conformanceCases } from "./cases.ts";

const SEED = runSeed();
const SCALE = Deno.env.get("CONFORMANCE_SCALE") === "big" ? "big" : "small";
const FILTER = Deno.env.get("CONFORMANCE_FILTER") ?? "";
const opts = { sanitizeOps: false, sanitizeResources: false };

const CASES = conformanceCases(SCALE);
const gpu = GPU;
const ctx: BackendContext = { gpu };
const refCtx: BackendContext = { gpu: null };
const BACKENDS = builtinBackends().filter((b) => b !== CPU_REFERENCE);
console.log(
  `conformance: seed ${SEED} (rerun: SEED=${SEED}), scale ${SCALE}, ${CASES.length} cases, ` +
    `adapter: ${gpu ? gpu.adapter_info.description || gpu.adapter_info.device : "none"}, ` +
    `backends: ${BACKENDS.map((b) => b.name).join(", ") || "(none)"}`,
);

const generated = new Map<string, GeneratedBatch>();
const references = new Map<string, Run>();
function gen(name: string, spec: (typeof CASES)[number]["spec"]): GeneratedBatch {
  let g = generated.get(name);
  if (!g) generated.set(name, g = generateBatch(spec, deriveSeed(SEED, name)));
  return g;
}
async function reference(name: string, g: GeneratedBatch): Promise<Run> {
  let r = references.get(name);
  if (!r) {
    const reasons = validateConfiguration(CPU_REFERENCE, g.selector, refCtx);
    assert.deepEqual(reasons, [], `CPU_REFERENCE rejects case "${name}": ${reasons.join("; ")}`);
    references.set(name, r = await runOn(CPU_REFERENCE, g, refCtx));
  }
  return r;
}

Deno.test("conformance: there are backends besides the reference to test", () => {
  assert.ok(BACKENDS.length > 0, "builtinBackends() lists only CPU_REFERENCE");
  assert.ok(builtinBackends().includes(CPU_REFERENCE), "CPU_REFERENCE is not in builtinBackends()");
});

for (const backend of BACKENDS) {
  Deno.test({ name: `conformance: ${backend.name} vs CPU_REFERENCE`, ...opts }, async (t) => {
    let ran = 0, skipped = 0;
    for (const cc of CASES) {
      const full = `${backend.name} | ${cc.name}`;
      if (FILTER && !full.includes(FILTER)) continue;
      const g = gen(cc.name, cc.spec);
      const reasons = validateConfiguration(backend, g.selector, ctx);
      if (reasons.length > 0) {
        skipped++;
        await t.step({
          name: `${cc.name} — skipped: ${reasons.join("; ")}`,
          ignore: true,
          fn() {},
        });
        continue;
      }
      ran++;
      await t.step(cc.name, async () => {
        const seedNote = `(case seed ${g.seed}, run SEED=${SEED})`;
        const ref = await reference(cc.name, g);
        try {
          checkRun(g, await runOn(backend, g, ctx), ref);
        } catch (e) {
          if (e instanceof Error) e.message = `${full}: ${e.message} ${seedNote}`;
          throw e;
        }
      });
    }
    console.log(`  ${backend.name}: ${ran} cases run, ${skipped} skipped`);
    // A capability regression that refused every case (or most) would otherwise pass with its
    // steps ignored: every backend here declares most of the cases' configurations.
    if (!FILTER) {
      assert.ok(
        ran >= CASES.length / 2,
        `${backend.name} ran ${ran} of ${CASES.length} cases (${skipped} refused): at least half`,
      );
    }
  });
}

Deno.test({ name: "conformance: the checker catches broken results", ...opts }, async () => {
  const cc = CASES.find((c) => c.name.startsWith("decode f16 padding"))!;
  const g = generateBatch(cc.spec, deriveSeed(SEED, "mutants"));
  const ref = await runOn(CPU_REFERENCE, g, refCtx);
  checkRun(g, ref, ref); // the reference passes against itself
  const mutate = (f: (r: Run) => void): Run => {
    const m: Run = structuredClone(ref);
    f(m);
    return m;
  };
  const D = g.batch.layer.head_size, bs = g.cache_spec!.block_size;
  // An output element off by 3x its tolerance.
  assert.throws(
    () =>
      checkRun(
        g,
        mutate((m) => (m.result.output[5] += 3e-2 + 3e-2 * Math.abs(m.result.output[5]))),
        ref,
      ),
    /output/,
  );
  // A NaN in the output.
  assert.throws(() => checkRun(g, mutate((m) => (m.result.output[0] = NaN)), ref), /not finite/);
  // A -1 padding token's K written anyway (its slot gets a different value).
  assert.ok(g.padding_slots.length > 0, "the mutant case has a padding token");
  const padSlot = g.padding_slots[0];
  const at = cacheIndex(
    g.cache_spec!.layout,
    bs,
    g.cache_spec!.num_kv_heads,
    D,
    Math.floor(padSlot / bs),
    padSlot % bs,
    0,
  ) * 2;
  assert.throws(
    () => checkRun(g, mutate((m) => (m.after!.key[at] ^= 0x55)), ref),
    /a -1 padding token's slot/,
  );
  // Block 0 (the null block) overwritten.
  assert.throws(() => checkRun(g, mutate((m) => (m.after!.value[3] = 0)), ref), /null block 0/);
});
