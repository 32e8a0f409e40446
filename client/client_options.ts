/**
 * The client's option and result types: {@link ClientOptions} of a client,
 * {@link ForwardOptions} of one forward call, and what the cache calls answer
 * ({@link PutCacheResult}, {@link CacheContents}).
 * @module
 */
import type { CacheFile } from "../wire/cache_file.ts";
import type { CacheInfo } from "../wire/types.ts";

/** Options of one forward call. */
export interface ForwardOptions {
  /** Send the body as safetensors and ask for a safetensors answer (else JSON). */
  binary?: boolean;
  /**
   * Aborts the wait for the answer. The server may not notice (Deno.serve tells it of a
   * disconnect only for small requests), so an aborted call may still run and write its K/V:
   * bound its wait with `queueTimeoutMs` to know.
   */
  signal?: AbortSignal;
  /**
   * The most ms the call may wait on the server to start, after its body arrived (header
   * `X-Attention-Queue-Timeout-Ms`): past it the server answers 503 `queue_timeout` and the call
   * did not run, writing nothing.
   */
  queueTimeoutMs?: number;
}

/** A cache's contents as `GET /v1/kv-caches/{id}/data` answers them (parsed). */
export type CacheContents = CacheFile;

/** What `PUT /v1/kv-caches/{id}` answered: the cache, and whether this call created it (201). */
export interface PutCacheResult {
  info: CacheInfo;
  created: boolean;
  /** The instance that answered (`X-Attention-Instance`), when it named itself. */
  instance?: string;
}

/** Options of a client. */
export interface ClientOptions {
  /** A fetch implementation (default globalThis.fetch). */
  fetch?: typeof fetch;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
}
