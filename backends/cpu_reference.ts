/**
 * CPU_REFERENCE: the float64 oracle every other backend is checked against. It supports
 * every configuration the contract defines, needs no device, keeps its caches in host memory
 * ({@link HostKvCache}) and runs core/reference.ts: write the new K/V, then attend.
 * Slow by design; priority 100 so auto selection prefers any device backend.
 * @module
 */
import { fromFloats, hostBatch } from "../core/data.ts";
import { ClientClosedError, ServiceError } from "../core/errors.ts";
import { HostKvCache } from "../core/host_cache.ts";
import { attend, kvFromCall, writeKv } from "../core/reference.ts";
import {
  type AttentionBackend,
  ATTN_TYPES,
  DTYPES,
  type ForwardResult,
  KV_CACHE_DTYPES,
  KV_LAYOUTS,
  type RunOptions,
  type ValidBatch,
} from "../core/types.ts";
import { capabilities } from "./capabilities_base.ts";

/** CPU_REFERENCE plans nothing: the reference works from the batch alone. */
export type CpuReferencePlan = Record<string, never>;

function run(_p: CpuReferencePlan, batch: ValidBatch, _ctx: unknown, opts: RunOptions = {}) {
  // An executor's throw becomes a rejection, so callers see errors the async way.
  return new Promise<ForwardResult>((resolve) => resolve(compute(batch, opts)));
}

function compute(batch: ValidBatch, opts: RunOptions): ForwardResult {
  const c = batch.cache;
  if (c !== null && !(c instanceof HostKvCache)) {
    throw new ServiceError(
      `CPU_REFERENCE needs a host KV cache, got one with storage "${c.storage}"`,
      { status: 422, code: "cache_storage_mismatch", extra: { storage: c.storage } },
    );
  }
  if (opts.signal?.aborted) throw new ClientClosedError("the client went away before the call ran");
  const t0 = performance.now();
  const host = hostBatch(batch);
  if (c && !kvFromCall(host)) writeKv(host, c);
  const t1 = performance.now();
  const { output, lse } = attend(host, kvFromCall(host) ? null : c);
  const t2 = performance.now();
  return {
    output: fromFloats(batch.dtype, output),
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
  plan: () => ({}),
  run,
};
