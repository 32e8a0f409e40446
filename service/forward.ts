/**
 * One batched forward call of the attention service (service.ts `AttentionService.forward`):
 * its options, what it uses of the service, and the call: validated once (nothing is written if
 * that fails), a backend selected, then run on a server-held cache (under its mutex), on an
 * inline one (counted against the memory budget while it runs) or on none, with its timings.
 * @module
 */
import { ClientClosedError } from "../core/errors.ts";
import { checkQueueTimeoutMs, queueSinceOf, StartGate } from "../core/queue_timeout.ts";
import type {
  AttentionBackend,
  BackendContext,
  ForwardResult,
  KvCache,
  RunOptions,
} from "../core/types.ts";
import type { BackendRegistry } from "../backends/registry.ts";
import type { CacheStore, StoredCache } from "./cache_store.ts";
import {
  attachCache,
  type CallLimits,
  checkFiniteOnHost,
  type ForwardInput,
  type HeldCacheInfo,
  type ValidatedForward,
  validateForward,
  type ValidateOptions,
} from "./validate.ts";
import type { PlanCache } from "./plan_cache.ts";
import type { ForwardOutcome } from "../wire/codec.ts";
import { forced } from "./forced_backend.ts";
import { cacheLost } from "./cache_lost.ts";

/** Options of one forward call. */
export interface ForwardOptions {
  /** Aborted when the client went away: a call not yet submitted is cancelled, writing nothing. */
  signal?: AbortSignal;
  /**
   * The most ms the call may wait from this forward's start (after the body was decoded) to its
   * run (behind earlier calls on its cache, for the device): past it the call does not run and
   * throws 503 `queue_timeout` (core/queue_timeout.ts), writing nothing. Undefined: no bound.
   */
  queueTimeoutMs?: number;
  /**
   * When the call's wait began, on `performance.now()`'s clock, where that was before this
   * forward (a server that received the call on another thread: the wait for this one counts).
   * The queue timeout counts from it; undefined, or later than now: from now.
   */
  queueSince?: number;
  /**
   * The caller calls the result's `release()` once it no longer reads the output (the HTTP
   * routes, once the answer was delivered): the GPU backends then lend it the read-back
   * memory itself where the runtime maps it in place (Dawn), saving a copy of the output.
   */
  lendReadback?: boolean;
}

/** What a forward uses of its service: its parts, and its way to the device. */
export interface ForwardHost {
  readonly registry: BackendRegistry;
  readonly caches: CacheStore;
  readonly plans: PlanCache;
  readonly limits: Readonly<CallLimits>;
  /** The live device at once; a new one acquired (awaited) only when the last one was lost. */
  ctx(): BackendContext | Promise<BackendContext>;
  /** A forced backend that needs a device while there is none: @throws 503. */
  requireDevice(name: string | undefined): void;
}

/** What `exec` in {@link runForward} is: the call run on its cache (or none). */
type Exec = (cache: KvCache | null, onSubmitted?: () => void) => Promise<ForwardResult>;

/** Validation leaves a large batch's NaN/infinity scan to the plan that runs it. */
const DEFER_FINITE: Readonly<ValidateOptions> = Object.freeze({ deferFinite: true });

/**
 * One batched forward on `svc` (service.ts `AttentionService.forward`, which documents it).
 * @throws 400/404/422/503 ServiceErrors; 499 when `signal` aborted before the call ran; 503
 * `queue_timeout` when it waited past `queueTimeoutMs` before it ran.
 */
export async function runForward(
  svc: ForwardHost,
  input: ForwardInput,
  opts: ForwardOptions = {},
): Promise<ForwardOutcome> {
  const t0 = performance.now();
  const gate = startGateOf(opts, t0);
  const held = heldCacheOf(svc, input);
  const v = validateForward(input, heldInfoOf(held), svc.limits, DEFER_FINITE);
  const ctx = await svc.ctx();
  svc.requireDevice(input.backend);
  const { backend } = svc.registry.select(v.selector, { backend: forced(input.backend) });
  const tValidated = performance.now(); // validated and selected
  let tPlanned = tValidated, planHit = false;
  const exec: Exec = async (cache, onSubmitted) => {
    checkStart(opts.signal, gate);
    const batch = attachCache(v.batch, cache);
    const held = await svc.plans.get(backend, batch, ctx);
    tPlanned = performance.now();
    planHit = held.hit;
    try {
      // A large batch's scan was left to a plan that checks on the device; any other scans now.
      if (v.finite_deferred && held.plan.checks_finite !== true) checkFiniteOnHost(batch);
      return await backend.run(held.plan, batch, ctx, runOptionsOf(opts, gate, onSubmitted));
    } finally {
      held.release();
    }
  };
  let result: ForwardResult;
  if (held) {
    result = await onHeldCache(svc.caches, held.id, gate, exec);
  } else if (v.inline) {
    const release = svc.caches.reserve(v.inline.key.byteLength + v.inline.value.byteLength);
    try {
      const cache = await backend.importCache(v.inline.spec, v.inline.key, v.inline.value, ctx);
      try {
        result = await exec(cache);
      } finally {
        cache.destroy();
      }
    } finally {
      release();
    }
  } else {
    result = await exec(null);
  }
  return outcomeOf(backend, v, result, t0, tValidated, tPlanned, planHit);
}

/** The call's queue-timeout gate, or null without a timeout (its wait counts from `t0`'s). */
function startGateOf(opts: ForwardOptions, t0: number): StartGate | null {
  const queueTimeoutMs = checkQueueTimeoutMs(opts.queueTimeoutMs);
  const queueSince = queueSinceOf(opts.queueSince, t0);
  return queueTimeoutMs === undefined ? null : new StartGate(queueTimeoutMs, queueSince);
}

/**
 * The server-held cache `input.kv_cache` names, or null without one.
 * @throws 404 `cache_not_found` for an unknown id; 503 for a cache lost with its device.
 */
function heldCacheOf(svc: ForwardHost, input: ForwardInput): StoredCache | null {
  // A library caller's input may be anything: validation names what is wrong with it.
  const id: unknown = (input as Partial<ForwardInput> | null)?.kv_cache;
  const held = typeof id === "string" ? svc.caches.get(id) : null;
  if (held?.cache.lost) throw cacheLost(held.id);
  return held;
}

/** What validation checks the batch against of the held cache, or null. */
function heldInfoOf(held: StoredCache | null): HeldCacheInfo | null {
  return held ? { spec: held.cache.spec, storage: held.cache.storage } : null;
}

/** The call's start: @throws 499 when its client went away; 503 past its queue timeout. */
function checkStart(signal: AbortSignal | undefined, gate: StartGate | null): void {
  // A call that waited for its cache behind others, whose client went away meanwhile, does
  // not run (whatever the backend checks).
  if (signal?.aborted) {
    throw new ClientClosedError("the client went away before the call ran");
  }
  gate?.claim();
}

/** The backend's run options of the call. */
function runOptionsOf(
  opts: ForwardOptions,
  gate: StartGate | null,
  onSubmitted: (() => void) | undefined,
): RunOptions {
  return {
    signal: opts.signal,
    onSubmitted,
    ...(opts.lendReadback ? { lendReadback: true } : {}),
    ...(gate ? { queueDeadline: gate } : {}),
  };
}

/** The call run on the server-held cache `id`, under the cache's mutex. */
function onHeldCache(
  caches: CacheStore,
  id: string,
  gate: StartGate | null,
  exec: Exec,
): Promise<ForwardResult> {
  // The next call on this cache starts once this one's GPU work is submitted. A call with a
  // queue timeout is answered when it passes, however long the cache stays busy.
  const work = caches.withCache(id, (s, unlock) => {
    if (s.cache.lost) throw cacheLost(s.id);
    return exec(s.cache, unlock);
  });
  return gate ? gate.race(work) : work;
}

/** The call's outcome: its result with the service's timings added (ms since `t0`'s phases). */
function outcomeOf(
  backend: AttentionBackend,
  v: ValidatedForward,
  result: ForwardResult,
  t0: number,
  tValidated: number,
  tPlanned: number,
  planHit: boolean,
): ForwardOutcome {
  const timings = {
    ...result.timings,
    validate: tValidated - t0,
    plan: tPlanned - tValidated,
    plan_cached: planHit ? 1 : 0,
    total: performance.now() - t0,
  };
  return {
    backend: backend.name,
    result: { ...result, timings },
    dtype: v.batch.dtype,
    num_tokens: v.batch.num_tokens,
    num_heads: v.batch.layer.num_heads,
    head_size: v.batch.layer.head_size,
  };
}
