/**
 * Capability checks: pure functions over a backend's descriptor data, following vLLM v1's
 * `AttentionBackend.validate_configuration`. Every reason starts with vLLM's own phrase
 * ("head_size not supported", …) so clients can match on the prefix; where useful the current
 * value and the supported ones follow in parentheses.
 * @module
 */
import type {
  AttentionBackend,
  AttnType,
  BackendContext,
  Capabilities,
  DeviceRequirements,
  DType,
  GpuContext,
  KernelBlockSize,
  KvCacheDType,
  SelectorConfig,
} from "../core/types.ts";

/** The base of a kernel block size: the size itself, or `n` of `{multiple_of: n}`. */
export function blockSizeBase(size: KernelBlockSize): number {
  return typeof size === "number" ? size : size.multiple_of;
}

/** A kernel block size as text: `16` or `multiple of 16`. */
export function formatBlockSize(size: KernelBlockSize): string {
  return typeof size === "number" ? String(size) : `multiple of ${size.multiple_of}`;
}

/**
 * vLLM's `supports_block_size`: null → true; no declared sizes → true; otherwise true when
 * `block_size` is a multiple of some declared size's base (an exact size also admits its
 * multiples, as vLLM's hybrid blocks do). A non-positive or non-integer size is never supported.
 */
export function supportsBlockSize(caps: Capabilities, block_size: number | null): boolean {
  return block_size === null || blockSizeIn(caps.block_sizes, block_size);
}

/** {@link supportsBlockSize} for a list of declared sizes (empty: any) and a size. */
export function blockSizeIn(sizes: readonly KernelBlockSize[], block_size: number): boolean {
  if (!Number.isInteger(block_size) || block_size <= 0) return false;
  if (sizes.length === 0) return true;
  return sizes.some((s) => {
    const base = blockSizeBase(s);
    return base > 0 && block_size % base === 0;
  });
}

/**
 * vLLM's `get_preferred_block_size`: the default when nothing is declared or the default is
 * supported, else the smallest declared base.
 */
export function preferredBlockSize(caps: Capabilities, defaultBlockSize = 16): number {
  if (caps.block_sizes.length === 0) return defaultBlockSize;
  if (supportsBlockSize(caps, defaultBlockSize)) return defaultBlockSize;
  return Math.min(...caps.block_sizes.map(blockSizeBase));
}

/** vLLM's `supports_head_size`: an empty list means any head size. */
export function supportsHeadSize(caps: Capabilities, head_size: number): boolean {
  return caps.head_sizes.length === 0 || caps.head_sizes.includes(head_size);
}

/** vLLM's `supports_dtype`: the dtype must be listed (an empty list supports none). */
export function supportsDType(caps: Capabilities, dtype: DType): boolean {
  return caps.dtypes.includes(dtype);
}

/** vLLM's `supports_kv_cache_dtype`: listed, or an empty list (any). `auto` is matched literally. */
export function supportsKvCacheDType(caps: Capabilities, kv: KvCacheDType): boolean {
  return caps.kv_cache_dtypes.length === 0 || caps.kv_cache_dtypes.includes(kv);
}

/** vLLM's `supports_attn_type`: the attention type must be listed. */
export function supportsAttnType(caps: Capabilities, attn_type: AttnType): boolean {
  return caps.attn_types.includes(attn_type);
}

const CC = "compute capability not supported";

/**
 * vLLM's `supports_compute_capability`, for WebGPU: why the device cannot run a backend with
 * these requirements (no adapter, lost, a missing feature, a limit under its minimum); [] when
 * it can, and always [] for host backends (`needs_device: false`).
 */
export function deviceReasons(req: DeviceRequirements, gpu: GpuContext | null): string[] {
  if (!req.needs_device) return [];
  if (gpu === null) return [`${CC}: no WebGPU adapter`];
  if (gpu.lost) return [`${CC}: device lost`];
  const out: string[] = [];
  for (const f of req.features) {
    if (!gpu.features.has(f)) out.push(`${CC}: missing WebGPU feature ${f}`);
  }
  for (const [name, min] of Object.entries(req.limits)) {
    const have = gpu.limits[name];
    if (typeof have !== "number") out.push(`${CC}: limit ${name} is unavailable, needs ${min}`);
    else if (have < min) out.push(`${CC}: limit ${name} is ${have}, needs ${min}`);
  }
  return out;
}

const list = (xs: readonly unknown[]) => (xs.length === 0 ? "none" : xs.join(", "));

/**
 * vLLM's `validate_configuration`: every reason `backend` cannot run `cfg` on `ctx`, in vLLM's
 * order (config checks, then the device, then attention type and flags, then this service's
 * extensions, then the backend's own `supportsCombination`). [] means valid.
 */
export function validateConfiguration(
  backend: AttentionBackend,
  cfg: SelectorConfig,
  ctx: BackendContext,
): string[] {
  const caps = backend.capabilities;
  const r: string[] = [];
  if (!supportsHeadSize(caps, cfg.head_size)) {
    r.push(`head_size not supported (got ${cfg.head_size}; supported: ${list(caps.head_sizes)})`);
  }
  if (!supportsDType(caps, cfg.dtype)) {
    r.push(`dtype not supported (got ${cfg.dtype}; supported: ${list(caps.dtypes)})`);
  }
  if (!supportsKvCacheDType(caps, cfg.kv_cache_dtype)) {
    r.push(
      `kv_cache_dtype not supported (got ${cfg.kv_cache_dtype}; supported: ${
        list(caps.kv_cache_dtypes)
      })`,
    );
  }
  if (!supportsBlockSize(caps, cfg.block_size)) {
    r.push(
      `block_size not supported (got ${cfg.block_size}; supported: ${
        caps.block_sizes.length === 0
          ? "any positive integer" // no list: any size (supportsBlockSize)
          : list(caps.block_sizes.map(formatBlockSize))
      })`,
    );
  }
  if (cfg.use_mm_prefix && !caps.mm_prefix) {
    r.push("partial multimodal token full attention not supported");
  }
  if (cfg.use_mla !== caps.is_mla) {
    r.push(cfg.use_mla ? "MLA not supported" : "non-MLA not supported");
  }
  if (cfg.has_sink && !caps.sinks) r.push("attention sinks not supported");
  if (cfg.use_sparse !== caps.sparse) {
    r.push(cfg.use_sparse ? "sparse not supported" : "non-sparse not supported");
  }
  if (cfg.use_per_head_quant_scales && !caps.per_head_quant_scales) {
    r.push("per-head quant scales not supported");
  }
  r.push(...deviceReasons(backend.requires, ctx.gpu));
  if (!supportsAttnType(caps, cfg.attn_type)) {
    r.push(`attention type ${cfg.attn_type} not supported (supported: ${list(caps.attn_types)})`);
  }
  if (cfg.use_non_causal && !caps.non_causal) r.push("non-causal attention not supported");
  if (cfg.use_batch_invariant && !caps.batch_invariant) r.push("batch invariance not supported");
  if (cfg.has_sliding_window && !caps.sliding_window) r.push("sliding window not supported");
  // Extensions: checked only when the config asks for them.
  if (cfg.use_alibi && !caps.alibi) r.push("ALiBi not supported");
  if (cfg.use_logits_soft_cap && !caps.logits_soft_cap) r.push("logits soft cap not supported");
  if (cfg.kv_cache_layout !== undefined && !caps.kv_cache_layouts.includes(cfg.kv_cache_layout)) {
    r.push(
      `kv cache layout ${cfg.kv_cache_layout} not supported (supported: ${
        list(caps.kv_cache_layouts)
      })`,
    );
  }
  if (cfg.return_lse && !caps.lse) r.push("LSE output not supported");
  if (cfg.cache_storage !== undefined && cfg.cache_storage !== backend.cache_storage) {
    r.push(
      `kv cache storage ${cfg.cache_storage} not supported (backend uses ${backend.cache_storage})`,
    );
  }
  const own = backend.supportsCombination?.(cfg, ctx) ?? null;
  if (own !== null) r.push(own);
  return r;
}
