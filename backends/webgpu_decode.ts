/**
 * WEBGPU_DECODE: flash decoding (split-KV) for decode batches (one query per request).
 * Each request's visible keys are cut into slices; one workgroup per (slice, kv head) reads
 * every K/V byte of its slice once for all query heads of the GQA group (coalesced
 * vec4<u32> loads, f32 online softmax, no barrier per key; wgsl/decode_split.wgsl), and a
 * reduce pass merges the slices by their max and sum and adds the sink
 * (wgsl/decode_reduce.wgsl). {@link plan} validates the batch, picks the slice length from
 * the context lengths and a target workgroup count, compiles (cached) pipelines and builds
 * the uniforms; {@link run} writes the new K/V (gpu/cache_write.ts), dispatches both passes
 * in one submission and reads output + LSE back through one staging buffer. Needs
 * `shader-f16` (half and e5m2 caches decode through `bitcast<vec2<f16>>`); uses subgroup
 * shuffles when `subgroups` was granted, else a workgroup-memory reduction.
 * @module
 */
import { roundArray } from "../core/dtype.ts";
import { DeviceUnavailableError, invalidBatch, type Issue, ServiceError } from "../core/errors.ts";
import type {
  AttentionBackend,
  BackendContext,
  ForwardBatch,
  ForwardResult,
  GpuContext,
  KvCacheSpec,
  SelectorConfig,
  StorageDType,
} from "../core/types.ts";
import { BatchBuffers, dispatchSize, UniformBuilder } from "../gpu/batch_buffers.ts";
import { PassTimer } from "../gpu/timer.ts";
import { cacheWritePipeline, encodeCacheWrite, validateCacheWrite } from "../gpu/cache_write.ts";
import { GpuKvCache } from "../gpu/kv_cache.ts";
import { getComputePipeline } from "../gpu/pipelines.ts";
import { dtypeTag, elementsPerWord, kvAccessors, loadWgsl, specialize } from "../gpu/wgsl.ts";

/** Knobs of the kernel shape and the split heuristic (exported for benchmarks and tests). */
export interface DecodeTuning {
  /** Invocations per workgroup (a multiple of the lanes per key); 0: 128 on GPUs, one key
   * group on software adapters. */
  workgroup_size: number;
  /** Keys per key-group step (1, 2, 4, 8 or 16); 0: 4 on GPUs, 1 on software adapters. */
  keys_per_iter: number;
  /** KV heads per key group (a divisor of num_kv_heads); 0: 1 on GPUs, on software
   * adapters as many as max_flat_heads allows (whole token slots per SIMD batch). */
  kv_heads_per_group: number;
  /** Most lanes per key row (a power of two; also capped by the subgroup size). */
  max_lanes: number;
  /** Most lanes per key row without subgroups (each lane then reads lanes x keys x heads
   * partial sums from workgroup memory per step). */
  fallback_lanes: number;
  /** Most query heads per kv head in one workgroup (a larger GQA group is tiled). */
  max_heads: number;
  /** Most query heads (kv heads x group) one key group keeps state for. */
  max_flat_heads: number;
  /** Split-pass workgroups the split count aims for; 0: 2048 on GPUs, 4 per CPU core on
   * software adapters. */
  target_workgroups: number;
  /** Fewest keys per slice. */
  min_split_keys: number;
  /** false: never use subgroup operations (the workgroup-memory fallback). */
  subgroups: boolean;
  /** Load the value rows together with the key rows (before the softmax). */
  early_values: boolean;
}

/** The defaults; change a copy and pass it to {@link makeWebGpuDecode}. */
export const DEFAULT_DECODE_TUNING: Readonly<DecodeTuning> = Object.freeze({
  workgroup_size: 0,
  keys_per_iter: 0,
  kv_heads_per_group: 0,
  max_lanes: 32,
  fallback_lanes: 8,
  max_heads: 8,
  max_flat_heads: 32,
  target_workgroups: 0,
  min_split_keys: 64,
  subgroups: true,
  early_values: true,
});

/** Head sizes compiled and tested. */
export const DECODE_HEAD_SIZES = [64, 80, 96, 112, 128, 192, 256];

/** What {@link plan} prepares for {@link run}. */
export interface DecodePlan {
  gpu: GpuContext;
  cache: GpuKvCache;
  split: GPUComputePipeline;
  reduce: GPUComputePipeline;
  /** The split pipeline's key, e.g. `decode[f16]:hd128:bs16:g4:kh1:lpk16:u4:wg128:NHD:c1:q16:sg`. */
  key: string;
  params: UniformBuilder;
  meta: Uint32Array;
  splitGrid: [number, number];
  reduceGrid: [number, number];
  partBytes: number;
  num_items: number;
  /** The query is uploaded as f16 (float16 batches). */
  q16: boolean;
  /** Keys per slice. */
  split_keys: number;
  plan_ms: number;
}

const NAME = "WEBGPU_DECODE";

function isSoftware(gpu: GpuContext): boolean {
  const a = gpu.adapter_info;
  return a.is_fallback_adapter === true ||
    /llvmpipe|lavapipe|swiftshader|warp/i.test(a.description);
}

/** Checks that `batch` is a decode batch this backend can run on `cache`; throws 422. */
function checkBatch(batch: ForwardBatch, cache: KvCacheSpec): void {
  const L = batch.layer, md = batch.metadata;
  const is: Issue[] = [];
  const add = (path: (string | number)[], message: string) =>
    is.length < 50 && is.push({ path, message });
  if (L.attn_type !== "decoder" && L.attn_type !== "encoder_decoder") {
    add(["layer", "attn_type"], `${NAME} runs decoder and encoder_decoder, got ${L.attn_type}`);
  }
  if (L.num_kv_heads < 1 || L.num_heads % L.num_kv_heads !== 0) {
    add(
      ["layer", "num_heads"],
      `${L.num_heads} is not a multiple of num_kv_heads ${L.num_kv_heads}`,
    );
  }
  if (!DECODE_HEAD_SIZES.includes(L.head_size)) {
    add(["layer", "head_size"], `${L.head_size} not supported (${DECODE_HEAD_SIZES.join(", ")})`);
  }
  if (cache.num_kv_heads !== L.num_kv_heads || cache.head_size !== L.head_size) {
    add(
      ["kv_cache"],
      `is [.., ${cache.num_kv_heads} kv heads, head ${cache.head_size}] but the layer has ` +
        `${L.num_kv_heads} kv heads, head ${L.head_size}`,
    );
  }
  if (![16, 32, 64].includes(cache.block_size)) {
    add(["kv_cache", "block_size"], `${cache.block_size} not supported (16, 32, 64)`);
  }
  const T = batch.num_tokens;
  if (batch.query.length !== T * L.num_heads * L.head_size) {
    add(
      ["query"],
      `has ${batch.query.length} elements, expected ${T}x${L.num_heads}x${L.head_size}`,
    );
  }
  const qsl = md.query_start_loc;
  if (qsl.length !== md.num_reqs + 1 || qsl[0] !== 0 || qsl[md.num_reqs] !== T) {
    add(["metadata", "query_start_loc"], `must run from 0 to num_tokens ${T}`);
  }
  for (let i = 0; i < md.num_reqs; i++) {
    const ql = qsl[i + 1] - qsl[i], S = md.seq_lens[i];
    if (ql < 0 || ql > 1) {
      add(
        ["metadata", "query_start_loc", i + 1],
        `query length ${ql} > 1 not supported (decode-only backend)`,
      );
    }
    if (S < ql || (L.attn_type === "decoder" && S < 1 && ql > 0)) {
      add(["metadata", "seq_lens", i], `${S} is too short for query length ${ql}`);
    }
    const need = Math.ceil(S / cache.block_size);
    if (need > md.max_blocks_per_req) {
      add(
        ["metadata", "block_table", i],
        `has ${md.max_blocks_per_req} blocks, seq_len ${S} needs ${need}`,
      );
    }
    for (let b = 0; b < Math.min(need, md.max_blocks_per_req); b++) {
      const id = md.block_table[i * md.max_blocks_per_req + b];
      if (!(id >= 0 && id < cache.num_blocks)) {
        add(
          ["metadata", "block_table", i, b],
          `block id ${id} out of range [0, ${cache.num_blocks})`,
        );
      }
    }
  }
  if (is.length) throw invalidBatch(is);
}

/** The largest divisor of `g` not above `max`. */
function headTile(g: number, max: number): number {
  for (let d = Math.min(g, max); d > 1; d--) if (g % d === 0) return d;
  return 1;
}

/** The compile-time shape of one split kernel. */
interface KernelShape {
  /** Query heads per kv head in the workgroup, kv heads per key group, keys per step. */
  hg: number;
  kh: number;
  u: number;
  lpk: number;
  /** vec4<u32> columns per lane per row; elements per word; key groups per workgroup. */
  cpl: number;
  epw: number;
  nkg: number;
  sg: boolean;
  alibi: boolean;
  /** Issue the value rows' loads together with the keys' (before the softmax). */
  early_v: boolean;
  /** Decoders of a vec4<u32> `w` into EPW vec4<f32>, in element order. */
  dec: string[];
}

const DECODERS: Record<StorageDType, string[]> = {
  float32: ["bitcast<vec4<f32>>(w)"],
  float16: [
    "vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y))",
    "vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w))",
  ],
  bfloat16: ["vec4<f32>(bf2(w.x), bf2(w.y))", "vec4<f32>(bf2(w.z), bf2(w.w))"],
  fp8_e4m3: ["e4m3x4(w.x)", "e4m3x4(w.y)", "e4m3x4(w.z)", "e4m3x4(w.w)"],
  fp8_e5m2: ["e5m2x4(w.x)", "e5m2x4(w.y)", "e5m2x4(w.z)", "e5m2x4(w.w)"],
};

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/**
 * The straight-line fragments of decode_split.wgsl (INIT, STEP, STORE, GSUM), unrolled over
 * flat heads f = kh * hg + h, keys u < U, lane columns j < cpl and words e < epw; the value
 * vec4 i = j * epw + e of a lane sits at vec4 (lane + j * lpk) * epw + e of its head's row.
 */
function generate(k: KernelShape): Record<string, string> {
  const F = range(k.kh * k.hg),
    KH = range(k.kh),
    Us = range(k.u),
    J = range(k.cpl),
    E = range(k.epw);
  const NV = range(k.cpl * k.epw);
  const off = (f: number, i: number) =>
    `${f}u * D4 + ${Math.floor(i / k.epw) * k.lpk * k.epw + (i % k.epw)}u`;
  const init: string[] = [];
  for (const f of F) {
    init.push(`  var m${f} = NEG;`, `  var l${f} = 0.0;`);
    init.push(
      `  let sl${f} = ${k.alibi ? `bitcast<f32>(tab[P.slope_off + hq0 + ${f}u])` : "0.0"};`,
    );
    for (const i of NV) {
      init.push(`  let q${f}_${i} = qv(qb + ${off(f, i)});`, `  var a${f}_${i} = vec4<f32>(0.0);`);
    }
  }
  const st: string[] = [];
  // One row of kv head kh for key u: load each lane column, decode, and apply `body`.
  const rows = (
    t: "k" | "v",
    u: number,
    kh: number,
    body: (f: number, i: number, e: number) => string,
  ) => {
    for (const j of J) {
      const w = k.early_v && t === "v"
        ? `vw${u}_${kh}_${j}`
        : `load_${t}4(b${u}, r${u}_${kh} + ${j * k.lpk * 4}u)`;
      st.push("    {", `      let w = ${w};`);
      for (const e of E) st.push(`      let x${e} = ${k.dec[e]};`);
      for (const e of E) {
        for (const h of range(k.hg)) st.push(`      ${body(kh * k.hg + h, j * k.epw + e, e)}`);
      }
      st.push("    }");
    }
  };
  for (const u of Us) {
    st.push(`    let kc${u} = min(k0 + ${u}u, ke - 1u);`, `    let b${u} = block_of(bt, kc${u});`);
    for (const kh of KH) {
      st.push(`    let r${u}_${kh} = row_word(kc${u} % BS, kvh0 + ${kh}u) + lw;`);
    }
  }
  // The value rows' loads go out with the keys' (more bytes in flight), when early_v.
  for (const u of k.early_v ? Us : []) {
    for (const kh of KH) {
      for (const j of J) {
        st.push(`    let vw${u}_${kh}_${j} = load_v4(b${u}, r${u}_${kh} + ${j * k.lpk * 4}u);`);
      }
    }
  }
  for (const u of Us) {
    for (const f of F) st.push(`    var s${u}_${f} = 0.0;`);
    for (const kh of KH) rows("k", u, kh, (f, i, e) => `s${u}_${f} += dot(q${f}_${i}, x${e});`);
  }
  const S = Us.flatMap((u) => F.map((f) => `s${u}_${f}`));
  if (k.lpk > 1 && k.sg) st.push(...S.map((v) => `    ${v} = gsum(${v});`));
  if (k.lpk > 1 && !k.sg) {
    st.push(...S.map((v, i) => `    red[lid * UF + ${i}u] = ${v};`), "    workgroupBarrier();");
    st.push(...S.map((v, i) => `    ${v} = rsum(lid, ${i}u);`), "    workgroupBarrier();");
  }
  // Online softmax: rescale only when the running max grows (rare after the first keys;
  // the condition is the same in every lane of a key group).
  for (const f of F) {
    const mx = Us.map((u) => `s${u}_${f}`).reduce((a, b) => `max(${a}, ${b})`);
    for (const u of Us) st.push(`    s${u}_${f} = logit(s${u}_${f}, k0 + ${u}u, ke, pos, sl${f});`);
    st.push(`    if (${mx} > m${f}) {`, `      let mx = ${mx};`, `      let al = exp(m${f} - mx);`);
    st.push(
      `      l${f} *= al;`,
      ...NV.map((i) => `      a${f}_${i} *= al;`),
      `      m${f} = mx;`,
      "    }",
    );
    for (const u of Us) {
      st.push(`    let p${u}_${f} = select(0.0, exp(s${u}_${f} - m${f}), k0 + ${u}u < ke);`);
    }
    st.push(`    l${f} += ${Us.map((u) => `p${u}_${f}`).join(" + ")};`);
  }
  for (const u of Us) {
    for (const kh of KH) {
      rows("v", u, kh, (f, i, e) => `a${f}_${i} += p${u}_${f} * x${e};`);
    }
  }
  const sto: string[] = [];
  if (k.nkg === 1) {
    for (const f of F) {
      for (const i of NV) sto.push(`  part[ob + ${off(f, i)}] = a${f}_${i};`);
      sto.push(
        "  if (lane == 0u) {",
        `    part[mlb + ${f}u] = vec4<f32>(m${f}, l${f}, 0.0, 0.0);`,
        "  }",
      );
    }
  } else {
    sto.push(
      "  if (lane == 0u) {",
      ...F.map((f) => `    wml[kg * F + ${f}u] = vec2<f32>(m${f}, l${f});`),
      "  }",
    );
    sto.push("  workgroupBarrier();", ...F.map((f) => `  let c${f} = exp(m${f} - wmax(${f}u));`));
    sto.push("  for (var r = 0u; r < NKG; r++) {", "    if (kg == r) {");
    for (const f of F) {
      for (const i of NV) {
        sto.push(`      wput(r, ${off(f, i)} + lane * EPW, a${f}_${i} * c${f});`);
      }
    }
    sto.push("    }", "    workgroupBarrier();", "  }");
    sto.push(
      "  for (var i = lid; i < F * D4; i += WG) {",
      "    part[ob - lane * EPW + i] = wacc[i];",
      "  }",
    );
    sto.push(
      "  if (lid < F) {",
      "    let mx = wmax(lid);",
      "    part[mlb + lid] = vec4<f32>(mx, wsum(lid, mx), 0.0, 0.0);",
      "  }",
    );
  }
  // Butterfly over the lanes of a key group, unrolled: constant masks become permutes.
  const masks = range(Math.log2(k.lpk)).map((i) => k.lpk >> (i + 1));
  const gsum = !k.sg ? "" : [
    "fn gsum(x: f32) -> f32 {",
    "  var v = x;",
    ...masks.map((m) => `  v += subgroupShuffleXor(v, ${m}u);`),
    "  return v;",
    "}",
  ].join("\n");
  return { INIT: init.join("\n"), STEP: st.join("\n"), STORE: sto.join("\n"), GSUM: gsum };
}

/** Builds the backend with `tuning` (the registry uses {@link WEBGPU_DECODE}). */
export function makeWebGpuDecode(
  tuning: DecodeTuning = { ...DEFAULT_DECODE_TUNING },
): AttentionBackend<DecodePlan> {
  async function plan(batch: ForwardBatch, bctx: BackendContext): Promise<DecodePlan> {
    const t0 = performance.now();
    const gpu = bctx.gpu;
    if (!gpu || gpu.lost) throw new DeviceUnavailableError(`${NAME} needs a live WebGPU device`);
    const cache = batch.cache;
    if (!(cache instanceof GpuKvCache)) {
      throw new ServiceError(
        `${NAME} needs a webgpu KV cache, got storage "${cache?.storage ?? "none"}"`,
        {
          status: 422,
          code: "cache_storage_mismatch",
          extra: { storage: cache?.storage ?? null },
        },
      );
    }
    cache.assertUsable(gpu);
    checkBatch(batch, cache.spec);
    const writes = batch.key !== null && batch.value !== null &&
      batch.metadata.slot_mapping.length > 0;
    if (writes) {
      validateCacheWrite(cache, {
        key: batch.key!,
        value: batch.value!,
        slot_mapping: batch.metadata.slot_mapping,
      });
    }
    const L = batch.layer, md = batch.metadata, T = batch.num_tokens;
    const H = L.num_heads, Hkv = L.num_kv_heads, D = L.head_size, bs = cache.spec.block_size;
    const g = cache.geometry, st = g.storage_dtype;
    const epw = elementsPerWord(st), rw = D / epw, rv = rw / 4;
    const sg = tuning.subgroups && gpu.features.has("subgroups") &&
      (gpu.adapter_info.subgroup_min_size ?? 0) >= 4;
    // Lanes per row: a power of two dividing the row's vec4 count (butterfly sums).
    const lpk = Math.min(
      rv & -rv,
      tuning.max_lanes,
      sg ? gpu.adapter_info.subgroup_min_size! : tuning.fallback_lanes,
    );
    const group = H / Hkv, hg = headTile(group, tuning.max_heads), tiles = group / hg;
    const cpu = isSoftware(gpu);
    // Flat heads of a workgroup are hq0 + f only when the GQA group is not tiled.
    const kh = tiles > 1 ? 1 : headTile(
      Hkv,
      tuning.kv_heads_per_group || (cpu ? Math.max(1, Math.floor(tuning.max_flat_heads / hg)) : 1),
    );
    const F = kh * hg;
    const u = Math.min(tuning.keys_per_iter || (cpu ? 1 : 4), bs);
    // Workgroup size: a multiple of lpk, shrunk until its workgroup memory fits.
    const wsLimit = gpu.limits.maxComputeWorkgroupStorageSize ?? 16384;
    let wg = Math.max(
      lpk,
      Math.floor((tuning.workgroup_size || (cpu ? Math.max(8, lpk) : 128)) / lpk) * lpk,
    );
    const shared = (w: number) =>
      (sg ? 4 : w * u * F * 4) + (w / lpk) * F * 8 + (w > lpk ? F * D * 4 : 16);
    while (wg > lpk && shared(wg) > wsLimit) wg = Math.max(lpk, (wg / 2 / lpk | 0) * lpk);
    const nkg = wg / lpk, step = nkg * u;
    const earlyV = tuning.early_values;

    // Key ranges, then the slice length from the total work and the workgroup target.
    const w = L.sliding_window;
    const ranges: [number, number, number, number][] = []; // req, token, begin, end
    let keys = 0;
    for (let i = 0; i < md.num_reqs; i++) {
      if (md.query_start_loc[i + 1] - md.query_start_loc[i] !== 1) continue;
      const S = md.seq_lens[i], b = w === null ? 0 : Math.max(0, S - w);
      ranges.push([i, md.query_start_loc[i], b, S]);
      keys += S - b;
    }
    const target = tuning.target_workgroups ||
      (cpu ? 4 * Math.max(1, navigator.hardwareConcurrency ?? 2) : 2048);
    const perItem = (Hkv / kh) * tiles;
    let split = Math.max(tuning.min_split_keys, Math.ceil(keys / Math.max(1, target / perItem)));
    const partLimit = Math.min(
      gpu.limits.maxStorageBufferBindingSize ?? 2 ** 27,
      gpu.limits.maxBufferSize ?? 2 ** 28,
    );
    const countItems = (s: number) => ranges.reduce((n, r) => n + Math.ceil((r[3] - r[2]) / s), 0);
    split = Math.ceil(split / step) * step;
    while (countItems(split) * H * (D + 4) * 4 > partLimit && split < 2 ** 30) split *= 2;
    const items: number[] = [];
    const tokTable = new Uint32Array(2 * T);
    for (const [i, t, b, e] of ranges) {
      tokTable[2 * t] = items.length / 8;
      for (let k = b; k < e; k += split) {
        items.push(i, t, k, Math.min(e, k + split), 0, e - 1, 0, 0);
      }
      tokTable[2 * t + 1] = items.length / 8 - tokTable[2 * t];
    }
    const n = items.length / 8;
    for (let s = 0; s < n; s++) items[8 * s + 4] = s;
    const outFloats = T * H * D;
    if ((outFloats + H * T) * 4 > partLimit) {
      throw new ServiceError(`${NAME}: the output of ${T} tokens exceeds one storage binding`, {
        status: 422,
        code: "batch_too_large",
        extra: { num_tokens: T },
      });
    }
    // meta: items | block table | slopes | token table | sinks
    const btOff = items.length, slopeOff = btOff + md.block_table.length;
    const tokOff = slopeOff + H, sinkOff = tokOff + 2 * T;
    const meta = new Uint32Array(sinkOff + H);
    meta.set(items);
    meta.set(
      new Uint32Array(md.block_table.buffer, md.block_table.byteOffset, md.block_table.length),
      btOff,
    );
    if (L.alibi_slopes) {
      meta.set(new Uint32Array(Float32Array.from(L.alibi_slopes).buffer), slopeOff);
    }
    meta.set(tokTable, tokOff);
    if (L.sinks) meta.set(new Uint32Array(Float32Array.from(L.sinks).buffer), sinkOff);

    const fp8 = st === "fp8_e4m3" || st === "fp8_e5m2";
    const splitGrid = dispatchSize(gpu, n * perItem);
    const reduceGrid = dispatchSize(gpu, T * H);
    const params = new UniformBuilder()
      .u32(T).u32(H).u32(Hkv).u32(group).u32(n).u32(tiles).u32(md.max_blocks_per_req).u32(bs)
      .u32(btOff).u32(slopeOff).u32(tokOff).u32(sinkOff)
      .u32(n * H * D / 4).u32(outFloats).u32(splitGrid[0]).u32(reduceGrid[0])
      .u32(g.block_words).u32(g.blocks_per_chunk)
      .f32(L.scale * (fp8 ? L.k_scale : 1)).f32(L.logits_soft_cap ?? 1).f32(fp8 ? L.v_scale : 1)
      .u32(L.sinks ? 1 : 0).f32(-Infinity).u32(0);

    const cap = L.logits_soft_cap !== null, alibi = L.alibi_slopes !== null;
    const q16 = batch.dtype === "float16"; // exact in f16: half the query bytes
    const key = `decode[${dtypeTag(st)}]:hd${D}:bs${bs}:g${hg}:kh${kh}:lpk${lpk}:u${u}:wg${wg}:` +
      `${earlyV ? "ev:" : ""}` +
      `${cache.spec.layout}:c${g.nchunk}${q16 ? ":q16" : ""}${sg ? ":sg" : ""}${
        cap ? ":cap" : ""
      }` +
      `${alibi ? ":alibi" : ""}`;
    const [splitSrc, reduceSrc] = await Promise.all([
      loadWgsl("decode_split.wgsl"),
      loadWgsl("decode_reduce.wgsl"),
    ]);
    const code = specialize(splitSrc, {
      D,
      BS: bs,
      RW: rw,
      EPW: epw,
      LPK: lpk,
      U: u,
      WG: wg,
      HG: hg,
      KH: kh,
      QT: q16 ? "f16" : "f32",
      NHD: cache.spec.layout === "NHD",
      CAP: cap,
      ALIBI: alibi,
      RED: sg ? 1 : wg * u * F,
      WACC: nkg > 1 ? F * D / 4 : 1,
      ...generate({
        hg,
        kh,
        u,
        lpk,
        cpl: rv / lpk,
        epw,
        nkg,
        sg,
        alibi,
        early_v: earlyV,
        dec: DECODERS[st],
      }),
      KV: kvAccessors({
        nchunk: g.nchunk,
        blocksPerChunk: "P.blocks_per_chunk",
        blockWords: "P.block_words",
        firstBinding: 4,
        vec4: true,
      }),
    });
    const [split_p, reduce_p] = await Promise.all([
      getComputePipeline(gpu, key, code),
      getComputePipeline(gpu, `decode_reduce:hd${D}`, specialize(reduceSrc, { D })),
      writes ? cacheWritePipeline(gpu, cache) : null, // compiled here, not in run
    ]);
    return {
      gpu,
      cache,
      split: split_p,
      reduce: reduce_p,
      key,
      params,
      meta,
      splitGrid,
      reduceGrid,
      partBytes: Math.max(16, n * H * (D + 4) * 4),
      num_items: n,
      split_keys: split,
      q16,
      plan_ms: performance.now() - t0,
    };
  }

  async function run(
    p: DecodePlan,
    batch: ForwardBatch,
    bctx: BackendContext,
  ): Promise<ForwardResult> {
    const gpu = bctx.gpu ?? p.gpu;
    if (gpu.lost || gpu.device !== p.gpu.device) {
      throw new DeviceUnavailableError("the WebGPU device was lost");
    }
    p.cache.assertUsable(gpu);
    const t0 = performance.now();
    const T = batch.num_tokens, L = batch.layer, H = L.num_heads, D = L.head_size;
    const dev = gpu.device, bufs = new BatchBuffers(gpu, "decode");
    const timer = batch.num_tokens > 0 ? PassTimer.create(gpu) : null;
    try {
      const enc = dev.createCommandEncoder({ label: "decode" });
      const fp8 = p.cache.geometry.storage_dtype.startsWith("fp8");
      if (batch.key && batch.value && batch.metadata.slot_mapping.length > 0) {
        await encodeCacheWrite(gpu, enc, p.cache, {
          key: batch.key,
          value: batch.value,
          slot_mapping: batch.metadata.slot_mapping,
          k_scale: fp8 ? L.k_scale : 1,
          v_scale: fp8 ? L.v_scale : 1,
        }, bufs);
      }
      const tw = performance.now();
      const uni = bufs.uniform(p.params, "params");
      const meta = bufs.storage(p.meta, "meta");
      const result = bufs.poisoned(T * H * D + H * T, "result");
      if (T > 0) {
        const part = bufs.scratch(p.partBytes, "part");
        const q = bufs.storage(p.q16 ? new Float16Array(batch.query) : batch.query, "q");
        const pass = enc.beginComputePass({
          label: "decode",
          ...(timer ? { timestampWrites: timer.writes(0) } : {}),
        });
        pass.setPipeline(p.split);
        pass.setBindGroup(
          0,
          dev.createBindGroup({
            layout: p.split.getBindGroupLayout(0),
            entries: [
              { binding: 0, resource: { buffer: uni } },
              { binding: 1, resource: { buffer: q } },
              { binding: 2, resource: { buffer: meta } },
              { binding: 3, resource: { buffer: part } },
              ...p.cache.bindEntries(4),
            ],
          }),
        );
        if (p.num_items > 0) pass.dispatchWorkgroups(p.splitGrid[0], p.splitGrid[1]);
        pass.setPipeline(p.reduce);
        pass.setBindGroup(
          0,
          dev.createBindGroup({
            layout: p.reduce.getBindGroupLayout(0),
            entries: [
              { binding: 0, resource: { buffer: uni } },
              { binding: 1, resource: { buffer: meta } },
              { binding: 2, resource: { buffer: part } },
              { binding: 3, resource: { buffer: result } },
            ],
          }),
        );
        pass.dispatchWorkgroups(p.reduceGrid[0], p.reduceGrid[1]);
        pass.end();
      }
      const parts = [{ buffer: result, floats: T * H * D + (batch.return_lse ? H * T : 0) }];
      if (timer) parts.push(timer.resolve(enc, bufs));
      const read = bufs.readback(enc, parts);
      const tf = performance.now();
      const cmd = enc.finish();
      const te = performance.now();
      dev.queue.submit([cmd]);
      const t1 = performance.now();
      const [all, stamps] = await read();
      const gpuAttend = timer && stamps ? timer.ms(stamps, 0) : null;
      const t2 = performance.now();
      const output = roundArray(batch.dtype, all.subarray(0, T * H * D));
      const lse = batch.return_lse ? all.slice(T * H * D, T * H * D + H * T) : null;
      return {
        output: output.length === all.length ? output : output.slice(),
        lse,
        timings: {
          plan: p.plan_ms,
          encode: t1 - t0,
          encode_write: tw - t0,
          encode_attend: tf - tw,
          finish: te - tf,
          submit: t1 - te,
          gpu_and_readback: t2 - t1,
          ...(gpuAttend !== null ? { gpu_attend: gpuAttend } : {}),
        },
      };
    } finally {
      timer?.destroy();
      bufs.destroy();
    }
  }

  return {
    name: NAME,
    priority: 10,
    description: "Flash decoding (split-KV) WGSL kernels for single-token decode steps; " +
      "needs shader-f16, uses subgroups when granted.",
    capabilities: {
      dtypes: ["float32", "float16", "bfloat16"],
      kv_cache_dtypes: ["auto", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"],
      block_sizes: [16, 32, 64],
      head_sizes: [...DECODE_HEAD_SIZES],
      kv_cache_layouts: ["NHD", "HND"],
      attn_types: ["decoder", "encoder_decoder"],
      is_mla: false,
      sinks: true,
      sliding_window: true,
      alibi: true,
      logits_soft_cap: true,
      // With one query at position seq_len - 1 every key is at or before it: non-causal
      // decode sees exactly the causal keys.
      non_causal: true,
      sparse: false,
      mm_prefix: false,
      per_head_quant_scales: false,
      batch_invariant: false,
      kv_connector: false,
      lse: true,
      graph_support: "NEVER",
      reorder_batch_threshold: 1,
    },
    requires: { needs_device: true, features: ["shader-f16"], limits: {} },
    cache_storage: "webgpu",
    supportsCombination(cfg: SelectorConfig): string | null {
      const q = cfg.max_query_len;
      return q !== undefined && q > 1
        ? `query length ${q} > 1 not supported (decode-only backend)`
        : null;
    },
    createCache(spec, ctx) {
      if (!ctx.gpu) throw new DeviceUnavailableError(`${NAME} needs a WebGPU device`);
      return GpuKvCache.create(ctx.gpu, spec);
    },
    importCache(spec, key, value, ctx) {
      if (!ctx.gpu) throw new DeviceUnavailableError(`${NAME} needs a WebGPU device`);
      return GpuKvCache.fromBytes(ctx.gpu, spec, key, value);
    },
    plan,
    run,
  };
}

/**
 * The tuning of the registered backend: the defaults, overridden by the JSON object in the
 * `ATTN_DECODE_TUNING` environment variable when it is set and readable (for tuning runs,
 * e.g. `ATTN_DECODE_TUNING='{"workgroup_size":256,"keys_per_iter":2}'`).
 * @throws Error naming the variable when its value is not a JSON object of known numeric /
 *   boolean fields.
 */
export function envDecodeTuning(): DecodeTuning {
  let raw: string | undefined;
  try {
    raw = Deno.env.get("ATTN_DECODE_TUNING");
  } catch { /* no --allow-env: defaults */ }
  const t: DecodeTuning = { ...DEFAULT_DECODE_TUNING };
  if (!raw) return t;
  const o = JSON.parse(raw);
  for (const [k, v] of Object.entries(o ?? {})) {
    const cur = (t as unknown as Record<string, unknown>)[k];
    if (cur === undefined || typeof cur !== typeof v) {
      throw new Error(
        `ATTN_DECODE_TUNING: unknown field or wrong type: ${k} = ${JSON.stringify(v)}`,
      );
    }
    (t as unknown as Record<string, unknown>)[k] = v;
  }
  return t;
}

/** The registered WEBGPU_DECODE backend (default tuning, see {@link envDecodeTuning}). */
export const WEBGPU_DECODE: AttentionBackend<DecodePlan> = makeWebGpuDecode(envDecodeTuning());
