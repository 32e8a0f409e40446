/**
 * What every GPU backend's plan shares ({@link buildGpuPlan}): the device limits a batch must
 * fit (each buffer under one storage binding, every grid under the dispatch limit; over a
 * limit is a 422 `binding_limit_exceeded` naming the tensor, its bytes and the limit, never a
 * silent failure), the device's finiteness check of a large call's data, the cache write of the
 * call's new K/V (gated by that check), the poisoning of the output and LSE,
 * the backend's own attention calls, and the plan table's bytes (each call uploads them; lent
 * memory, returned by {@link disposeGpuPlan} when the plan cache drops the plan). The
 * part before the attention calls depends on the shape alone and is replayed from its first
 * build (gpu/plan_prefix.ts).
 * @module
 */
import { bytesPerElement } from "../core/dtype.ts";
import { ServiceError } from "../core/errors.ts";
import type { BatchShape, GpuContext } from "../core/types.ts";
import type { BindRef, GpuPlan, PlannedCall } from "./gpu_plan.ts";
import { TABLE_MEMORY, TableBuilder } from "./plan_table.ts";
import { planPrefix } from "./plan_prefix.ts";
import { chunkKeyOf, kvChunkGeometry } from "./kv_cache.ts";

/** The last plan's calls per device and shape key (see {@link sharedCalls}). */
const lastCalls = new WeakMap<GPUDevice, Map<string, PlannedCall[]>>();
const LAST_CALLS_LIMIT = 64;

function sameRef(a: BindRef | undefined, b: BindRef | undefined): boolean {
  if (a === b) return true;
  if (!a || !b) return false;
  if ("table" in a) {
    return "table" in b && a.table.offset === b.table.offset && a.table.size === b.table.size;
  }
  if ("io" in a) return "io" in b && a.io === b.io;
  if ("scratch" in a) return "scratch" in b && a.scratch === b.scratch;
  return "persistent" in b && a.persistent === b.persistent && a.bytes === b.bytes;
}

function sameCall(a: PlannedCall, b: PlannedCall): boolean {
  if (
    a.name !== b.name || a.kernel !== b.kernel || a.cache !== b.cache ||
    a.grid[0] !== b.grid[0] || a.grid[1] !== b.grid[1] || !sameRef(a.indirect, b.indirect)
  ) return false;
  const ka = Object.keys(a.bind), kb = Object.keys(b.bind);
  if (ka.length !== kb.length) return false;
  for (const k of ka) if (!sameRef(a.bind[k], b.bind[k])) return false;
  return true;
}

/**
 * `calls`, or the previous plan's call list of this shape when it is the same in every field
 * (kernels, grids, table sections, bindings): a decode step's plan whose work decomposition did
 * not change then shares its predecessor's list, and with it the bindings and bind groups the
 * list was last bound to (gpu/gpu_plan.ts), so the first layer of a step binds nothing anew.
 */
function sharedCalls(ctx: GpuContext, key: string, calls: PlannedCall[]): PlannedCall[] {
  let m = lastCalls.get(ctx.device);
  if (!m) lastCalls.set(ctx.device, m = new Map());
  const prev = m.get(key);
  if (prev && prev.length === calls.length && prev.every((c, i) => sameCall(c, calls[i]))) {
    return prev;
  }
  m.delete(key);
  m.set(key, calls);
  if (m.size > LAST_CALLS_LIMIT) m.delete(m.keys().next().value!);
  return calls;
}

/** The attention part of a plan, from the backend. */
export interface AttentionCalls {
  calls: PlannedCall[];
  /** Scratch buffers by name, bytes. */
  scratch: Record<string, number>;
  /** Kernel keys, for reports. */
  kernels: string[];
  /** Counts worth reporting (work items, rows, tiles). */
  info?: Record<string, number>;
}

function limitError(what: string, value: number, limit: number, name: string): ServiceError {
  return new ServiceError(
    `${what} of ${value} ${
      name === "maxComputeWorkgroupsPerDimension" ? "workgroups" : "bytes"
    } exceeds this device's ${name} (${limit}); split the call`,
    {
      status: 422,
      code: "binding_limit_exceeded",
      issues: [{ path: [what], message: `${value} > ${name} ${limit}` }],
      extra: { tensor: what, value, limit, limit_name: name },
    },
  );
}

/** Checks every per-call buffer of `s` against one storage binding. */
export function checkBindingLimits(
  ctx: GpuContext,
  s: BatchShape,
  scratch: Record<string, number>,
) {
  const limit = Math.min(
    ctx.limits.maxStorageBufferBindingSize ?? 2 ** 27,
    ctx.limits.maxBufferSize ?? 2 ** 28,
  );
  const L = s.layer, e = bytesPerElement(s.dtype);
  const sizes: [string, number][] = [
    ["query", s.num_tokens * L.num_heads * L.head_size * e],
    ["key", s.num_kv_tokens * L.num_kv_heads * L.head_size * e],
    ["value", s.num_kv_tokens * L.num_kv_heads * L.head_size * e],
    ["output", s.num_tokens * L.num_heads * L.head_size * e],
    ["lse", s.num_tokens * L.num_heads * 4],
    ...Object.entries(scratch),
  ];
  for (const [name, bytes] of sizes) {
    if (bytes > limit) throw limitError(name, bytes, limit, "maxStorageBufferBindingSize");
  }
}

/**
 * Builds a backend's plan for `s`: the device's finiteness check of the call's data (batches
 * of at least deviceFiniteCheckBytes(), core/data.ts), cache write (when the call carries
 * K/V and uses a cache; gated by the check), poison, then `attention(table)`'s calls; checks
 * the limits; packs the table.
 */
export async function buildGpuPlan(
  ctx: GpuContext,
  s: BatchShape,
  attention: (table: TableBuilder) => Promise<AttentionCalls>,
): Promise<GpuPlan> {
  const t0 = performance.now();
  const table = new TableBuilder();
  const prefix = await planPrefix(ctx, s, table);
  const calls: PlannedCall[] = [...prefix.calls];
  const kernels: string[] = [...prefix.kernels];
  const att = await attention(table);
  calls.push(...att.calls);
  kernels.push(...att.kernels);
  checkBindingLimits(ctx, s, att.scratch);
  const maxDim = ctx.limits.maxComputeWorkgroupsPerDimension ?? 65535;
  for (const c of calls) {
    if (c.grid[0] > maxDim || c.grid[1] > maxDim) {
      throw limitError(
        c.name,
        c.grid[0] * c.grid[1],
        maxDim ** 2,
        "maxComputeWorkgroupsPerDimension",
      );
    }
  }
  const lease = TABLE_MEMORY.acquire(table.byteLength);
  return {
    ctx,
    table: table.bytes(lease.bytes),
    dispose: lease.release,
    checks_finite: prefix.checks,
    calls: sharedCalls(ctx, s.plan_key, calls),
    scratch: att.scratch,
    out_bytes: prefix.out_words * 4,
    lse_bytes: prefix.lse_words * 4,
    kernels,
    cache_layout: s.cache_spec ? chunkKeyOf(kvChunkGeometry(ctx, s.cache_spec)) : null,
    info: att.info ?? {},
    plan_ms: performance.now() - t0,
  };
}

/**
 * Returns a plan's table memory (a backend's `disposePlan`: the plan cache calls it once the
 * plan was dropped and no call holds it); the plan must not run afterwards.
 */
export function disposeGpuPlan(p: GpuPlan): void {
  p.dispose?.();
}
