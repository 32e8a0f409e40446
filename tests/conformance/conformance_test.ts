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
import { bytesPerElement, decode } from "../../core/dtype.ts";
import type {
  AttentionBackend,
  BackendContext,
  DType,
  KvCache,
  StorageDType,
} from "../../core/types.ts";
import { toFloat32 } from "../../core/data.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { cacheIndex, deriveSeed, generateBatch, type GeneratedBatch } from "../support/batches.ts";
import { assertClose, firstNonFinite, unravel } from "../support/compare.ts";
import { conformanceCases } from "./cases.ts";

const SEED = Deno.env.get("SEED") !== undefined
  ? Number(Deno.env.get("SEED")) >>> 0
  : crypto.getRandomValues(new Uint32Array(1))[0];
const SCALE = Deno.env.get("CONFORMANCE_SCALE") === "big" ? "big" : "small";
const FILTER = Deno.env.get("CONFORMANCE_FILTER") ?? "";
const opts = { sanitizeOps: false, sanitizeResources: false };

/** Output/lse tolerance: fp8 KV first, then the data dtype. */
export function outputTolerance(dtype: DType, storage: StorageDType | null) {
  if (storage === "fp8_e4m3" || storage === "fp8_e5m2") return { atol: 6e-2, rtol: 1e-1 };
  return dtype === "float32" ? { atol: 1e-4, rtol: 1e-5 } : { atol: 1e-2, rtol: 1e-2 };
}
/** Cache tolerance by storage dtype. */
export function cacheTolerance(storage: StorageDType) {
  if (storage === "fp8_e4m3" || storage === "fp8_e5m2") return { atol: 6e-2, rtol: 1e-1 };
  return storage === "float32" ? { atol: 1e-4, rtol: 1e-5 } : { atol: 1e-2, rtol: 1e-2 };
}

/** One backend's results on one case (the output decoded to float32). */
interface Run {
  result: { output: Float32Array; lse: Float32Array | null };
  after: { key: Uint8Array; value: Uint8Array } | null;
}

/** Imports the case's initial cache into the backend, plans, runs, reads the cache back. */
async function runOn(b: AttentionBackend, g: GeneratedBatch, ctx: BackendContext): Promise<Run> {
  let cache: KvCache | null = null;
  if (g.cache_spec) {
    cache = await b.importCache(g.cache_spec, g.key_cache.slice(), g.value_cache.slice(), ctx);
  }
  try {
    const batch = validHostBatch(g.batch, cache);
    const plan = await b.plan(batch, ctx);
    try {
      const r = await b.run(plan, batch, ctx);
      assert.equal(r.output.dtype, g.batch.dtype, "the output comes back in the batch dtype");
      const result = { output: toFloat32(r.output).slice(), lse: r.lse };
      return { result, after: cache ? await cache.read() : null };
    } finally {
      b.disposePlan?.(plan);
    }
  } finally {
    cache?.destroy();
  }
}

/** Checks a run against the reference's run of the same batch; throws with a located message. */
export function checkRun(g: GeneratedBatch, got: Run, ref: Run): void {
  const { num_tokens: T, layer } = g.batch;
  const H = layer.num_heads, D = layer.head_size;
  const out = got.result.output;
  assert.ok(out, "run() returned no output");
  assert.equal(out.length, T * H * D, `output has ${out.length} elements, expected ${T}x${H}x${D}`);
  const bad = firstNonFinite(out);
  assert.equal(bad, -1, `output[${unravel(bad, g.output_shape)}] is ${out[bad]} (not finite)`);
  const tol = outputTolerance(g.batch.dtype, g.storage);
  assertClose(out, ref.result.output, { ...tol, shape: g.output_shape, label: "output" });
  if (g.batch.return_lse) {
    const lse = got.result.lse;
    assert.ok(lse, "return_lse was asked but lse is null");
    assert.equal(lse.length, H * T, `lse has ${lse.length} elements, expected ${H}x${T}`);
    const badL = firstNonFinite(lse);
    assert.equal(badL, -1, `lse[${unravel(badL, [H, T])}] is ${lse[badL]} (not finite)`);
    assertClose(lse, ref.result.lse!, { ...tol, shape: [H, T], label: "lse [head, token]" });
  }
  if (g.cache_spec) {
    assert.ok(got.after && ref.after, "cache.read() returned nothing");
    checkCache(g, "key_cache", g.key_cache, got.after.key, ref.after.key);
    checkCache(g, "value_cache", g.value_cache, got.after.value, ref.after.value);
  }
}

/** Written slots close to the reference; every other byte equal to the initial bytes. */
function checkCache(
  g: GeneratedBatch,
  label: string,
  initial: Uint8Array,
  got: Uint8Array,
  ref: Uint8Array,
): void {
  const s = g.cache_spec!, st = g.storage!;
  const { block_size: bs, num_kv_heads: Hkv, head_size: D } = s;
  assert.equal(
    got.length,
    initial.length,
    `${label}: read() gave ${got.length} bytes, expected ${initial.length}`,
  );
  const eb = bytesPerElement(st);
  const written = new Uint8Array(initial.length / eb); // per element
  for (const slot of g.written_slots) {
    const b = Math.floor(slot / bs), o = slot % bs;
    for (let h = 0; h < Hkv; h++) {
      written.fill(
        1,
        cacheIndex(s.layout, bs, Hkv, D, b, o, h),
        cacheIndex(s.layout, bs, Hkv, D, b, o, h) + D,
      );
    }
  }
  for (let e = 0; e < written.length; e++) {
    if (written[e]) continue;
    for (let k = 0; k < eb; k++) {
      if (got[e * eb + k] !== initial[e * eb + k]) {
        const at = unravel(e, g.cache_shape);
        const slot = s.layout === "NHD" ? at[0] * bs + at[1] : at[0] * bs + at[2];
        const padded = g.padding_slots.includes(slot);
        throw new assert.AssertionError({
          message: `${label}${JSON.stringify(at)} (slot ${slot}${
            at[0] === 0 ? ", null block 0" : ""
          }${padded ? ", a -1 padding token's slot" : ""}) changed but no token writes it: ${
            decode(st, initial.subarray(e * eb, e * eb + eb))[0]
          } -> ${decode(st, got.subarray(e * eb, e * eb + eb))[0]}`,
        });
      }
    }
  }
  const pick = (bytes: Uint8Array) => {
    const all = decode(st, bytes);
    const out: number[] = [];
    for (let e = 0; e < written.length; e++) if (written[e]) out.push(all[e]);
    return out;
  };
  assertClose(pick(got), pick(ref), { ...cacheTolerance(st), label: `${label} written slots` });
}

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
