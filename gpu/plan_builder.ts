/**
 * What every GPU backend's plan shares ({@link buildGpuPlan}): the device limits a batch must
 * fit (each buffer under one storage binding, every grid under the dispatch limit; over a
 * limit is a 422 `binding_limit_exceeded` naming the tensor, its bytes and the limit, never a
 * silent failure), the device's finiteness check of a large call's data, the cache write of the
 * call's new K/V (gated by that check), the poisoning of the output and LSE,
 * the backend's own attention calls, and the plan table's bytes (each call uploads them).
 * @module
 */
import { bytesPerElement } from "../core/dtype.ts";
import { ServiceError } from "../core/errors.ts";
import type { BatchShape, GpuContext } from "../core/types.ts";
import { checksFiniteOnDevice, dataElements } from "../core/data.ts";
import { planCacheWrite } from "./cache_write.ts";
import { planFiniteCheck } from "./finite_check.ts";
import { planFill } from "./fill.ts";
import { type GpuPlan, outputWords, type PlannedCall, poisonCalls } from "./gpu_plan.ts";
import { TableBuilder } from "./plan_table.ts";
import { chunkKeyOf, kvChunkGeometry } from "./kv_cache.ts";

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

/** The check and gate calls of a batch whose data the device checks (gpu/finite_check.ts). */
async function finiteCheckCalls(
  ctx: GpuContext,
  s: BatchShape,
  writeGrid: readonly [number, number] | null,
  table: TableBuilder,
): Promise<PlannedCall[]> {
  const fc = await planFiniteCheck(ctx, s.dtype, dataElements(s), writeGrid, table);
  // Without key/value rows the query is bound in their place (their word counts are 0).
  const kv = s.num_kv_tokens > 0 ? ["key", "value"] as const : ["query", "query"] as const;
  return [
    {
      name: "finite_check",
      kernel: fc.check,
      bind: {
        P: { table: fc.checkParams },
        q: { io: "query" },
        k: { io: kv[0] },
        v: { io: kv[1] },
        flags: { io: "flags" },
      },
      grid: fc.grid,
    },
    {
      name: "finite_gate",
      kernel: fc.gate,
      bind: { P: { table: fc.gateParams }, flags: { io: "flags" }, args: { io: "args" } },
      grid: [1, 1],
    },
  ];
}

/**
 * Builds a backend's plan for `s`: the device's finiteness check of the call's data (batches
 * of at least DEVICE_FINITE_CHECK_BYTES, core/data.ts), cache write (when the call carries
 * K/V and uses a cache; gated by the check), poison, then `attention(table)`'s calls; checks
 * the limits; packs the table.
 */
export async function buildGpuPlan(
  ctx: GpuContext,
  s: BatchShape,
  attention: (table: TableBuilder) => Promise<AttentionCalls>,
): Promise<GpuPlan> {
  const t0 = performance.now();
  const L = s.layer;
  const table = new TableBuilder();
  const calls: PlannedCall[] = [];
  const kernels: string[] = [];
  const cw = s.cache_spec && s.num_kv_tokens > 0
    ? await planCacheWrite(ctx, s.cache_spec, s.dtype, s.metadata.slot_mapping, {
      k_scale: L.k_scale,
      v_scale: L.v_scale,
    }, table)
    : null;
  const checks = checksFiniteOnDevice(s);
  if (checks) calls.push(...await finiteCheckCalls(ctx, s, cw?.grid ?? null, table));
  if (cw) {
    calls.push({
      name: "cache_write",
      kernel: cw.kernel,
      bind: {
        P: { table: cw.params },
        key_new: { io: "key" },
        value_new: { io: "value" },
        slots: { table: cw.slots },
      },
      cache: true,
      grid: cw.grid,
      // Behind the check, the write dispatches the workgroups the gate allows (none on a NaN).
      ...(checks ? { indirect: { io: "args" } as const } : {}),
    });
    kernels.push(cw.kernel.key);
  }
  const out = outputWords(s.dtype, s.num_tokens * L.num_heads * L.head_size);
  const lseWords = s.num_tokens * L.num_heads;
  const [fo, fl] = await Promise.all([
    planFill(ctx, out.words, out.pattern, table),
    planFill(ctx, lseWords, 0x7fc00000, table),
  ]);
  calls.push(...poisonCalls(fo, fl));
  const att = await attention(table);
  calls.push(...att.calls);
  kernels.push(...att.kernels);
  checkBindingLimits(ctx, s, att.scratch);
  const maxDim = ctx.limits.maxComputeWorkgroupsPerDimension ?? 65535;
  for (const c of calls) {
    if (c.grid[1] > maxDim) {
      throw limitError(
        c.name,
        c.grid[0] * c.grid[1],
        maxDim ** 2,
        "maxComputeWorkgroupsPerDimension",
      );
    }
  }
  return {
    ctx,
    table: table.bytes(),
    checks_finite: checks,
    calls,
    scratch: att.scratch,
    out_bytes: out.words * 4,
    lse_bytes: lseWords * 4,
    kernels,
    cache_layout: s.cache_spec ? chunkKeyOf(kvChunkGeometry(ctx, s.cache_spec)) : null,
    info: att.info ?? {},
    plan_ms: performance.now() - t0,
  };
}
