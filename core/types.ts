/**
 * The shared vocabulary of the service: dtypes, capabilities, selector configs, forward
 * batches, KV caches and the backend descriptor. Every other module builds on these.
 * Field names follow vLLM's v1 attention backend layer, in snake_case.
 * @module
 */

export type {
  AdapterInfoReport,
  DeviceProvider,
  DeviceReport,
  GpuContext,
  KeepWarmReport,
  RuntimeProbeReport,
  SubgroupMatrixConfig,
} from "./device_types.ts";
export type {
  AttentionBackend,
  BackendContext,
  ForwardResult,
  PlanContract,
  RunOptions,
} from "./backend_types.ts";
export type {
  BatchMetadata,
  BatchShape,
  BatchStats,
  DataArray,
  ForwardBatch,
  KvCache,
  KvCacheSpec,
  LayerSpec,
  ValidBatch,
} from "./batch_types.ts";

/** Data (activation) dtypes. */
export const DTYPES = ["float32", "float16", "bfloat16"] as const;
/** A data dtype: query/key/value/output storage. Accumulation is always f32 or better. */
export type DType = typeof DTYPES[number];

/**
 * KV-cache dtypes as a config names them; `auto` means "same as the data dtype", `fp8` is
 * `fp8_e4m3` (vLLM's `--kv-cache-dtype fp8`).
 */
export const KV_CACHE_DTYPES = [
  "auto",
  "float16",
  "bfloat16",
  "fp8",
  "fp8_e4m3",
  "fp8_e5m2",
] as const;
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
