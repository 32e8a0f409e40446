/**
 * The shared vocabulary of the service: dtypes, capabilities, selector configs, forward
 * batches, KV caches and the backend descriptor. Every other module builds on these.
 * Field names follow vLLM's v1 attention backend layer, in snake_case.
 * @module
 */

/** Data (activation) dtypes. */
export const DTYPES = ["float32", "float16", "bfloat16"] as const;
/** A data dtype: query/key/value/output storage. Accumulation is always f32 or better. */
export type DType = typeof DTYPES[number];

/** KV-cache dtypes as a config names them; `auto` means "same as the data dtype". */
export const KV_CACHE_DTYPES = ["auto", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] as const;
/** A configured KV-cache dtype. */
export type KvCacheDType = typeof KV_CACHE_DTYPES[number];

/** What a cache element is physically stored as, once `auto` is resolved. */
export type StorageDType = "float32" | "float16" | "bfloat16" | "fp8_e4m3" | "fp8_e5m2";

/** Attention types (vLLM's `AttentionType`). */
export const ATTN_TYPES = ["decoder", "encoder", "encoder_only", "encoder_decoder"] as const;
/** One attention type. */
export type AttnType = typeof ATTN_TYPES[number];

/** Paged KV-cache layouts. NHD: [blocks, block_size, kv_heads, head]; HND: [blocks, kv_heads, block_size, head]. */
export const KV_LAYOUTS = ["NHD", "HND"] as const;
/** One cache layout. */
export type KvLayout = typeof KV_LAYOUTS[number];

/** vLLM's `AttentionCGSupport`: how far a backend's calls can be captured as a graph. */
export const GRAPH_SUPPORT = [
  "ALWAYS",
  "UNIFORM_BATCH",
  "UNIFORM_SINGLE_TOKEN_DECODE",
  "NEVER",
] as const;
/** One graph-support level. */
export type GraphSupport = typeof GRAPH_SUPPORT[number];

/** vLLM's `MultipleOf(n)`: any block size that is a multiple of `n`. As data: `{multiple_of: n}`. */
export interface MultipleOf {
  multiple_of: number;
}
/** A kernel block size: an exact size or a `MultipleOf`. */
export type KernelBlockSize = number | MultipleOf;

/**
 * What a backend supports, as plain data (served at `GET /v1/backends`).
 * Empty `block_sizes` / `head_sizes` mean "any".
 */
export interface Capabilities {
  dtypes: DType[];
  kv_cache_dtypes: KvCacheDType[];
  block_sizes: KernelBlockSize[];
  head_sizes: number[];
  kv_cache_layouts: KvLayout[];
  attn_types: AttnType[];
  is_mla: boolean;
  sinks: boolean;
  sliding_window: boolean;
  alibi: boolean;
  logits_soft_cap: boolean;
  non_causal: boolean;
  sparse: boolean;
  mm_prefix: boolean;
  per_head_quant_scales: boolean;
  batch_invariant: boolean;
  kv_connector: boolean;
  lse: boolean;
  graph_support: GraphSupport;
  /** Queries per request at or under which a request is treated as decode (vLLM's reorder_batch_threshold); null: no reordering. */
  reorder_batch_threshold: number | null;
}

/** What a backend needs from the WebGPU adapter ("compute capability" in vLLM's terms). */
export interface DeviceRequirements {
  /** False for host backends: they run with no adapter at all. */
  needs_device: boolean;
  /** WebGPU features the device must have been granted. */
  features: string[];
  /** Minimum values of GPUSupportedLimits entries, by name. */
  limits: Record<string, number>;
}

/** vLLM's selector config, plus the optional forward-derived extensions at the bottom. */
export interface SelectorConfig {
  head_size: number;
  dtype: DType;
  kv_cache_dtype: KvCacheDType;
  /** null: the caller has no block size yet; the selector answers with the preferred one. */
  block_size: number | null;
  use_mla: boolean;
  has_sink: boolean;
  use_sparse: boolean;
  use_mm_prefix: boolean;
  attn_type: AttnType;
  has_sliding_window: boolean;
  use_non_causal: boolean;
  use_batch_invariant: boolean;
  use_per_head_quant_scales: boolean;
  // Extensions (absent = not required):
  use_alibi?: boolean;
  use_logits_soft_cap?: boolean;
  kv_cache_layout?: KvLayout;
  return_lse?: boolean;
  /** Where the KV cache of this call lives, when a server-held cache is named. */
  cache_storage?: CacheStorage;
  /** Longest query of the batch (forward calls only): lets decode-only backends decline. */
  max_query_len?: number;
}

/** Where a KV cache's bytes live. */
export type CacheStorage = "host" | "webgpu";

/** A paged KV cache's shape and types. `kv_cache_dtype` is resolved (never `auto`). */
export interface KvCacheSpec {
  num_blocks: number;
  block_size: number;
  num_kv_heads: number;
  head_size: number;
  dtype: DType;
  kv_cache_dtype: KvCacheDType;
  layout: KvLayout;
}

/**
 * A paged KV cache, K and V. The bytes are the storage dtype's little-endian encoding in
 * `layout` order (so a host cache, a safetensors export and a GPU buffer hold the same bytes).
 */
export interface KvCache {
  readonly spec: KvCacheSpec;
  readonly storage: CacheStorage;
  /** Bytes of K plus V. */
  readonly bytes: number;
  /** The raw contents of K and V, in layout order. */
  read(): Promise<{ key: Uint8Array; value: Uint8Array }>;
  /** Frees the memory; the cache is unusable afterwards. */
  destroy(): void;
  /** Set when the device holding it was lost: its contents are gone. */
  readonly lost?: boolean;
  /**
   * An fp8 e4m3 cache none of whose bytes encodes NaN (S.1111.111): created empty and written
   * only by the cache writer (it saturates, and its inputs were checked finite), or imported
   * from bytes that were checked. Decoders may then skip the NaN case.
   */
  readonly fp8_nan_free?: boolean;
}

/** A layer's attention parameters, resolved (defaults filled in). */
export interface LayerSpec {
  num_heads: number;
  num_kv_heads: number;
  head_size: number;
  scale: number;
  /** null: no window. */
  sliding_window: number | null;
  /** null: no cap. */
  logits_soft_cap: number | null;
  /** [num_heads] or null. */
  alibi_slopes: Float32Array | null;
  /** [num_heads] or null. */
  sinks: Float32Array | null;
  attn_type: AttnType;
  causal: boolean;
  /** fp8 cache dequant scales (real = stored * scale); 1 unless set. */
  k_scale: number;
  v_scale: number;
}

/** vLLM's CommonAttentionMetadata, validated. */
export interface BatchMetadata {
  num_reqs: number;
  /** [num_reqs + 1] */
  query_start_loc: Int32Array;
  /** [num_reqs] */
  seq_lens: Int32Array;
  /** [num_reqs * max_blocks_per_req], row-major. */
  block_table: Int32Array;
  max_blocks_per_req: number;
  /** [num_kv_tokens] (one per key row; num_tokens unless encoder_decoder); -1 = padding. */
  slot_mapping: Int32Array;
}

/**
 * A data tensor (query / key / value / output) in its dtype: the little-endian bytes exactly as
 * the request carried them (a view, not a copy, where the wire allowed it). `bytes.byteOffset`
 * is a multiple of 4 and `bytes.byteLength` is `length` times the element size.
 */
export interface DataArray {
  readonly dtype: DType;
  /** Elements. */
  readonly length: number;
  readonly bytes: Uint8Array;
}

/**
 * A forward call in float32 host form: what the float64 reference (backends/cpu/reference.ts)
 * computes on. Data tensors are Float32Array whose values are exactly representable in
 * `dtype`. Built from a {@link ValidBatch} by `hostBatch` (core/data.ts).
 */
export interface ForwardBatch {
  dtype: DType;
  layer: LayerSpec;
  num_tokens: number;
  /** [num_tokens, num_heads, head_size] */
  query: Float32Array;
  /**
   * [num_kv_tokens, num_kv_heads, head_size] or null (encoder_decoder steps adding none).
   * num_kv_tokens equals num_tokens except for encoder_decoder, where these are the
   * encoder's tokens (and slot_mapping has one entry per key token).
   */
  key: Float32Array | null;
  value: Float32Array | null;
  metadata: BatchMetadata;
  /** The paged cache (server-held or inline); null for encoder / encoder_only. */
  cache: KvCache | null;
  return_lse: boolean;
}

/** Counts a validated batch carries, computed once by validation. */
export interface BatchStats {
  /** Longest query of the batch. */
  max_query_len: number;
  /** Longest seq_len. */
  max_seq_len: number;
  /** Requests whose query length is at or under the decode threshold (1). */
  num_decode_reqs: number;
  /** Sum over query tokens of the keys each may attend (mask-aware upper bound). */
  attended_keys: number;
}

/**
 * Everything a plan may depend on: a validated forward call without its tensors. Plans are
 * built from this alone and cached under `plan_key` (it names the shape: the layer, dtypes, token
 * and request counts, blocks per request, cache spec and LSE; the plan cache tells calls of one
 * key apart by comparing their metadata arrays by value), so every call with the same metadata,
 * such as the layers of one engine step, reuses one plan.
 */
export interface BatchShape {
  readonly dtype: DType;
  readonly layer: LayerSpec;
  readonly num_tokens: number;
  /** Rows of key/value (0 when the call carries none). */
  readonly num_kv_tokens: number;
  readonly metadata: BatchMetadata;
  /** The spec of the cache the call attends over; null for encoder types. */
  readonly cache_spec: KvCacheSpec | null;
  readonly return_lse: boolean;
  readonly stats: BatchStats;
  /** The shape's key (not the metadata's values: see above). */
  readonly plan_key: string;
  /** The attached cache is fp8 e4m3 with no NaN byte (KvCache `fp8_nan_free`; part of the key). */
  readonly cache_nan_free?: boolean;
}

declare const validBrand: unique symbol;

/**
 * One forward call that passed validation (service/validate.ts builds them, and nothing else
 * does): shapes agree with the layer, metadata is consistent, every block id and slot is in
 * range, no block repeats within a request, limits hold, and tensors are finite: checked on the
 * host, or, for a large batch, by the GPU plan itself before its cache write (gpu/finite_check.ts:
 * the write is skipped and the call becomes the same 422). Backends and the cache writer trust
 * it and do not re-check.
 */
export interface ValidBatch extends BatchShape {
  readonly [validBrand]: true;
  /** [num_tokens, num_heads, head_size] */
  readonly query: DataArray;
  /** [num_kv_tokens, num_kv_heads, head_size], or null. */
  readonly key: DataArray | null;
  readonly value: DataArray | null;
  /** The cache (server-held or inline); null for encoder types. */
  readonly cache: KvCache | null;
}

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
   * of lent host memory, gpu/host_pool.ts); neither may be read afterwards. Call it once the
   * answer was delivered; not calling it is safe (the memory is then not reused). Idempotent.
   */
  release?(): void;
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
}

/** The WebGPU device as the backends see it (null anywhere there is none). */
export interface GpuContext {
  readonly device: GPUDevice;
  readonly adapter_info: {
    vendor: string;
    architecture: string;
    device: string;
    description: string;
    subgroup_min_size?: number;
    subgroup_max_size?: number;
    is_fallback_adapter?: boolean;
  };
  /** Features granted on the device (including `subgroups` when the request succeeded). */
  readonly features: ReadonlySet<string>;
  /** The device's limits (requested at the adapter's own values). */
  readonly limits: Readonly<Record<string, number>>;
  /** Bumped each time a device is (re-)acquired. */
  readonly generation: number;
  /** True once the device was lost. */
  readonly lost: boolean;
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
}

/** One subgroup-matrix configuration (Dawn's `chromium-experimental-subgroup-matrix`). */
export interface SubgroupMatrixConfig {
  component_type: string;
  result_component_type: string;
  m: number;
  n: number;
  k: number;
}

/** The adapter as `GET /v1/device` reports it. */
export type AdapterInfoReport = GpuContext["adapter_info"] & {
  /** The vendor's name where `vendor` is a PCI/Khronos id (Deno's "65541" is "mesa"). */
  vendor_name?: string;
  /** Dawn's `adapter.info.subgroupMatrixConfigs`, where the runtime gives them. */
  subgroup_matrix_configs?: SubgroupMatrixConfig[];
};

/** A runtime not chosen, as a cheap probe (an adapter, never a device) found it. */
export interface RuntimeProbeReport {
  /** True when it loads and finds an adapter. */
  available: boolean;
  version?: string;
  flags?: string[];
  backend_api?: string;
  /** Why it is unavailable, or why it was not chosen. */
  reason?: string;
  adapter?: AdapterInfoReport;
}

/** What `GET /v1/device` reports. */
export interface DeviceReport {
  available: boolean;
  /** Which WebGPU implementation: "deno" (navigator.gpu), "dawn" (npm webgpu), or "none". */
  runtime: string;
  /** Deno's version for "deno"; the npm `webgpu` package's for "dawn". */
  runtime_version?: string;
  /** The flags the runtime was created with (Dawn's `create(flags)`). */
  runtime_flags?: string[];
  /** How the runtime was chosen: what was asked (deno, dawn, auto) and why this one. */
  selection?: string;
  /** The native API under WebGPU: vulkan, gl, metal, d3d12... */
  backend_api?: string;
  /** How `backend_api` is known (WebGPU itself does not say). */
  backend_api_source?: string;
  /** Why there is no device, when there is none. */
  reason?: string;
  adapter?: AdapterInfoReport;
  features: string[];
  limits: Record<string, number>;
  generation: number;
  /** What the runtime printed while finding the adapter (Dawn's warnings). */
  warnings?: string[];
  /** The runtimes not chosen: whether they could start here, and why not (once probed). */
  other_runtimes?: Record<string, RuntimeProbeReport>;
  /** Keep-warm spins between calls, when asked for (gpu/keep_warm.ts). */
  keep_warm?: KeepWarmReport;
}

/** What keep-warm does (`--keep-warm-ms`): whether it is on, why not, its knobs, its count. */
export interface KeepWarmReport {
  enabled: boolean;
  reason?: string;
  options: { hold_ms: number; spin_iters: number; workgroups: number; depth: number };
  round_trip_ms?: number;
  dispatches: number;
  spinning: boolean;
}

/** Owns the WebGPU device: acquires it, re-acquires after loss, reports it. */
export interface DeviceProvider {
  /** The live device, or null (none, or lost and not yet re-acquired). */
  current(): GpuContext | null;
  /** Acquires a device if there is none (or it was lost); resolves to null where no adapter exists. */
  acquire(): Promise<GpuContext | null>;
  report(): DeviceReport;
}
