/**
 * The conformance checks shared by the conformance tests (conformance_test.ts,
 * vllm_specs_test.ts): the tolerances by dtype, {@link runOn} (one backend on one generated
 * batch, its cache imported from the batch's initial bytes and read back after the call) and
 * {@link checkRun} (a run against CPU_REFERENCE's run of the same batch: output and lse within
 * the data dtype's tolerance, no NaN, written cache slots holding the reference's bytes exactly,
 * as the cache writer encodes deterministically, and every other cache byte untouched). Also the run seed every conformance test prints ({@link runSeed}), and
 * for tests that force each backend through the selector: {@link forcedReasons} (a forced
 * selection's refusal, held equal to what the selector reports) and {@link assertPoisonsFirst}
 * (a GPU plan poisons its output before any call writes it).
 * @module
 */
import assert from "node:assert/strict";
import { bytesPerElement, decode } from "../../core/dtype.ts";
import type {
  AttentionBackend,
  BackendContext,
  DType,
  KvCache,
  PlanContract,
  SelectorConfig,
  StorageDType,
} from "../../core/types.ts";
import { toFloat32 } from "../../core/data.ts";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { validateConfiguration } from "../../backends/capabilities.ts";
import type { BackendRegistry } from "../../backends/registry.ts";
import { NoValidBackendError } from "../../core/errors.ts";
import type { PlannedCall } from "../../gpu/gpu_plan.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { cacheIndex, type GeneratedBatch } from "../support/batches.ts";
import { assertClose, firstNonFinite, unravel } from "../support/compare.ts";

/** The run's seed: `SEED` from the environment (to reproduce a run), else a fresh one. */
export function runSeed(): number {
  return Deno.env.get("SEED") !== undefined
    ? Number(Deno.env.get("SEED")) >>> 0
    : crypto.getRandomValues(new Uint32Array(1))[0];
}

/**
 * Output/lse tolerance by the data dtype. An fp8 cache needs no more: the reference reads the
 * same fp8 values the backend does (before, any fp8 cache allowed atol 6e-2 and rtol 1e-1, so
 * outputs 7% off passed, float32 data included).
 */
export function outputTolerance(dtype: DType, _storage?: StorageDType | null) {
  return dtype === "float32" ? { atol: 1e-4, rtol: 1e-5 } : { atol: 1e-2, rtol: 1e-2 };
}

/** One backend's results on one case (the output decoded to float32). */
export interface Run {
  result: { output: Float32Array; lse: Float32Array | null };
  after: { key: Uint8Array; value: Uint8Array } | null;
}

/**
 * Imports the case's initial cache into the backend, plans, runs, reads the cache back.
 * `onPlan` sees the plan before it runs (e.g. to check what it dispatches).
 */
export async function runOn(
  b: AttentionBackend,
  g: GeneratedBatch,
  ctx: BackendContext,
  onPlan?: (plan: PlanContract) => void,
): Promise<Run> {
  let cache: KvCache | null = null;
  if (g.cache_spec) {
    cache = await b.importCache(g.cache_spec, g.key_cache.slice(), g.value_cache.slice(), ctx);
  }
  try {
    const batch = validHostBatch(g.batch, cache);
    const plan = await b.plan(batch, ctx);
    try {
      onPlan?.(plan);
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

/**
 * Why `backend`, forced by name through `registry` (as a request naming it is), refuses `cfg`
 * on `ctx`'s device ([]: it accepts). Asserts that a refusal is the 422 naming that backend
 * first, then every other with the selector's reasons for it, and that its own reasons are
 * exactly what the selector reports for it: `validateConfiguration`,
 * `registry.validate`, and auto selection's reasons for the backends it passed over.
 */
export function forcedReasons(
  registry: BackendRegistry,
  backend: AttentionBackend,
  cfg: SelectorConfig,
  ctx: BackendContext,
): string[] {
  const name = backend.name;
  let reasons: string[] = [];
  try {
    assert.equal(registry.select(cfg, { backend: name }).backend.name, name);
  } catch (e) {
    if (!(e instanceof NoValidBackendError)) throw e;
    // Every backend's reasons, the forced one's first (the contract's 422), each as the
    // selector reports it for that backend.
    const all = e.reasons ?? {};
    assert.deepEqual(
      Object.keys(all),
      [name, ...registry.names().filter((n) => n !== name)],
      `a forced refusal names ${name} first, then every other backend`,
    );
    for (const other of registry.list()) {
      if (other.name !== name) {
        assert.deepEqual(all[other.name], registry.validate(other, cfg), `${other.name}'s reasons`);
      }
    }
    reasons = all[name];
    assert.ok(reasons.length > 0, `${name} refused without a reason: ${e.message}`);
  }
  const say = `${name}: the forced refusal differs from the selector's reasons for the backend`;
  assert.deepEqual(reasons, validateConfiguration(backend, cfg, ctx), say);
  assert.deepEqual(reasons, registry.validate(backend, cfg), say);
  let auto: Record<string, string[]>;
  try {
    auto = registry.select(cfg).rejected;
  } catch (e) {
    if (!(e instanceof NoValidBackendError)) throw e;
    auto = e.reasons ?? {};
  }
  if (name in auto) assert.deepEqual(reasons, auto[name], `${name}: auto selection's reasons`);
  return reasons;
}

/** A GPU plan poisons the output (and LSE when asked) before any call writes them. */
export function assertPoisonsFirst(
  plan: PlanContract & { calls?: PlannedCall[] },
  lse: boolean,
): void {
  const calls = plan.calls;
  if (calls === undefined) return; // a host plan: the output is a fresh array every call
  for (const io of lse ? ["out", "lse"] : ["out"]) {
    const binds = (c: PlannedCall) => Object.values(c.bind).some((r) => "io" in r && r.io === io);
    const first = calls.findIndex(binds);
    assert.ok(first >= 0, `no call of the plan writes ${io}`);
    assert.equal(
      calls[first].name,
      "poison",
      `the first call binding ${io} is ${calls[first].name}, not its poisoning ` +
        `(calls: ${calls.map((c) => c.name).join(", ")})`,
    );
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

/** Written slots equal to the reference's bytes; every other byte equal to the initial bytes. */
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
  for (let e = 0; e < written.length; e++) {
    if (!written[e]) continue;
    for (let k = 0; k < eb; k++) {
      if (got[e * eb + k] !== ref[e * eb + k]) {
        const at = unravel(e, g.cache_shape);
        throw new assert.AssertionError({
          message: `${label}${JSON.stringify(at)} (a written slot) holds ${
            decode(st, got.subarray(e * eb, e * eb + eb))[0]
          }, the reference wrote ${decode(st, ref.subarray(e * eb, e * eb + eb))[0]} (${st})`,
        });
      }
    }
  }
}

/**
 * Each key's generated batch and CPU_REFERENCE's run of it (on no device), each made once and
 * shared by every backend's check: `referenceOf` starts the run in the oracle's workers, so a test
 * can start the next keys' runs while the GPU backends work on this one. A prefetched run's
 * failure is left for its own key's test to report; `forget` lets a key's memory go once its
 * test is done.
 */
export function sharedReferences<K>(generate: (k: K) => GeneratedBatch): {
  batchOf(k: K): GeneratedBatch;
  referenceOf(k: K): Promise<Run>;
  forget(k: K): void;
} {
  const batches = new Map<K, GeneratedBatch>(), runs = new Map<K, Promise<Run>>();
  const batchOf = (k: K) => {
    let g = batches.get(k);
    if (!g) batches.set(k, g = generate(k));
    return g;
  };
  const referenceOf = (k: K) => {
    let r = runs.get(k);
    if (!r) {
      runs.set(k, r = runOn(CPU_REFERENCE, batchOf(k), { gpu: null }));
      r.catch(() => {});
    }
    return r;
  };
  const forget = (k: K) => {
    batches.delete(k);
    runs.delete(k);
  };
  return { batchOf, referenceOf, forget };
}
