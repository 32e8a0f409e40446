/**
 * The backend contract: the descriptor a file in `backends/` exports (capabilities as data,
 * plan on metadata, run on tensors), what `run` takes and returns. core/types.ts re-exports it.
 * @module
 */
import type { GpuContext } from "./device_types.ts";
import type { QueueDeadline } from "./queue_timeout.ts";
import type {
  BatchShape,
  CacheStorage,
  Capabilities,
  DataArray,
  DeviceRequirements,
  KvCache,
  KvCacheSpec,
  SelectorConfig,
  ValidBatch,
} from "./types.ts";

/** What a backend returns. */
export interface ForwardResult {
  /** [num_tokens, num_heads, head_size] in the batch dtype. */
  output: DataArray;
  /** [num_heads, num_tokens] natural-log normaliser, or null when not asked for. */
  lse: Float32Array | null;
  /** Milliseconds by phase, e.g. {plan, write, attend}. */
  timings?: Record<string, number>;
  /**
   * Returns the memory `output` and `lse` view to its pool (a GPU backend's results are views
   * of lent host memory, gpu/host_pool.ts, or on Deno's runtime of memory freed at once,
   * gpu/launch.ts); neither may be read afterwards. Call it once the
   * answer was delivered; not calling it is safe (the memory is then not reused). Idempotent.
   */
  release?(): void;
  /**
   * The paths of the plan that ran ({@link PlanContract.paths}, the same object: nothing is
   * made per call); the forward routes send them as `X-Attention-Paths` and
   * `X-Attention-Path-Reasons`.
   */
  paths?: PlanPaths;
}

/** Which kernels run one part of a batch (recorded when the plan is built). */
export interface PlanPath {
  /**
   * The rows: `decode`, the requests of 1 to the backend's `reorder_batch_threshold` query
   * tokens (vLLM's decode rows), or `prefill`, the requests of more.
   */
  readonly part: "decode" | "prefill";
  /** The kernels, in the backend's words (WEBGPU_FLASH: `split_kv`, `tensor_core`, `tiles`). */
  readonly path: string;
  /**
   * Why the part is not on its preferred path (WEBGPU_FLASH: decode rows on `split_kv`,
   * prefill rows on `tensor_core`), worded like the selector's reasons ("dtype not supported
   * (got float32; ...)"), and, after it (`; ` between them), why its kernel does not run the
   * shape or tile the configuration names (WEBGPU_FLASH: `ATTN_PREFILL_MMA_SHAPE` on
   * `tensor_core`, `ATTN_FLASH_TILE` on `tiles`) where it runs another. So a part on its
   * preferred path may have a reason too (the named shape alone); absent where the part is on
   * its preferred path and runs what was named (or nothing was).
   */
  readonly reason?: string;
}

/** A plan's {@link PlanPath}s and their header values, made once when the plan is built. */
export interface PlanPaths {
  /** The parts that have rows, decode first. */
  readonly parts: readonly PlanPath[];
  /**
   * `X-Attention-Paths`: an RFC 8941 dictionary of tokens, `part=path` per part
   * (`decode=split_kv, prefill=tensor_core`); "" when the batch has no rows.
   */
  readonly header: string;
  /**
   * `X-Attention-Path-Reasons`: an RFC 8941 dictionary of strings, `part="reason"` per part
   * that has a reason; "" when none has.
   */
  readonly reasons_header: string;
}

/** An RFC 8941 sf-string of `s`: quoted, `"` and `\` escaped, anything not printable ASCII `?`. */
function sfString(s: string): string {
  return `"${s.replace(/[^\x20-\x7e]/g, "?").replace(/["\\]/g, (c) => `\\${c}`)}"`;
}

/** {@link PlanPaths} of `parts`, with both header values (call it at plan time). */
export function planPaths(parts: readonly PlanPath[]): PlanPaths {
  const why = parts.filter((p) => p.reason);
  return {
    parts,
    header: parts.map((p) => `${p.part}=${p.path}`).join(", "),
    reasons_header: why.map((p) => `${p.part}=${sfString(p.reason!)}`).join(", "),
  };
}

/** Options of a backend's `run`. */
export interface RunOptions {
  /**
   * Aborted when the caller went away. A backend checks it before it writes anything: an
   * aborted call writes nothing and rejects; once the cache write is submitted the call
   * completes (the write happens entirely or not at all).
   */
  signal?: AbortSignal;
  /**
   * Called once everything the call does to the cache and its own buffers is submitted to the
   * device queue (WebGPU runs later submissions after it), before the read-back: the service
   * lets the next call on the same cache start then. A backend that never calls it keeps the
   * cache until `run` settles.
   */
  onSubmitted?: () => void;
  /**
   * The call's queue timeout (core/queue_timeout.ts), where the caller set one. The service
   * bounds the wait for the cache; a backend that queues calls itself before running them
   * (CPU_REFERENCE's worker pool) drops a call still queued at the deadline, writing nothing,
   * and rejects with QueueTimeoutError (503 `queue_timeout`). A call that started runs to its end.
   */
  queueDeadline?: QueueDeadline;
  /**
   * The caller releases the result once it no longer reads it (the HTTP routes do, once the
   * answer was delivered): a GPU backend may then lend it the device's read-back memory
   * instead of a copy (gpu/readback_memory.ts). Unset: the result's memory is its own.
   */
  lendReadback?: boolean;
}

/** What plan/run receive besides the batch. */
export interface BackendContext {
  /** The GPU, or null when none is available. */
  gpu: GpuContext | null;
}

/** What the service reads off any backend's plan (the rest of a plan is the backend's own). */
export interface PlanContract {
  /**
   * The plan's run checks the batch's query/key/value for NaN and infinity on the device before
   * it writes anything, and fails with the validator's 422: the service then leaves a large
   * batch's host scan to it. Absent means false (the service scans on the host first).
   */
  readonly checks_finite?: boolean;
  /**
   * Which kernels run each part of the batch and why not the preferred ones, where the backend
   * records it (WEBGPU_FLASH); its `run` hands the same object back as `ForwardResult.paths`.
   */
  readonly paths?: PlanPaths;
}

/**
 * A backend: one file in `backends/` exporting one of these. Shared code asks the
 * descriptor; it never branches on `name`.
 */
export interface AttentionBackend<P extends PlanContract = PlanContract> {
  /** UPPER_SNAKE, like vLLM's names. */
  readonly name: string;
  /** Lower runs first in auto selection. */
  readonly priority: number;
  readonly description: string;
  readonly capabilities: Capabilities;
  readonly requires: DeviceRequirements;
  /** The cache storage its kernels read and write. */
  readonly cache_storage: CacheStorage;
  /** A backend-specific reason this combination is invalid, or null (vLLM's supports_combination). */
  supportsCombination?(config: SelectorConfig, ctx: BackendContext): string | null;
  /** Creates an empty cache in this backend's storage. */
  createCache(spec: KvCacheSpec, ctx: BackendContext): Promise<KvCache> | KvCache;
  /** Wraps caller-supplied bytes (inline key_cache/value_cache) as a cache for one call. */
  importCache(
    spec: KvCacheSpec,
    key: Uint8Array,
    value: Uint8Array,
    ctx: BackendContext,
  ): Promise<KvCache> | KvCache;
  /**
   * Plans a batch from its metadata alone (no tensor is read): work partition, compiled
   * pipelines, uploaded tables. The service caches plans by `shape.plan_key` and the device,
   * so a plan must not hold anything specific to one call's tensors or cache.
   */
  plan(shape: BatchShape, ctx: BackendContext): Promise<P> | P;
  /** Writes the tensors, binds, dispatches (writes K/V into the cache first), reads back once. */
  run(plan: P, batch: ValidBatch, ctx: BackendContext, opts?: RunOptions): Promise<ForwardResult>;
  /** Frees what a plan holds once the plan cache drops it (and no call uses it). */
  disposePlan?(plan: P): void;
  /** Releases what the backend holds process-wide (workers, pools); it may be used again later. */
  close?(): Promise<void>;
  /**
   * Starts now what its first call would start (worker threads) and keeps it through idle-outs:
   * for a server thread where that start is slow (a device thread: server/device_thread.ts).
   */
  prewarm?(): void;
}
