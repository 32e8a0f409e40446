/**
 * Grids folded into two dimensions: a 1-D grid over the device's
 * `maxComputeWorkgroupsPerDimension` is split into x and y (gpu/batch_buffers.ts dispatchSize)
 * and each kernel recovers its workgroup's id as `wg.x + wg.y * nwg_x`. Real devices grant
 * 65535 a dimension, so the suite's small batches never get y > 1; here the limit is lowered
 * (to about the square root of the largest grid) so that the cache write, the fill kernel, the
 * split-KV passes (split and reduce, decode and prefill rows) and the prefill tile kernel run
 * 2-D grids, some with more workgroups than the work needs (ids past it must do nothing). The
 * cache is compared byte for byte with core/dtype.ts's encoding, attention with CPU_REFERENCE
 * (tests/support/backend_check.ts), and every word of the filled buffer is checked.
 */
import assert from "node:assert/strict";
import { bytesPerElement, encode, resolveStorage } from "../../core/dtype.ts";
import { fromFloats, toFloat32 } from "../../core/data.ts";
import type { AttentionBackend, GpuContext, KvCacheSpec, KvLayout } from "../../core/types.ts";
import {
  DEFAULT_DECODE_TUNING,
  makeWebGpuDecode,
  WEBGPU_DECODE,
} from "../../backends/webgpu_decode.ts";
import { makeWebGpuFlash } from "../../backends/webgpu_flash.ts";
import { planCacheWrite, writeCache } from "../../gpu/cache_write.ts";
import { planFill } from "../../gpu/fill.ts";
import type { GpuPlan } from "../../gpu/gpu_plan.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { launch } from "../../gpu/launch.ts";
import { TableBuilder } from "../../gpu/plan_table.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { checkBackend } from "../support/backend_check.ts";
import { type BatchSpec, generateBatch, smallSpec } from "../support/batches.ts";
import { CACHE_WRITE_CASES, freshSeed, GPU, GPU_TEST, randomArray, rng } from "./helpers.ts";

const opts = GPU_TEST;

/** `ctx` granting only `max` workgroups a grid dimension. */
function limited(ctx: GpuContext, max: number): GpuContext {
  return { ...ctx, limits: { ...ctx.limits, maxComputeWorkgroupsPerDimension: max } };
}

/** The lowest limit that still holds `workgroups` (in two dimensions: x, y <= limit). */
const limitFor = (workgroups: number) => Math.max(2, Math.ceil(Math.sqrt(workgroups)));

const grid = (g: readonly [number, number]) => `${g[0]} x ${g[1]}`;

Deno.test(
  "2-D grid: the fill kernel writes every word below n_words, none past",
  opts,
  async () => {
    const base = GPU!, dev = base.device;
    for (const [max, words] of [[3, 7 * 256 + 37], [2, 3 * 256 + 1], [4, 16 * 256 - 5]]) {
      const ctx = limited(base, max);
      const r = rng(freshSeed());
      const table = new TableBuilder();
      const pattern = (r() * 2 ** 32) >>> 0;
      const p = await planFill(ctx, words, pattern, table);
      assert.ok(p.grid[1] > 1 && p.grid[0] <= max, `a 2-D grid: ${grid(p.grid)}`);
      // Room past n_words for every workgroup of the grid and then some, random to start with.
      const total = p.grid[0] * p.grid[1] * 256 + 64;
      const init = Uint32Array.from({ length: total }, () => (r() * 2 ** 32) >>> 0);
      for (let i = 0; i < words; i++) if (init[i] === pattern) init[i] ^= 1;
      const t = table.upload(ctx, "fill.table");
      const buf = dev.createBuffer({
        size: total * 4,
        usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
      });
      try {
        const res = await launch(ctx, {
          label: "fill_2d",
          uploads: [{ buffer: buf, data: new Uint8Array(init.buffer) }],
          calls: [{
            name: "fill",
            kernel: p.kernel,
            bind: { P: t.bind(p.params), dst: buf },
            grid: p.grid,
          }],
          reads: [{ buffer: buf, bytes: total * 4 }],
          timing: "none",
        });
        const got = new Uint32Array(res.parts[0].slice().buffer);
        res.release();
        for (let i = 0; i < total; i++) {
          const want = i < words ? pattern : init[i];
          if (got[i] !== want) {
            assert.fail(`${words} words on ${grid(p.grid)}: word ${i} is ${got[i]}, want ${want}`);
          }
        }
      } finally {
        buf.destroy();
        t.buffer.destroy();
      }
    }
  },
);

/** Where row (slot, head) of a cache starts, in elements. */
function rowElem(spec: KvCacheSpec, slot: number, h: number): number {
  const b = Math.floor(slot / spec.block_size), o = slot % spec.block_size;
  const { block_size: bs, num_kv_heads: kvh, head_size: hs } = spec;
  return spec.layout === "NHD" ? ((b * bs + o) * kvh + h) * hs : ((b * kvh + h) * bs + o) * hs;
}

Deno.test(
  "2-D grid: the cache write is byte-exact, every storage dtype, NHD/HND",
  opts,
  async (t) => {
    for (const [kv, dtype] of CACHE_WRITE_CASES) {
      for (const layout of ["NHD", "HND"] as KvLayout[]) {
        await t.step(`${kv}/${dtype} ${layout}`, async () => {
          const seed = freshSeed(), r = rng(seed);
          const spec: KvCacheSpec = {
            num_blocks: 6,
            block_size: 16,
            num_kv_heads: 2,
            head_size: 32,
            dtype,
            kv_cache_dtype: kv,
            layout,
          };
          const rows = 70, per = spec.num_kv_heads * spec.head_size;
          const storage = resolveStorage(kv, dtype), eb = bytesPerElement(storage);
          // Rows in the data dtype (rounded to it first), finite.
          const key = toFloat32(fromFloats(dtype, randomArray(r, rows * per, 4)));
          const value = toFloat32(fromFloats(dtype, randomArray(r, rows * per, 300)));
          const all = [...Array(spec.num_blocks * spec.block_size).keys()].sort(() => r() - 0.5);
          const slots = Int32Array.from({ length: rows }, (_, i) => (i % 9 === 4 ? -1 : all[i]));
          const half = spec.num_blocks * spec.block_size * per * eb;
          const init = {
            key: new Uint8Array(half).map(() => (r() * 256) | 0),
            value: new Uint8Array(half).map(() => (r() * 256) | 0),
          };
          const scales = { k_scale: 1, v_scale: 0.5 }; // exact in f32: fp8 stays byte-exact
          // The workgroups the write takes (a 1-D grid at the device's own limit).
          const wgs = (await planCacheWrite(GPU!, spec, dtype, slots, scales, new TableBuilder()))!
            .grid[0];
          const ctx = limited(GPU!, limitFor(wgs));
          const cache = await GpuKvCache.fromBytes(ctx, spec, init.key, init.value);
          try {
            const g = (await planCacheWrite(ctx, spec, dtype, slots, scales, new TableBuilder()))!
              .grid;
            assert.ok(g[1] > 1, `${wgs} workgroups on a 2-D grid: ${grid(g)}`);
            await writeCache(ctx, cache, {
              key: fromFloats(dtype, key),
              value: fromFloats(dtype, value),
              slot_mapping: slots,
              ...scales,
            });
            const got = await cache.read();
            for (
              const [name, src, start, scale, bytes] of [
                ["key", key, init.key, scales.k_scale, got.key],
                ["value", value, init.value, scales.v_scale, got.value],
              ] as const
            ) {
              const want = start.slice();
              slots.forEach((slot, tok) => {
                if (slot < 0) return;
                for (let h = 0; h < spec.num_kv_heads; h++) {
                  const row = src.subarray(
                    tok * per + h * spec.head_size,
                    tok * per + (h + 1) * spec.head_size,
                  )
                    .map((x) => (eb === 1 ? x / Math.fround(scale) : x));
                  want.set(encode(storage, row), rowElem(spec, slot, h) * eb);
                }
              });
              const i = want.findIndex((b, j) => b !== bytes[j]);
              assert.equal(
                i,
                -1,
                `${name} byte ${i}: got ${bytes[i]}, want ${want[i]} (${grid(g)}, seed ${seed})`,
              );
            }
          } finally {
            cache.destroy();
          }
        });
      }
    }
  },
);

/** `b`, recording the name and grid of each call of the plans it makes. */
function recording(b: AttentionBackend, calls: [string, readonly [number, number]][]) {
  return {
    ...b,
    plan: async (...a: Parameters<AttentionBackend["plan"]>) => {
      const p = await b.plan(...a) as GpuPlan;
      for (const c of p.calls) calls.push([c.name, c.grid]);
      return p;
    },
  } as AttentionBackend;
}

/**
 * The most workgroups any call of `b`'s plan for a batch of `s` has, on the suite's device.
 * The same shape is then planned at the lowered limit: a plan's prefix (cache write, finite
 * check, poison) is kept per shape key (gpu/plan_prefix.ts), and before that key held
 * maxComputeWorkgroupsPerDimension the lowered plan got this plan's 1-D prefix, its grids past
 * the limit (cache_write 40 x 1 at a limit of 9; the tests below failed then).
 */
async function largestGrid(b: AttentionBackend, s: BatchSpec): Promise<number> {
  const g = generateBatch(s, freshSeed());
  const cache = await GpuKvCache.fromBytes(GPU!, g.cache_spec!, g.key_cache, g.value_cache);
  try {
    const p = await b.plan(validHostBatch(g.batch, cache), { gpu: GPU }) as GpuPlan;
    try {
      assert.ok(p.calls.every((c) => c.grid[1] === 1), "1-D grids at the device's own limit");
      return Math.max(...p.calls.map((c) => c.grid[0] * c.grid[1]));
    } finally {
      b.disposePlan?.(p);
    }
  } finally {
    cache.destroy();
  }
}

/** 16 decode requests of 5 to 140 keys. */
const DECODE_ROWS = Array.from({ length: 16 }, (_, i) => ({ query_len: 1, seq_len: 5 + 9 * i }));

/**
 * Backend, batch, the calls that must run on a 2-D grid where the plan has them (names differ
 * between devices: a GPU's fused reduce has no pass of its own, the tensor-core prefill is
 * `prefill_mma`), and how many of them the plan has at least.
 */
const ATTENTION: [string, AttentionBackend, BatchSpec, RegExp, number][] = [
  [
    // On a GPU the reduce is fused into the split pass, and these short rows are not cut.
    "WEBGPU_DECODE: decode rows",
    WEBGPU_DECODE,
    smallSpec({ requests: [...DECODE_ROWS, { query_len: 3, seq_len: 60, pad: 1 }] }),
    /^(cache_write|decode_split|decode_reduce)$/,
    2,
  ],
  [
    // Rows cut into slices (16 keys at least; a step's keys on a GPU) and every row through a
    // reduce pass of its own (nothing fused, no direct single-slice rows), on every adapter.
    "WEBGPU_DECODE with a reduce pass: decode rows",
    makeWebGpuDecode({
      ...DEFAULT_DECODE_TUNING,
      fused_reduce: false,
      direct_single: false,
      waves: 0,
      target_workgroups: 4096,
      min_split_keys: 16,
    }),
    smallSpec({ requests: [...DECODE_ROWS, { query_len: 3, seq_len: 60, pad: 1 }] }),
    /^(cache_write|decode_split|decode_reduce)$/,
    3,
  ],
  [
    "WEBGPU_FLASH: decode and prefill rows",
    // The tensor cores off: where they take the prefill rows (Dawn) their grid is small.
    makeWebGpuFlash({ tile: null, decode: { ...DEFAULT_DECODE_TUNING }, mma: false }),
    smallSpec({
      dtype: "bfloat16",
      layout: "HND",
      requests: [...DECODE_ROWS, { query_len: 16, seq_len: 40 }, { query_len: 9, seq_len: 9 }],
    }),
    /^(cache_write|decode_split|decode_reduce|prefill.*)$/,
    3,
  ],
  [
    "WEBGPU_FLASH on the prefill tiles: decode and prefill rows",
    makeWebGpuFlash({ tile: null, decode: { ...DEFAULT_DECODE_TUNING }, prefill_split: false }),
    smallSpec({
      requests: [
        ...DECODE_ROWS,
        ...Array.from({ length: 8 }, (_, i) => ({ query_len: 2 + i, seq_len: 20 + 3 * i })),
      ],
    }),
    /^(cache_write|decode_split|decode_reduce|prefill.*)$/,
    3,
  ],
];

for (const [name, backend, spec, must, least] of ATTENTION) {
  Deno.test(`2-D grid: ${name} match the reference`, opts, async () => {
    const max = limitFor(await largestGrid(backend, spec));
    const calls: [string, readonly [number, number]][] = [];
    await checkBackend(recording(backend, calls), limited(GPU!, max), spec);
    const all = calls.map(([n, g]) => `${n} ${grid(g)}`).join(", ");
    assert.ok(calls.some(([n]) => n.endsWith("_split")), `a split pass ran (${all})`);
    // The cache write, the split pass and (but for a GPU's fused reduce) the reduce or the
    // prefill's.
    const wanted = calls.filter(([n]) => must.test(n)).length;
    assert.ok(wanted >= least, `${wanted} calls of ${must}, at least ${least} (${all})`);
    for (const [n, g] of calls) {
      assert.ok(g[0] <= max && g[1] <= max, `${n} within the limit ${max} (${all})`);
      if (must.test(n)) assert.ok(g[1] > 1, `${n} on a 2-D grid at limit ${max} (${all})`);
    }
  });
}
