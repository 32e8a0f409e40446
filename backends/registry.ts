/**
 * The backend registry and selector (vLLM v1's `get_attn_backend`): backends sorted by
 * priority, validated against a {@link SelectorConfig} on the current device, first valid
 * wins. Decisions are cached by a canonical key that includes the device generation, so a
 * re-acquired (or lost) device never gets a stale answer.
 * Selector configs (their defaults, the head-size rule, the canonical cache key) are
 * backends/selector_config.ts; selectorConfigDefaults is re-exported here.
 * @module
 */
import { NoValidBackendError, ServiceError } from "../core/errors.ts";
import type {
  AttentionBackend,
  CacheStorage,
  Capabilities,
  DeviceRequirements,
  GpuContext,
  SelectorConfig,
} from "../core/types.ts";
import { deviceReasons, preferredBlockSize, validateConfiguration } from "./capabilities.ts";
import { canonicalConfig, checkHeadSize } from "./selector_config.ts";

export { selectorConfigDefaults } from "./selector_config.ts";

/** What {@link BackendRegistry.select} answers. */
export interface SelectionResult {
  backend: AttentionBackend;
  /** The config's block size, or the winner's preferred one when the config had none. */
  block_size: number;
  /** Reasons of every backend passed over before the winner (auto); {} when forced. */
  rejected: Record<string, string[]>;
}

/** One backend as `GET /v1/backends` lists it. */
export interface BackendInfo {
  name: string;
  priority: number;
  description: string;
  available: boolean;
  /** Present only when `available` is false: the device reasons. */
  unavailable_reasons?: string[];
  cache_storage: CacheStorage;
  requires: DeviceRequirements;
  /** The descriptor's capability data, copied. */
  capabilities: Capabilities;
}

/** Options of {@link BackendRegistry.select}. */
export interface SelectOptions {
  /** Force one backend by its exact UPPER_SNAKE name; undefined or "auto": auto selection. */
  backend?: string;
}

/** Default block size offered when neither the config nor a backend names one (vLLM's 16). */
export const DEFAULT_BLOCK_SIZE = 16;

/** The most cached selection decisions kept (oldest dropped first). */
export const SELECTION_CACHE_LIMIT = 1024;

/** The device as the cache key sees it. */
function deviceKey(gpu: GpuContext | null): string {
  return gpu === null ? "none" : `${gpu.generation}${gpu.lost ? ":lost" : ""}`;
}

type Decision =
  | { ok: true; backend: AttentionBackend; block_size: number; rejected: Record<string, string[]> }
  | { ok: false; reasons: Record<string, string[]>; forced?: string };

const copyReasons = (r: Record<string, string[]>) =>
  Object.fromEntries(Object.entries(r).map(([k, v]) => [k, [...v]]));

/** The backends, their availability on the current device, and the selector. */
export class BackendRegistry {
  readonly #backends: AttentionBackend[];
  readonly #byName = new Map<string, AttentionBackend>();
  readonly #device: () => GpuContext | null;
  readonly #cache = new Map<string, Decision>();
  #cacheDevice: string | null = null;

  /**
   * @param backends the descriptors (any order; names must be unique)
   * @param device the current GPU context, asked on every call (null: none)
   * @throws Error on a duplicate backend name
   */
  constructor(backends: AttentionBackend[], device: () => GpuContext | null) {
    for (const b of backends) {
      if (this.#byName.has(b.name)) throw new Error(`duplicate backend name ${b.name}`);
      this.#byName.set(b.name, b);
    }
    this.#backends = [...backends].sort((a, b) =>
      a.priority - b.priority || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)
    );
    this.#device = device;
  }

  /** Every backend, by priority (lower first), then name. */
  list(): AttentionBackend[] {
    return [...this.#backends];
  }

  /** The names, in {@link list} order. */
  names(): string[] {
    return this.#backends.map((b) => b.name);
  }

  /** The backend of that exact name, or undefined. */
  find(name: string): AttentionBackend | undefined {
    return this.#byName.get(name);
  }

  /**
   * The backend of that exact (case-sensitive) name.
   * @throws ServiceError 404 `unknown_backend` naming the value and the known names.
   */
  get(name: string): AttentionBackend {
    const b = this.#byName.get(name);
    if (b) return b;
    const known = this.names();
    throw new ServiceError(`unknown backend ${JSON.stringify(name)}; known: ${known.join(", ")}`, {
      status: 404,
      code: "unknown_backend",
      issues: [{
        path: ["backend"],
        message: `unknown backend ${JSON.stringify(name)} (known: ${known.join(", ")}, auto)`,
      }],
      extra: { backend: name, known },
    });
  }

  /** Whether the current device can run `b` at all (device reasons only). */
  availability(b: AttentionBackend): { available: boolean; reasons: string[] } {
    const reasons = deviceReasons(b.requires, this.#device());
    return { available: reasons.length === 0, reasons };
  }

  /** Every reason `b` cannot run `cfg` on the current device ([] = valid). */
  validate(b: AttentionBackend, cfg: SelectorConfig): string[] {
    return validateConfiguration(b, cfg, { gpu: this.#device() });
  }

  /**
   * Auto selection (first valid by priority) or a forced backend's validation.
   * @throws ServiceError 400 `invalid_request` when `head_size` is not an integer in
   *   [1, 2^31 - 1];
   *   404 `unknown_backend` for an unknown forced name;
   *   NoValidBackendError 422 with every backend's reasons (a forced one's first; an empty
   *   list for a backend that could run the configuration).
   */
  select(cfg: SelectorConfig, opts: SelectOptions = {}): SelectionResult {
    checkHeadSize(cfg.head_size);
    const forced = opts.backend === undefined || opts.backend === "auto" ? undefined : opts.backend;
    if (forced !== undefined) this.get(forced);
    const gpu = this.#device();
    const dev = deviceKey(gpu);
    if (this.#cacheDevice !== dev) {
      this.#cache.clear();
      this.#cacheDevice = dev;
    }
    const key = `${canonicalConfig(cfg)}|${forced ?? "auto"}|${dev}`;
    let d = this.#cache.get(key);
    if (d === undefined) {
      d = this.#decide(cfg, forced, gpu);
      if (this.#cache.size >= SELECTION_CACHE_LIMIT) {
        this.#cache.delete(this.#cache.keys().next().value!);
      }
      this.#cache.set(key, d);
    }
    if (!d.ok) throw new NoValidBackendError(copyReasons(d.reasons), d.forced);
    return { backend: d.backend, block_size: d.block_size, rejected: copyReasons(d.rejected) };
  }

  #decide(cfg: SelectorConfig, forced: string | undefined, gpu: GpuContext | null): Decision {
    const ctx = { gpu };
    const blockFor = (b: AttentionBackend) =>
      cfg.block_size ?? preferredBlockSize(b.capabilities, DEFAULT_BLOCK_SIZE);
    if (forced !== undefined) {
      const b = this.get(forced);
      const reasons = validateConfiguration(b, cfg, ctx);
      if (reasons.length > 0) {
        // The contract's 422 has reasons for every backend: the forced one's first, then each
        // other's (an empty list: that one could run the configuration).
        const all: Record<string, string[]> = { [b.name]: reasons };
        for (const o of this.#backends) {
          if (o !== b) all[o.name] = validateConfiguration(o, cfg, ctx);
        }
        return { ok: false, reasons: all, forced };
      }
      return { ok: true, backend: b, block_size: blockFor(b), rejected: {} };
    }
    const rejected: Record<string, string[]> = {};
    for (const b of this.#backends) {
      const reasons = validateConfiguration(b, cfg, ctx);
      if (reasons.length === 0) return { ok: true, backend: b, block_size: blockFor(b), rejected };
      rejected[b.name] = reasons;
    }
    return { ok: false, reasons: rejected };
  }

  /** Cached selection decisions (for tests). */
  cacheSize(): number {
    return this.#cache.size;
  }

  /** Drops every cached decision. */
  clearCache(): void {
    this.#cache.clear();
  }

  /** Every backend with its availability on the current device (`GET /v1/backends`). */
  describe(): BackendInfo[] {
    return this.#backends.map((b) => {
      const { available, reasons } = this.availability(b);
      const info: BackendInfo = {
        name: b.name,
        priority: b.priority,
        description: b.description,
        available,
        cache_storage: b.cache_storage,
        requires: structuredClone(b.requires),
        capabilities: structuredClone(b.capabilities),
      };
      if (!available) info.unavailable_reasons = reasons;
      return info;
    });
  }
}
