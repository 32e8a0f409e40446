/**
 * The split-KV kernel's shape for a layer, cache and device ({@link decodeShape}): subgroup
 * sums or workgroup memory, lanes per key row, query heads per workgroup (the GQA group, tiled
 * when larger than the tuning's max_heads), kv heads per key group, keys per step, workgroup
 * size capped to the device's invocations and shrunk until its workgroup memory fits, and the
 * split pass's workgroup target.
 * Software adapters get one key group per workgroup streaming whole token slots.
 * @module
 */
import type { GpuContext, KvCacheSpec, LayerSpec, StorageDType } from "../core/types.ts";
import { elementsPerWord } from "../gpu/wgsl.ts";
import { isSoftwareAdapter } from "../gpu/runtime_adapter.ts";
import { type DecodeTuning, GPU_WAVE_WORKGROUPS } from "./webgpu_decode_tuning.ts";
import { splitStorageBindings } from "../gpu/decode_kernels.ts";

/** A split-kernel shape. */
export interface DecodeShape {
  sg: boolean;
  lpk: number;
  /** Each lane takes half a vec4 column (2 words) of a row (tuning `half_columns`). */
  half: boolean;
  hg: number;
  tiles: number;
  kh: number;
  u: number;
  wg: number;
  /** Split-pass workgroups the slice length aims for. */
  target: number;
  /** Split-pass workgroups the device runs at once (`wave_workgroups`, resolved). */
  wave: number;
  /** vec4<u32>s of the staged K + V tile (`stage_kv`; 0: plain loads). */
  skv: number;
  /** Kv head blocks of KH a workgroup spans (`wg_kv_heads`; 1: one). */
  wh: number;
  /** Query tokens a workgroup may span (`wg_tokens`; 1: one): the plan takes it only for rows
   * of one slice each (backends/decode_plan_layout.ts orderItems). */
  wt: number;
  /** Bytes of workgroup memory of the kernel body, staged tile included (before an epilogue or
   * staged table). */
  shared: number;
  /** Bytes of workgroup memory the device grants. */
  shared_limit: number;
}

/** True for CPU (software) adapters (on either runtime: gpu/runtime_adapter.ts). */
export function isSoftware(gpu: GpuContext): boolean {
  return isSoftwareAdapter(gpu.adapter_info);
}

/** The largest divisor of `g` not above `max` (the query heads of a GQA group a key group keeps). */
export function headTile(g: number, max: number): number {
  for (let d = Math.min(g, max); d > 1; d--) if (g % d === 0) return d;
  return 1;
}

/** The shape for `layer` over a cache of `spec` (storage `st`) on `gpu`. */
export function decodeShape(
  gpu: GpuContext,
  tuning: DecodeTuning,
  layer: LayerSpec,
  spec: KvCacheSpec,
  st: StorageDType,
): DecodeShape {
  const D = layer.head_size, rv = D / elementsPerWord(st) / 4;
  const cpu = isSoftware(gpu);
  const { sg, half, lpk } = lanesOf(gpu, tuning, st, rv, cpu);
  const heads = headsOf(tuning, layer, cpu);
  const u = Math.min(
    tuning.keys_per_iter || (cpu ? 1 : tuning.gpu_keys_per_iter || 4),
    spec.block_size,
  );
  const wsLimit = gpu.limits.maxComputeWorkgroupStorageSize ?? 16384;
  // Workgroup bytes of `w` invocations spanning `wh` kv head blocks and `wt` tokens.
  const shared = (w: number, wh: number, wt: number) =>
    (sg ? 4 : w * u * heads.F * 4) + (w / lpk) * heads.F * 8 +
    (w > lpk ? wh * wt * (heads.F * D * 4 + heads.F * 8) : 24);
  const { wg, wh, wt } = spansOf(
    invocations(gpu, tuning, cpu, lpk),
    lpk,
    heads,
    layer.num_kv_heads,
    tuning,
    (w, wh, wt) => shared(w, wh, wt) <= wsLimit,
  );
  // The staged tile: (wg / lpk) key groups x u keys x kh rows of rv vec4s, for K and for V.
  const tile = 2 * (wg / lpk) * u * heads.kh * rv, tileBytes = 16 * tile;
  const skv = tuning.stage_kv && wh === 1 && wt === 1 && tileBytes <= tuning.stage_kv_bytes &&
      shared(wg, 1, 1) + tileBytes <= wsLimit
    ? tile
    : 0;
  const threads = Math.max(1, navigator.hardwareConcurrency ?? 2);
  return {
    sg,
    lpk,
    half,
    hg: heads.hg,
    tiles: heads.tiles,
    kh: heads.kh,
    u,
    wg,
    target: tuning.target_workgroups || (cpu ? 4 * threads : 2048),
    wave: tuning.wave_workgroups || (cpu ? threads : GPU_WAVE_WORKGROUPS),
    skv,
    wh,
    wt,
    shared: shared(wg, wh, wt) + 16 * skv,
    shared_limit: wsLimit,
  };
}

/**
 * Subgroup sums or not, half-vec4 lanes or not, and the lanes of a key row: a power of two
 * dividing the row's vec4 count (butterfly sums), or its half-vec4 count under `half_columns`
 * (2-byte and 1-byte storage: each lane takes 2 words of a vec4; 1-byte storage on GPUs also
 * under `fp8_half_columns`).
 */
function lanesOf(
  gpu: GpuContext,
  tuning: DecodeTuning,
  st: StorageDType,
  rv: number,
  cpu: boolean,
): { sg: boolean; half: boolean; lpk: number } {
  const sg = tuning.subgroups && gpu.features.has("subgroups") &&
    (gpu.adapter_info.subgroup_min_size ?? 0) >= 4;
  const epw = elementsPerWord(st);
  const halfOk = epw >= 2 &&
    (tuning.half_columns || (tuning.fp8_half_columns && epw === 4 && !cpu));
  const lpkOf = (cols: number) =>
    Math.min(
      cols,
      tuning.max_lanes,
      sg ? gpu.adapter_info.subgroup_min_size! : tuning.fallback_lanes,
    );
  const half = halfOk && lpkOf(2 * (rv & -rv)) >= 2;
  return { sg, half, lpk: lpkOf(half ? 2 * (rv & -rv) : rv & -rv) };
}

/** A workgroup's heads: the GQA group's tile (hg of `tiles`), kv heads a key group, flat heads. */
interface Heads {
  hg: number;
  tiles: number;
  kh: number;
  /** Flat heads of a key group (kh x hg). */
  F: number;
}

/** The heads of a workgroup for `layer` (see {@link Heads}). */
function headsOf(tuning: DecodeTuning, layer: LayerSpec, cpu: boolean): Heads {
  const group = layer.num_heads / layer.num_kv_heads, hg = headTile(group, tuning.max_heads);
  const tiles = group / hg;
  // Flat heads of a workgroup are hq0 + f only when the GQA group is not tiled.
  const kh = tiles > 1 ? 1 : headTile(
    layer.num_kv_heads,
    tuning.kv_heads_per_group || (cpu ? Math.max(1, Math.floor(tuning.max_flat_heads / hg)) : 1),
  );
  return { hg, tiles, kh, F: kh * hg };
}

/**
 * Invocations a workgroup before its memory is counted: the tuning's (0: 128 on GPUs, one key
 * group's lanes at least 8 on software adapters) as a multiple of `lpk`, within the device's
 * invocations (WebGPU grants at least 256; the tuning's rule allows 1024, which a device
 * granting fewer would not compile): its largest multiple of lpk.
 */
function invocations(gpu: GpuContext, tuning: DecodeTuning, cpu: boolean, lpk: number): number {
  const wg = Math.max(
    lpk,
    Math.floor((tuning.workgroup_size || (cpu ? Math.max(8, lpk) : 128)) / lpk) * lpk,
  );
  const maxInv = Math.min(
    gpu.limits.maxComputeInvocationsPerWorkgroup ?? 256,
    gpu.limits.maxComputeWorkgroupSizeX ?? 256,
  );
  return Math.max(lpk, Math.min(wg, Math.floor(maxInv / lpk) * lpk));
}

/**
 * The workgroup's invocations, halved from `wg0` until `fits` its memory, and the kv head
 * blocks (`wh`) and tokens (`wt`) it spans.
 */
function spansOf(
  wg0: number,
  lpk: number,
  heads: Heads,
  hkv: number,
  tuning: DecodeTuning,
  fits: (w: number, wh: number, wt: number) => boolean,
): { wg: number; wh: number; wt: number } {
  // Kv head blocks a workgroup may span: the GQA group untiled (its heads then contiguous).
  const blocks = hkv / heads.kh;
  const whMax = heads.tiles > 1 ? 1 : Math.min(tuning.wg_kv_heads || 1, blocks);
  // Tokens a workgroup may span: a power of two (the tuning's rule), with one kv head block.
  const wtMax = whMax > 1 ? 1 : Math.max(1, tuning.wg_tokens);
  let wg = wg0;
  while (wg > lpk && !fits(wg, whMax, 1)) wg = Math.max(lpk, (wg / 2 / lpk | 0) * lpk);
  let wh = Math.min(whMax, wg / lpk);
  // (The merge's last step takes one invocation a flat head of the workgroup: F wh <= wg.)
  while (wh > 1 && (blocks % wh !== 0 || (wg / lpk) % wh !== 0 || heads.F * wh > wg)) wh--;
  // Tokens (wtMax is 1 with kv head blocks): a divisor of the key groups whose merge state fits
  // beside the rest.
  let wt = Math.min(wtMax, wg / lpk);
  while (wt > 1 && ((wg / lpk) % wt !== 0 || !fits(wg, 1, wt))) wt = Math.floor(wt / 2);
  return { wg, wh, wt };
}

/** Workgroup bytes of the epilogue beyond the body's (its ticket). */
const EPILOGUE_SHARED = 16;

/**
 * How the split kernel ends (gpu/decode_kernels.ts `epi`): 2 with `fused_reduce`, 1 with
 * `direct_single`, else 0, on GPU shapes only (several key groups a workgroup: the merged state
 * sits in workgroup memory), while its storage bindings and the cache's `nchunk` chunks fit the
 * device's per-stage limit and the epilogue's workgroup memory fits.
 */
export function epilogueMode(
  gpu: GpuContext,
  tuning: DecodeTuning,
  s: DecodeShape,
  nchunk: number,
): number {
  const want = tuning.fused_reduce ? 2 : tuning.direct_single ? 1 : 0;
  const perStage = gpu.limits.maxStorageBuffersPerShaderStage ?? 8;
  const bindings = splitStorageBindings(want, tuning.probe_residency) + 2 * nchunk;
  if (want === 0 || s.wg <= s.lpk || bindings > perStage) return 0;
  return s.shared + EPILOGUE_SHARED <= s.shared_limit ? want : 0;
}

/**
 * Block-table entries a split workgroup stages in workgroup memory (`stage_table`): `most`, the
 * most blocks one work item spans, rounded up to a power of two (few kernel variants); 0
 * (lookups from storage) when off, over `stage_table_max` or over the workgroup memory left.
 */
export function stagedEntries(
  tuning: DecodeTuning,
  s: DecodeShape,
  epi: number,
  most: number,
): number {
  if (!tuning.stage_table) return 0;
  const tb = 2 ** Math.ceil(Math.log2(Math.max(1, most)));
  const shared = s.shared + (epi > 0 ? EPILOGUE_SHARED : 0) + 4 * tb;
  return tb <= tuning.stage_table_max && shared <= s.shared_limit ? tb : 0;
}
