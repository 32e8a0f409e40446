/**
 * Tuning knobs of WEBGPU_DECODE (kernel shape and split heuristic), their defaults, and the
 * `ATTN_DECODE_TUNING` environment override used by the registered backend. The numeric fields'
 * rules live in backends/decode_tuning_rules.ts (re-exported here).
 * @module
 */
import { type EnvSetting, mustBe, readSetting } from "../core/env.ts";
import { decodeTuningProblem } from "./decode_tuning_rules.ts";

export {
  DECODE_TUNING_RULES,
  type DecodeTuningNumber,
  decodeTuningProblem,
  keepsTuningRule,
  type TuningRule,
  tuningRuleText,
} from "./decode_tuning_rules.ts";

/**
 * Knobs of the kernel shape and the split heuristic (exported for benchmarks and tests). Each
 * numeric field's values are ruled by {@link DECODE_TUNING_RULES} (`ATTN_DECODE_TUNING` refuses
 * a value that breaks its rule); a value within its rule that a layer, cache or device cannot
 * take is fitted at plan time as its comment says.
 */
export interface DecodeTuning {
  /** Invocations per workgroup; 0: 128 on GPUs, one key group on software adapters. Rounded
   * down to a multiple of the lanes per key row (at least one row's lanes), capped to the
   * largest such multiple within the device's invocations (`min(maxComputeInvocationsPerWorkgroup,
   * maxComputeWorkgroupSizeX)`, 256 where unreported: backends/decode_shape.ts), then halved
   * until the kernel's workgroup memory fits the device's. The rule's 1024 is the most any
   * WebGPU adapter grants (D3D12 and Metal fix it there). */
  workgroup_size: number;
  /** Keys per key-group step (a step's keys share a cache block: the rule's powers of two divide
   * every block size the split kernels read); 0: `gpu_keys_per_iter` on GPUs, 1 on software
   * adapters. Capped by the cache's block size. */
  keys_per_iter: number;
  /** What `keys_per_iter` 0 means on GPU adapters; 0: 4 for decode rows, 8 for prefill rows
   * (backends/prefill_split_tuning.ts: prefillSplitTuning, PREFILL_GPU_KEYS_PER_ITER). A value
   * named here is kept for both. */
  gpu_keys_per_iter: number;
  /** KV heads per key group; 0: 1 on GPUs, on software adapters as many as max_flat_heads
   * allows (whole token slots per SIMD batch). The largest divisor of num_kv_heads not above
   * it; 1 where the GQA group is tiled (over `max_heads`). */
  kv_heads_per_group: number;
  /** Most lanes per key row (butterfly sums: a power of two); also capped by the row's vec4
   * columns and the subgroup size. */
  max_lanes: number;
  /** Most lanes per key row without subgroups (each lane then reads lanes x keys x heads
   * partial sums from workgroup memory per step); also capped by the row's vec4 columns and
   * `max_lanes`. */
  fallback_lanes: number;
  /** Most query heads per kv head in one workgroup (a larger GQA group is tiled by its largest
   * divisor not above this). */
  max_heads: number;
  /** Most query heads (kv heads x group) one key group keeps state for (the software adapters'
   * automatic `kv_heads_per_group`). */
  max_flat_heads: number;
  /** Split-pass workgroups the split count aims for when `waves` is 0; 0: 2048 on GPUs, 4 per
   * CPU core on software adapters. */
  target_workgroups: number;
  /** 0: the slice length aims at `target_workgroups`. Otherwise the slices are cut from the
   * context lengths and the device's wave (backends/decode_split_policy.ts): the length that
   * minimises waves x (slice_overhead + length), using at most this many waves of
   * `wave_workgroups` (or what the uncut rows need); no split where cutting does not pay. */
  waves: number;
  /** Split-pass workgroups the device runs at once (one wave); 0: {@link GPU_WAVE_WORKGROUPS}
   * on GPUs (WebGPU reports no SM count: 132 SMs x 4, an H200 at four 128-lane workgroups an
   * SM, by guess), and on software adapters the CPU's threads (lavapipe runs one workgroup a
   * thread: a wave of 528 cut a 16 x 1024 decode into 256 workgroups and a reduce pass on 2
   * cores, bench/NOTES.md v0.32). */
  wave_workgroups: number;
  /** What a split workgroup costs beyond its keys (prologue, merge, partial), in keys: the
   * `waves` policy's price of one more slice. */
  slice_overhead: number;
  /** Fewest keys per slice. */
  min_split_keys: number;
  /** false: never use subgroup operations (the workgroup-memory fallback). */
  subgroups: boolean;
  /** Load the value rows together with the key rows (before the softmax). */
  early_values: boolean;
  /** Double-buffer the loads: issue the next step's K and V rows before this step's
   * arithmetic, so a key group keeps loads in flight while it computes. */
  prefetch: boolean;
  /** Rows cut into one slice write their output from the split pass (no partial, no reduce
   * workgroup; no reduce pass when every row is one slice). GPU shapes (several key groups a
   * workgroup) only. */
  direct_single: boolean;
  /** Fuse the reduce into the split pass: the last workgroup of a row's slices (an atomic
   * counter per row) merges the others' partials and writes the output; one dispatch
   * (wgsl/decode_fused.wgsl). GPU shapes only; implies `direct_single`. */
  fused_reduce: boolean;
  /** Copy a slice's block-table entries into workgroup memory once per workgroup instead of a
   * storage lookup per key step (when they fit in `stage_table_max` entries). */
  stage_table: boolean;
  /** Most block-table entries a workgroup stages (4 bytes each; also capped by the workgroup
   * memory left; 0: none staged). */
  stage_table_max: number;
  /** Sum a step's U x F partial dot products over the lanes of a key row by a transposed
   * reduction (reduce-scatter by recursive halving, all-gather by recursive doubling: ~2N
   * shuffles for N sums instead of N log2(lanes)); with subgroups only. */
  scatter_sums: boolean;
  /** The step's online softmax on the scattered sums (gpu/decode_scatter.ts): each lane takes
   * the logit and exp of its own scores only (not all U x F of them), the heads' maxima meet by a
   * few shuffles and the probabilities are gathered for the values; with subgroups only. */
  scatter_softmax: boolean;
  /** fp8 caches: decode each word's bytes in even / odd pairs into f16 bit positions, branch-free
   * (e4m3: about 15 integer ops a word and no inlined exact decoder, instead of 19 and a branch;
   * e5m2: 3 instead of 8; wgsl/decode_words.wgsl e4m3x4s, e5m2x4s), the query and the
   * accumulators in the matching (0, 2, 1, 3) order. */
  fp8_pairs: boolean;
  /** With `scatter_sums` or `scatter_softmax`: the all-gather after the halving by one indexed
   * subgroupShuffle per value from the lane holding it (N shuffles, no selects) instead of
   * recursive doubling (N - c shuffles, 2 (N - c) selects). */
  indexed_gather: boolean;
  /** The key dots as explicit fma chains into each score (`s = fma(q.w, k.w, fma(..., s))`) and
   * the value sums as vec4 fmas, instead of `s += dot(q, k)` (a multiply, three fmas and an add
   * per vec4: the compiler may not reassociate the add into the chain) and `a += p * x`. On an
   * H100 under Deno's runtime (bench/NOTES.md v0.27): prefill rows 1.45 -> 1.43 ms at 4 x 1024
   * causal and 40.8 -> 40.4 at 8 x 4096 with the prefill tuning, 2.23 -> 2.13 and 58.9 -> 55.6
   * without it; decode steps unchanged (0.110 ms, 0.725 -> 0.723 at 64 x 8192). */
  fma_dots: boolean;
  /** 2-byte and 1-byte caches: each lane of a key row takes 2 words (half a vec4 column) instead
   * of 4, so twice the lanes share a row (up to the subgroup size): half the query and accumulator
   * registers a lane (fp8 at head size 128: 16 lanes of 8 elements instead of 8 of 16) for one more
   * shuffle level. Each lane still issues a 16-byte load (two lanes the same address) and keeps
   * its half. */
  half_columns: boolean;
  /** `half_columns` for 1-byte (fp8) caches on GPU adapters only, whatever `half_columns` says:
   * at 16 elements a lane (8 lanes a row of head size 128) the query and accumulators of a GQA
   * group of 4 take 128 registers a lane; half columns halve that. */
  fp8_half_columns: boolean;
  /** fp8 e4m3 caches known to hold no NaN byte (gpu/kv_cache.ts `fp8_nan_free`) are decoded
   * without the NaN fix-up (about half a word's integer ops). */
  fp8_nan_free: boolean;
  /** Stream K/V tiles through workgroup memory: every invocation issues several independent
   * vec4<u32> loads of the next tile (the key groups' U keys each, K and V) into registers while
   * the key groups compute the current tile from workgroup memory (two barriers a tile). GPU and
   * software shapes; off (plain loads) where the tile is over `stage_kv_bytes` or the workgroup
   * memory left. Replaces `prefetch`. */
  stage_kv: boolean;
  /** Most workgroup-memory bytes of a staged K + V tile (also capped by the device's workgroup
   * memory; 0: never staged). */
  stage_kv_bytes: number;
  /** Kv head blocks (of `kv_heads_per_group`) one workgroup spans, its key groups spread over
   * them (key group kg serves block kg % n and the (kg / n)-th run of the slice): the
   * workgroup reads n adjacent rows of each token slot (NHD: n x 256 bytes of 2 KB at 8 kv heads
   * of head size 128 f16, instead of one row), and the dispatch has n times fewer workgroups of
   * n times the keys a key group. 1: one block (the v0.6 kernel). GPU shapes with an untiled
   * GQA group; the largest divisor of the blocks and key groups not above it (1 elsewhere);
   * `stage_kv` is off (plain loads) when it is over 1. */
  wg_kv_heads: number;
  /** Query tokens one workgroup spans, its key groups spread over them (key group kg serves
   * token kg % n and the (kg / n)-th run of the tokens' joint key range): n consecutive tokens
   * of one request read each K/V row once for all of them (two key groups of 16 lanes share a
   * subgroup's loads), where each token's workgroup otherwise reads its whole prefix again from
   * L2. For prefill rows: taken only where every row of the plan is one slice, the workgroup has
   * several key groups (GPU shapes, or a set `workgroup_size`), `wg_kv_heads` is 1 and `stage_kv`
   * off, and padding the requests' rows to multiples of n adds at most a quarter more (decode
   * rows, one a request, keep 1); the largest power of two not above it that divides the key
   * groups. 1: one token a workgroup. */
  wg_tokens: number;
  /** Each request's rows (its token groups under `wg_tokens`) dispatched from the longest key
   * range to the shortest instead of in token order, so that a causal prefill's longest rows
   * do not end the dispatch as a last wave of long workgroups (backends/decode_rows.ts
   * longestFirst). Requests keep their order. Decode steps (one row a request) are unchanged. */
  longest_first: boolean;
  /** GPU adapters' prefill rows take PREFILL_GPU_TUNING (backends/prefill_split_tuning.ts) for
   * the fields left at their defaults (prefillSplitTuning); false: they keep this tuning's fields
   * as they are. */
  prefill_gpu_tuning: boolean;
  /** Bench instrument: every split workgroup counts itself in and out of atomic counters, so
   * the bench reads how many were resident at once (gpu/decode_residency.ts). */
  probe_residency: boolean;
}

/** The `wave_workgroups` of GPU adapters when the tuning leaves it 0. */
export const GPU_WAVE_WORKGROUPS = 528;

/**
 * The defaults; change a copy and pass it to `makeWebGpuDecode` (backends/webgpu_decode.ts).
 * From the H200 sweeps of 2026-12-03 (bench/NOTES.md v0.5): `waves` 4 was the one knob fast in
 * every row of two runs (32 x 2048 f16 0.123 -> 0.104 ms, fp8 0.273 -> 0.210 ms, 64 x 8192
 * unchanged); `direct_single` stays off because its fp8 e4m3 test did not finish compiling in
 * 80-150 s on the H200 (twice), while the partial + reduce path passed there in 1 s. From the
 * v0.6 sweep (NOTES "v0.6 on the H200", call 3): `fp8_pairs` on, fp8 e4m3 32 x 2048 0.211 ->
 * 0.151-0.153 ms in both rows that had it, f16 and bf16 caches unchanged (0.103-0.104); the other
 * v0.6 knobs moved nothing that the run's slow rows did not also move, and stay off. From the
 * v0.11 runs (NOTES "v0.11 on the H200", calls 5 and 6, Dawn without robustness): `fused_reduce`
 * on (one dispatch, no reduce pass), 32 x 2048 f16 0.0978-0.0985 -> 0.0870-0.0876 ms and 64 x 8192
 * 0.579-0.587 -> 0.558-0.565 ms in both runs; the GPU suite on Dawn passed with it (371), fp8
 * e4m3's compile included (v0.5's stall was Dawn's tick loop, paced since v0.7). From the v0.13
 * sweep (NOTES "v0.13 on the H200", call 2): `fp8_half_columns` on, fp8 e4m3 32 x 2048 0.125 ->
 * 0.110 ms (half columns on f16 and bf16 caches: 0.087 -> 0.202, so those stay off).
 */
export const DEFAULT_DECODE_TUNING: Readonly<DecodeTuning> = Object.freeze({
  workgroup_size: 0,
  keys_per_iter: 0,
  gpu_keys_per_iter: 0,
  kv_heads_per_group: 0,
  max_lanes: 32,
  fallback_lanes: 8,
  max_heads: 8,
  max_flat_heads: 32,
  target_workgroups: 0,
  min_split_keys: 64,
  subgroups: true,
  early_values: true,
  prefetch: false,
  waves: 4,
  wave_workgroups: 0,
  slice_overhead: 192,
  direct_single: false,
  fused_reduce: true,
  stage_table: false,
  stage_table_max: 1024,
  scatter_sums: false,
  scatter_softmax: false,
  fp8_pairs: true,
  indexed_gather: false,
  fma_dots: true,
  half_columns: false,
  fp8_half_columns: true,
  fp8_nan_free: true,
  stage_kv: false,
  stage_kv_bytes: 32768,
  wg_kv_heads: 1,
  wg_tokens: 1,
  longest_first: false,
  prefill_gpu_tuning: true,
  probe_residency: false,
});

/** `ATTN_DECODE_TUNING`'s refusal of `text`, saying `why`. */
const badTuning = (text: string, why: string) =>
  mustBe(
    "ATTN_DECODE_TUNING",
    text,
    "a JSON object of DecodeTuning fields (backends/webgpu_decode_tuning.ts)",
    why,
  );

/**
 * `ATTN_DECODE_TUNING`: a JSON object whose fields are {@link DecodeTuning}'s own, each of its
 * default's type, each number within its rule ({@link DECODE_TUNING_RULES}), over the defaults
 * (unset or empty: the defaults).
 */
export const DECODE_TUNING_SETTING: EnvSetting<Readonly<DecodeTuning>> = {
  name: "ATTN_DECODE_TUNING",
  unset: DEFAULT_DECODE_TUNING,
  parse(text) {
    let o: unknown;
    try {
      o = JSON.parse(text);
    } catch (e) {
      throw badTuning(text, e instanceof Error ? e.message : String(e));
    }
    if (o === null || typeof o !== "object" || Array.isArray(o)) {
      throw badTuning(text, "not an object");
    }
    const t: Record<string, unknown> = { ...DEFAULT_DECODE_TUNING };
    for (const [k, v] of Object.entries(o)) {
      if (!Object.hasOwn(DEFAULT_DECODE_TUNING, k) || typeof t[k] !== typeof v) {
        throw badTuning(text, `unknown field or wrong type: ${k} = ${JSON.stringify(v)}`);
      }
      t[k] = v;
    }
    const problem = decodeTuningProblem(t as unknown as DecodeTuning);
    if (problem !== null) throw badTuning(text, problem);
    return t as unknown as DecodeTuning;
  },
};

/**
 * The tuning of the registered backend: the defaults, overridden by the JSON object in the
 * `ATTN_DECODE_TUNING` environment variable when it is set and readable (for tuning runs,
 * e.g. `ATTN_DECODE_TUNING='{"workgroup_size":256,"keys_per_iter":2}'`).
 * @throws EnvValueError naming the variable when its value is not a JSON object of known
 *   numeric / boolean fields, or a number breaks its rule ({@link DECODE_TUNING_SETTING}).
 */
export function envDecodeTuning(): DecodeTuning {
  return { ...readSetting(DECODE_TUNING_SETTING) };
}
