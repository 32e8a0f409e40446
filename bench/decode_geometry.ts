/**
 * `deno run -A bench/decode_geometry.ts [--decode-tunings JSON] [--sm N]`: the
 * split-KV launch WEBGPU_DECODE would make for the bench's decode shapes on an H200-like
 * adapter, without a GPU: the kernel shape (backends/decode_shape.ts), the slice length
 * (backends/decode_split_policy.ts), slices a row, split workgroups and how many the busiest
 * of `sm` SMs gets when all are resident (132 SMs; 4 a SM is the guess behind
 * `wave_workgroups` 528, which the bench's residency probe measures: `probe_residency`),
 * key-group steps of a slice, and the reduce pass's workgroups. Each tuning is a partial one over the defaults, as in the bench.
 * @module
 */
import { parseArgs } from "node:util";
import { resolveStorage } from "../core/dtype.ts";
import type { GpuContext, KvCacheSpec, LayerSpec, StorageDType } from "../core/types.ts";
import { decodeShape, epilogueMode } from "../backends/decode_shape.ts";
import { sliceCount, sliceLength } from "../backends/decode_split_policy.ts";
import { type DecodeTuning, DEFAULT_DECODE_TUNING } from "../backends/webgpu_decode_tuning.ts";
import { type BenchShape, benchShapes, shapeName } from "./shapes.ts";

/** What the H200 reported (bench/NOTES.md): subgroups of 32, 48 KiB of workgroup memory. */
export const H200_LIKE = {
  adapter_info: {
    vendor: "nvidia",
    architecture: "",
    device: "",
    description: "NVIDIA H200 (stand-in)",
    subgroup_min_size: 32,
    subgroup_max_size: 32,
  },
  features: new Set(["subgroups", "shader-f16", "timestamp-query"]),
  limits: { maxComputeWorkgroupStorageSize: 49152, maxStorageBuffersPerShaderStage: 10 },
} as unknown as GpuContext;

/** One shape's launch under one tuning. */
export interface DecodeGeometry {
  lpk: number;
  hg: number;
  wg: number;
  wh: number;
  u: number;
  split_keys: number;
  slices_per_row: number;
  workgroups: number;
  /** The most split workgroups an SM gets, and on how many SMs (of `sm`). */
  per_sm_max: number;
  sms_at_max: number;
  /** Key-group steps of a full slice. */
  steps: number;
  /** 0: partials and a reduce pass; 1: uncut rows write their output; 2: fused reduce. */
  epilogue: number;
  reduce_workgroups: number;
}

/** The launch of decode shape `s` under `t` on `gpu` (see the module doc). */
export function decodeGeometry(
  t: DecodeTuning,
  s: BenchShape,
  gpu: GpuContext = H200_LIKE,
  sm = 132,
): DecodeGeometry {
  const st: StorageDType = resolveStorage(s.kv_cache_dtype, "float16");
  const layer = { num_heads: s.num_heads, num_kv_heads: s.num_kv_heads, head_size: s.head_size };
  const spec = { block_size: s.block_size } as KvCacheSpec;
  const sh = decodeShape(gpu, t, layer as LayerSpec, spec, st);
  const nkg = sh.wg / sh.lpk;
  const perItem = (s.num_kv_heads / sh.kh / sh.wh) * sh.tiles;
  const spans = Array(s.reqs).fill(s.ctx);
  const split = sliceLength(t, {
    spans,
    perItem,
    step: nkg * sh.u,
    target: sh.target,
    wave: sh.wave,
    weight: sh.wh,
  });
  const c = Math.ceil(s.ctx / split);
  const workgroups = sliceCount(spans, split) * perItem;
  let epi = epilogueMode(gpu, t, sh, 1);
  if (epi === 1 && c > 1) epi = 0;
  const perSm = Math.ceil(workgroups / sm);
  return {
    lpk: sh.lpk,
    hg: sh.hg,
    wg: sh.wg,
    wh: sh.wh,
    u: sh.u,
    split_keys: split,
    slices_per_row: c,
    workgroups,
    per_sm_max: perSm,
    sms_at_max: workgroups - (perSm - 1) * sm,
    steps: Math.ceil(Math.min(split, s.ctx) / ((nkg / sh.wh) * sh.u)),
    epilogue: epi,
    reduce_workgroups: epi === 2 || (epi === 1 && c === 1) ? 0 : s.reqs * s.num_heads,
  };
}

function main(): void {
  const { values: a } = parseArgs({
    args: Deno.args,
    options: { "decode-tunings": { type: "string" }, sm: { type: "string" } },
  });
  const list: Partial<DecodeTuning>[] = [
    {},
    ...JSON.parse(a["decode-tunings"] ?? Deno.env.get("BENCH_DECODE_TUNINGS") ?? "[]"),
  ];
  const sm = Number(a.sm ?? 132);
  const shapes = benchShapes(false).filter((s) => s.kind === "decode");
  for (const s of shapes.filter((x) => x.kv_cache_dtype === "auto")) {
    console.log(`== ${shapeName(s)} (H200-like: subgroup 32, ${sm} SMs)`);
    for (const o of list) {
      const g = decodeGeometry({ ...DEFAULT_DECODE_TUNING, ...o }, s, H200_LIKE, sm);
      console.log(
        `${JSON.stringify(o).padEnd(60)} lanes ${g.lpk} x ${g.wg / g.lpk} key groups, ` +
          `${g.wh} kv head(s) a wg, U ${g.u}: slices of ${g.split_keys} (${g.slices_per_row} a ` +
          `row), ${g.workgroups} split wg (${g.per_sm_max} on ${g.sms_at_max} SMs, one fewer ` +
          `on the rest), ${g.steps} steps, epi ${g.epilogue}, reduce wg ${g.reduce_workgroups}`,
      );
    }
  }
}

if (import.meta.main) main();
