/**
 * CPU_REFERENCE: the float64 oracle every other backend is checked against. It supports
 * every configuration the contract defines, needs no device, keeps its caches in host shared
 * memory ({@link HostKvCache}) and runs backends/cpu/reference.ts: write the new K/V, then attend.
 * Slow by design; priority 100 so auto selection prefers any device backend.
 *
 * It plans nothing (the reference works from the validated batch alone); `run` computes in a
 * worker of a {@link CpuWorkerPool} (backends/cpu/pool.ts), off the event loop, and takes an
 * optional AbortSignal. The pool's module doc states the guarantees: a call that does not
 * resolve leaves its cache unchanged; a cancelled call rejects with 499
 * `client_closed_request`. `close()` terminates the workers (the pool restarts them on the
 * next call).
 * @module
 */
import { fromFloats, hostBatch } from "../../core/data.ts";
import { ServiceError } from "../../core/errors.ts";
import { HostKvCache } from "./host_cache.ts";
import { kvFromCall } from "./reference.ts";
import {
  type AttentionBackend,
  ATTN_TYPES,
  DTYPES,
  type ForwardResult,
  KV_CACHE_DTYPES,
  KV_LAYOUTS,
  type RunOptions,
  type ValidBatch,
} from "../../core/types.ts";
import { capabilities } from "../capabilities_base.ts";
import { CpuWorkerPool, DEVICE_THREAD_WARM_WORKERS } from "./pool.ts";

/** CPU_REFERENCE plans nothing: the reference works from the batch alone. */
export type CpuReferencePlan = Record<string, never>;

/** The CPU_REFERENCE descriptor, plus its pool. */
export interface CpuReferenceBackend extends AttentionBackend<CpuReferencePlan> {
  /** The workers its calls run on. */
  readonly pool: CpuWorkerPool;
  /** Waits for running calls, then terminates the workers. */
  close(): Promise<void>;
}

async function runOn(
  pool: CpuWorkerPool,
  batch: ValidBatch,
  opts: RunOptions = {},
): Promise<ForwardResult> {
  const c = batch.cache;
  if (c !== null && !(c instanceof HostKvCache)) {
    throw new ServiceError(
      `CPU_REFERENCE needs a host KV cache, got one with storage "${c.storage}"`,
      { status: 422, code: "cache_storage_mismatch", extra: { storage: c.storage } },
    );
  }
  const host = hostBatch(batch);
  const r = await pool.run(host, kvFromCall(host) ? null : c, opts.signal, opts.queueDeadline);
  return { output: fromFloats(batch.dtype, r.output), lse: r.lse, timings: r.timings };
}

/** A CPU_REFERENCE descriptor running on `pool` (tests size their own pools). */
export function cpuReference(pool: CpuWorkerPool = new CpuWorkerPool()): CpuReferenceBackend {
  return {
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
    run: (_p, batch, _ctx, opts) => runOn(pool, batch, opts),
    pool,
    close: () => pool.close(),
    prewarm: () => pool.keepWarm(DEVICE_THREAD_WARM_WORKERS),
  };
}

/** The CPU float64 reference backend (one shared worker pool per process). */
export const CPU_REFERENCE: CpuReferenceBackend = cpuReference();
