/**
 * What validation (service/validate.ts) is given and produces: its options, the server-held
 * cache it checks against, the validated batch before its cache is attached, and the whole
 * validated call.
 * @module
 */
import type {
  BatchShape,
  CacheStorage,
  DataArray,
  KvCacheSpec,
  SelectorConfig,
} from "../core/types.ts";

/** Options of {@link validateForward}. */
export interface ValidateOptions {
  /**
   * Leave the NaN/infinity scan of a large batch's data (core/data.ts checksFiniteOnDevice)
   * to the device; the result says whether it was left (`finite_deferred`).
   */
  deferFinite?: boolean;
}

/** A server-held cache as validation sees it. */
export interface HeldCacheInfo {
  spec: KvCacheSpec;
  storage: CacheStorage;
}

/** A validated batch before its cache is attached (see {@link attachCache}). */
export interface UnattachedBatch extends BatchShape {
  readonly query: DataArray;
  readonly key: DataArray | null;
  readonly value: DataArray | null;
}

/** What validation produces: the batch without its cache, the selector config, inline cache bytes. */
export interface ValidatedForward {
  batch: UnattachedBatch;
  selector: SelectorConfig;
  /**
   * The whole words of query/key/value were not scanned for NaN and infinity: a GPU plan with
   * `checks_finite` checks them before it writes anything, and any other plan's batch goes
   * through {@link checkFiniteOnHost} first (the service does both).
   */
  finite_deferred: boolean;
  /** The inline cache to import with the chosen backend, or null. */
  inline: { spec: KvCacheSpec; key: Uint8Array; value: Uint8Array } | null;
}
