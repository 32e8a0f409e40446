/**
 * CPU_REFERENCE: the float64 oracle every other backend is checked against. It supports
 * every configuration the contract defines, needs no device, keeps its caches in host memory
 * ({@link HostKvCache}) and runs core/reference.ts: write the new K/V, then attend.
 * Slow by design; priority 100 so auto selection prefers any device backend.
 * @module
 */
import { ServiceError } from "../core/errors.ts";
import { HostKvCache } from "../core/host_cache.ts";
import { attend, checkBatch, kvFromCall, writeKv } from "../core/reference.ts";
import {
  type AttentionBackend,
  ATTN_TYPES,
  DTYPES,
  type ForwardBatch,
  type ForwardResult,
  KV_CACHE_DTYPES,
  KV_LAYOUTS,
} from "../core/types.ts";
import { capabilities } from "./capabilities_base.ts";

/** What {@link CPU_REFERENCE}'s plan holds: the cache to use (null for encoder types). */
export interface CpuReferencePlan {
  cache: HostKvCache | null;
}

function plan(batch: ForwardBatch): CpuReferencePlan {
  const c = batch.cache;
  if (c !== null && !(c instanceof HostKvCache)) {
    throw new ServiceError(
      `CPU_REFERENCE needs a host KV cache, got one with storage "${c.storage}"`,
      { status: 422, code: "cache_storage_mismatch", extra: { storage: c.storage } },
    );
  }
  checkBatch(batch, c);
  return { cache: c };
}

function run(p: CpuReferencePlan, batch: ForwardBatch): Promise<ForwardResult> {
  // An executor's throw becomes a rejection, so callers see errors the async way.
  return new Promise((resolve) => resolve(compute(p, batch)));
}

function compute(p: CpuReferencePlan, batch: ForwardBatch): ForwardResult {
  const t0 = performance.now();
  if (p.cache && !kvFromCall(batch)) writeKv(batch, p.cache);
  const t1 = performance.now();
  const { output, lse } = attend(batch, kvFromCall(batch) ? null : p.cache);
  const t2 = performance.now();
  return {
    output,
    lse: batch.return_lse ? lse : null,
    timings: { write: t1 - t0, attend: t2 - t1 },
  };
}

/** The CPU float64 reference backend. */
export const CPU_REFERENCE: AttentionBackend<CpuReferencePlan> = {
  name: "CPU_REFERENCE",
  priority: 100,
  description: "Float64 host reference (the oracle other backends are checked against); slow.",
  capabilities: capabilities({
    dtypes: [...DTYPES],
    kv_cache_dtypes: [...KV_CACHE_DTYPES],
    kv_cache_layouts: [...KV_LAYOUTS],
    attn_types: [...ATTN_TYPES],
    sinks: true,
    sliding_window: true,
    alibi: true,
    logits_soft_cap: true,
    non_causal: true,
    batch_invariant: true,
    lse: true,
  }),
  requires: { needs_device: false, features: [], limits: {} },
  cache_storage: "host",
  createCache: (spec) => HostKvCache.create(spec),
  importCache: (spec, key, value) => HostKvCache.fromBytes(spec, key, value),
  plan,
  run,
};
