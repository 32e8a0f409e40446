/**
 * Random hostile batches (issue 8): a seeded generator draws `RANDOM_BATCHES` (32; 6 on GL) small
 * configurations, and every registered backend, forced through the selector, runs each one
 * it accepts against CPU_REFERENCE's float64 run of the same batch.
 *
 * A configuration draws: the data dtype (float32, float16, bfloat16) and the KV cache dtype
 * (auto, float16, bfloat16, fp8 (vLLM's e4m3), fp8_e4m3, fp8_e5m2; fp8 with random k/v scales, e4m3 sometimes
 * NaN-free; a fifth of the other caches with k/v scales they must ignore), every pair of the two about equally often; the layout (NHD/HND); the block size
 * (16, 32, 48, 64, 128); the head size (32 … 256); 1, 2 or 4 KV heads at a GQA ratio of 1, 2,
 * 4 or 8; the attention type (decoder mostly; non-causal decoder, encoder, encoder_only,
 * encoder_decoder with or without new encoder K/V, without a window sometimes with fewer encoder
 * keys than queries); 1 to 6 requests, each a decode row, a
 * short multi-token decode (2-4 tokens: over the decode threshold), a chunked prefill, a full
 * prefill or an idle request (no query), with query lengths on either side of 16, 32 and 64
 * (tile edges) and contexts on either side of a block boundary; and, each on in about half the
 * batches, a sliding window (1 … 80), a logits soft cap (with larger queries so it bites), ALiBi,
 * sinks, LSE, and -1 padding slots. Sizes are capped (query-key pairs times heads times head
 * size) so the float64 reference stays cheap.
 *
 * Per batch (tests/support/batches.ts: random block permutation, a NaN null block, NaN in every
 * slot nothing may read) and backend, as in vllm_specs_test.ts: a refusal when forced must be
 * exactly the selector's reasons for that backend and configuration (check.ts
 * `forcedReasons`), and the step's name carries them; an accepted batch must run, its GPU plan
 * must poison the output (and LSE) before any call writes it (`assertPoisonsFirst`), and
 * `checkRun` compares it with CPU_REFERENCE at the usual tolerances (output, LSE, written cache
 * slots; every other cache byte unchanged). CPU_REFERENCE must accept every batch.
 *
 * The seed is fresh each run (check.ts `runSeed`), printed, and in every test's name:
 * `SEED=<seed> RANDOM_BATCHES=<count>` replays the run (the count shapes the draw), and
 * `RANDOM_BATCHES_ONLY=3,17` runs only those batches of it (numbered from 1). On a software
 * adapter the run is mostly kernel compiles: 32 batches took 31-47 s on lavapipe (2 cores),
 * 34-51 s with Mesa's shader cache off, and 12 minutes on llvmpipe through GL, where 6 are
 * drawn by default (about 2 minutes).
 * @module
 */
import assert from "node:assert/strict";
import { builtinBackends } from "../../backends/index.ts";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { BackendRegistry } from "../../backends/registry.ts";
import {
  ATTN_TYPES,
  type AttnType,
  type BackendContext,
  type DType,
  DTYPES,
  KV_CACHE_DTYPES,
  KV_LAYOUTS,
  type KvCacheDType,
} from "../../core/types.ts";
import {
  type BatchSpec,
  deriveSeed,
  generateBatch,
  type RequestSpec,
  Rng,
} from "../support/batches.ts";
import { GPU, SELECTION } from "../support/gpu.ts";
import { denoBackendApi } from "../../gpu/runtime.ts";
import {
  assertPoisonsFirst,
  checkRun,
  forcedReasons,
  runOn,
  runSeed,
  sharedReferences,
} from "./check.ts";

const SEED = runSeed();
/**
 * llvmpipe through GL compiles each new variant of the portable flash kernel in 10-75 s
 * (naga's zero initialisation of workgroup arrays; wgsl/README.md), and random batches are
 * mostly new variants: 32 batches took 12 minutes there, so GL draws 6 by default.
 */
const GL = SELECTION.runtime.name === "deno" && denoBackendApi().api === "gl";
const COUNT = Number(Deno.env.get("RANDOM_BATCHES") ?? (GL ? 6 : 32));
if (!Number.isInteger(COUNT) || COUNT < 1) throw new Error("RANDOM_BATCHES: a positive integer");
const ONLY = new Set(
  (Deno.env.get("RANDOM_BATCHES_ONLY") ?? "").split(",").filter((x) => x.trim()).map(Number),
);
const opts = { sanitizeOps: false, sanitizeResources: false };

const gpu = GPU;
const ctx: BackendContext = { gpu };
const registry = new BackendRegistry(builtinBackends(), () => gpu);

/** Most (query, visible key) pairs x query heads x head size of one batch (the reference's work). */
const WORK_BUDGET = 1.2e7;
const HEAD_SIZES = [32, 64, 64, 80, 96, 112, 128, 128, 160, 192, 256];
/** The odd part of a head size's count of 16-element groups: 1 for 32, 64, 128, 256; 5 for 80. */
const oddPart = (d: number) => (d / 16) / ((d / 16) & -(d / 16));
/**
 * The most query heads by head size. Compiles dominate a cold run on a software adapter, and
 * the split-KV kernel there keeps about the odd part of a row's vec4 count times a workgroup's
 * heads in each lane's registers: llvmpipe's compile of head size 80 with 16 q / 4 kv heads
 * takes 16 s, 32 / 4 takes 81 s, 112 with 16 / 4 31 s; 80 with 4 heads over an fp8 cache 8 s.
 */
const maxHeads = (d: number) => oddPart(d) >= 5 ? 2 : oddPart(d) > 1 ? 4 : d >= 256 ? 8 : 16;
const BLOCK_SIZES = [16, 16, 32, 32, 48, 64, 64, 128];
/** Query lengths either side of the tile edges 16, 32 and 64. */
const EDGES = [15, 16, 17, 31, 32, 33, 63, 64, 65];
const ATTN_DECK: readonly AttnType[] = [
  "decoder",
  "decoder",
  "decoder",
  "decoder",
  "decoder",
  "encoder",
  "encoder_only",
  "encoder_decoder",
];
const FEATURES = ["window", "soft_cap", "alibi", "sinks", "lse", "padding"] as const;
type Feature = typeof FEATURES[number];
const DT = { float32: "f32", float16: "f16", bfloat16: "bf16" } as const;

/** One drawn configuration. */
interface Drawn {
  /** 1-based. */
  index: number;
  label: string;
  spec: BatchSpec;
  /** Kinds of its requests, for the coverage summary. */
  kinds: string[];
}

/** `n` draws from `values`, each value about equally often, in random order. */
function deck<T>(rng: Rng, values: readonly T[], n: number): T[] {
  const out = Array.from({ length: n }, (_, i) => values[i % values.length]);
  return rng.shuffle(out);
}
const pick = <T>(rng: Rng, xs: readonly T[]): T => xs[rng.int(xs.length)];
const chance = (rng: Rng, p: number) => rng.next() < p;
const round2 = (x: number) => Math.round(x * 100) / 100;

/** A context length: uniform, or one either side of a block boundary. */
function context(rng: Rng, bs: number, max: number): number {
  if (chance(rng, 0.5)) return rng.int(max + 1);
  const blocks = 1 + rng.int(Math.max(1, Math.floor(max / bs)));
  return Math.max(0, Math.min(max, blocks * bs + rng.int(3) - 1));
}

/** A query length of a prefill: a tile edge, or anything up to 40. */
const prefillLen = (rng: Rng) => chance(rng, 0.6) ? pick(rng, EDGES) : 2 + rng.int(39);

/** One request of a decoder batch, and its kind. */
function decoderRequest(rng: Rng, bs: number): [RequestSpec, string] {
  const r = rng.next();
  if (r < 0.35) return [{ query_len: 1, seq_len: 1 + context(rng, bs, 200) }, "decode"];
  if (r < 0.5) {
    const q = 2 + rng.int(3);
    return [{ query_len: q, seq_len: q + context(rng, bs, 120) }, "multi-token decode"];
  }
  if (r < 0.72) {
    const q = prefillLen(rng);
    return [{ query_len: q, seq_len: q + 1 + context(rng, bs, 100) }, "chunked prefill"];
  }
  if (r < 0.92) {
    const q = prefillLen(rng);
    return [{ query_len: q, seq_len: q }, "full prefill"];
  }
  return [{ query_len: 0, seq_len: 1 + context(rng, bs, 60) }, "idle"];
}

/**
 * One request of an encoder_decoder batch: a few queries over 1 … 90 encoder keys. With a
 * sliding window, at least as many keys as queries (a query's position, seq_len - query_len + j,
 * stays among the keys, so the window always sees one); without, sometimes fewer, which puts the
 * first queries at negative positions (ALiBi's bias reads them: the split kernels once took
 * them as u32).
 */
function crossRequest(rng: Rng, window: boolean): [RequestSpec, string] {
  const q = chance(rng, 0.6) ? 1 : 2 + rng.int(8);
  if (!window && q > 1 && chance(rng, 0.3)) {
    return [{ query_len: q, seq_len: 1 + rng.int(q - 1) }, "cross prefill, fewer keys"];
  }
  return [{ query_len: q, seq_len: q + rng.int(80) }, q === 1 ? "cross decode" : "cross prefill"];
}

/** One request of an encoder / encoder_only batch (its own tokens are its keys). */
function encoderRequest(rng: Rng): [RequestSpec, string] {
  const q = chance(rng, 0.2) ? 1 + rng.int(3) : prefillLen(rng);
  return [{ query_len: q, seq_len: q }, "encoder"];
}

/** Query tokens x the keys each may see (at most: causal masks about half). */
const pairs = (rs: RequestSpec[]) => rs.reduce((a, r) => a + r.query_len * r.seq_len, 0);

/** The run's `count` configurations, all from `seed`. */
function drawBatches(seed: number, count: number): Drawn[] {
  const rng = new Rng(deriveSeed(seed, "random batches"));
  const combos = DTYPES.flatMap((d) => KV_CACHE_DTYPES.map((kv) => [d, kv] as const));
  const dtypes = deck(rng, combos, count);
  const layouts = deck(rng, KV_LAYOUTS, count);
  const attns = deck(rng, ATTN_DECK, count);
  const heads = deck(rng, HEAD_SIZES, count);
  const blocks = deck(rng, BLOCK_SIZES, count);
  const feats = Object.fromEntries(
    FEATURES.map((f) => [f, deck(rng, [true, false], count)]),
  ) as Record<Feature, boolean[]>;
  return Array.from({ length: count }, (_, i) => {
    const r = new Rng(deriveSeed(seed, `batch ${i + 1}`));
    const [dtype, kv] = dtypes[i] as [DType, KvCacheDType];
    const attn_type = attns[i];
    const head_size = heads[i];
    const block_size = blocks[i];
    const on = (f: Feature) => feats[f][i];
    const kvs = [1, 2, 2, 4].filter((k) => k <= maxHeads(head_size));
    const num_kv_heads = pick(r, kvs);
    const group = pick(r, [1, 2, 4, 8].filter((g) => g * num_kv_heads <= maxHeads(head_size)));
    const num_heads = num_kv_heads * group;
    const causal = attn_type === "decoder" ? chance(r, 0.8) : false;
    const perPair = num_heads * head_size;
    // Requests, while the reference's work stays within the budget (at least one).
    const want = 1 + r.int(6);
    const requests: RequestSpec[] = [], kinds: string[] = [];
    for (let k = 0; k < want * 3 && requests.length < want; k++) {
      const [req, kind] = attn_type === "decoder"
        ? decoderRequest(r, block_size)
        : attn_type === "encoder_decoder"
        ? crossRequest(r, on("window"))
        : encoderRequest(r);
      if (pairs([...requests, req]) * perPair > WORK_BUDGET) continue;
      requests.push(req);
      kinds.push(kind);
    }
    const usesCache = attn_type === "decoder" || attn_type === "encoder_decoder";
    if (requests.length === 0) { // nothing fit: one query over a few keys
      requests.push({ query_len: 1, seq_len: usesCache ? 1 + r.int(40) : 1 });
      kinds.push(usesCache ? "decode" : "encoder");
    }
    const cross_write = attn_type === "encoder_decoder" ? chance(r, 0.7) : undefined;
    // -1 slots: on some requests with key rows of this call, 1 … 3 of them (at least one).
    const keyRows = (q: RequestSpec) => attn_type === "encoder_decoder" ? q.seq_len : q.query_len;
    if (on("padding") && usesCache && cross_write !== false) {
      for (const req of requests) {
        if (keyRows(req) > 0 && chance(r, 0.6)) req.pad = 1 + r.int(Math.min(3, keyRows(req)));
      }
      const first = requests.find((q) => keyRows(q) > 0);
      if (first && !requests.some((q) => q.pad)) first.pad = 1;
    }
    const fp8 = kv === "fp8" || kv === "fp8_e4m3" || kv === "fp8_e5m2";
    const soft = on("soft_cap");
    const spec: BatchSpec = {
      dtype,
      kv_cache_dtype: kv,
      layout: layouts[i],
      block_size,
      head_size,
      num_heads,
      num_kv_heads,
      requests,
      attn_type,
      causal,
      sliding_window: on("window") ? pick(r, [1, 2, 5, 8, 17, 33, 1 + r.int(80)]) : null,
      logits_soft_cap: soft ? round2(r.uniform(1, 30)) : null,
      q_std: soft ? 3 : 1,
      alibi: on("alibi"),
      sinks: on("sinks"),
      return_lse: on("lse"),
      spare_blocks: r.int(4),
      ...(chance(r, 0.2) ? { scale: round2(r.uniform(0.05, 0.5)) } : {}),
      // fp8 scales; on other caches (a fifth of them) scales that must be ignored.
      ...(fp8 || chance(r, 0.2)
        ? { k_scale: round2(r.uniform(0.25, 2)), v_scale: round2(r.uniform(0.25, 2)) }
        : {}),
      ...((kv === "fp8_e4m3" || kv === "fp8") && chance(r, 0.5) ? { finite_fill: true } : {}),
      ...(cross_write !== undefined ? { cross_write } : {}),
    };
    return { index: i + 1, label: labelOf(spec), spec, kinds };
  });
}

/** A configuration in a line: dtypes, layout, shapes, attention, requests and features. */
function labelOf(s: BatchSpec): string {
  const cache = s.attn_type === "encoder" || s.attn_type === "encoder_only"
    ? "no cache"
    : `kv ${s.kv_cache_dtype}${s.k_scale ? ` k${s.k_scale}/v${s.v_scale}` : ""}${
      s.finite_fill ? " nan-free" : ""
    } ${s.layout} bs${s.block_size}`;
  const attn = s.attn_type === "decoder"
    ? (s.causal ? "" : " non-causal")
    : ` ${s.attn_type}${s.cross_write === false ? " (no new K/V)" : ""}`;
  const reqs = s.requests.map((r) => `${r.query_len}@${r.seq_len}${r.pad ? `-${r.pad}` : ""}`).join(
    " ",
  );
  const f = [
    s.sliding_window ? `window ${s.sliding_window}` : "",
    s.logits_soft_cap ? `cap ${s.logits_soft_cap}` : "",
    s.alibi ? "alibi" : "",
    s.sinks ? "sinks" : "",
    s.scale ? `scale ${s.scale}` : "",
    s.return_lse ? "+lse" : "",
  ].filter((x) => x);
  return `${DT[s.dtype]} ${cache} d${s.head_size} ${s.num_heads}q/${s.num_kv_heads}kv${attn} ` +
    `[${reqs}]${f.length ? ` ${f.join(" ")}` : ""}`;
}

const DRAWN = drawBatches(SEED, COUNT);
const RUN = DRAWN.filter((d) => ONLY.size === 0 || ONLY.has(d.index));
console.log(
  `random batches: seed ${SEED} (rerun: SEED=${SEED} RANDOM_BATCHES=${COUNT}), ${RUN.length} of ` +
    `${COUNT} batches${GL ? " (6 by default on GL: minutes of compiles a batch there)" : ""}, ` +
    `adapter: ${gpu ? gpu.adapter_info.description || gpu.adapter_info.device : "none"}, ` +
    `backends: ${registry.names().join(", ")}`,
);

/** What each backend did with each batch, for the summary. */
const outcomes = new Map<string, { ok: number; refused: Map<string, number> }>(
  registry.names().map((n) => [n, { ok: 0, refused: new Map() }]),
);

Deno.test("random batches: the draw is seeded and covers every dtype, layout, type and feature", () => {
  assert.deepEqual(drawBatches(SEED, COUNT), DRAWN, "the same seed draws the same batches");
  const other = drawBatches((SEED + 1) >>> 0, COUNT).map((d) => d.label);
  assert.notDeepEqual(other, DRAWN.map((d) => d.label), "another seed draws other batches");
  for (const d of DRAWN) {
    const s = d.spec;
    assert.equal(s.num_heads % s.num_kv_heads, 0, d.label);
    assert.ok(s.num_heads <= maxHeads(s.head_size), d.label);
    const encoder = s.attn_type === "encoder" || s.attn_type === "encoder_only";
    for (const r of s.requests) {
      // Queries have keys at their positions (a window always sees one), but cross queries
      // without a window may have fewer (their first positions negative: crossRequest).
      if (encoder) assert.equal(r.seq_len, r.query_len, d.label);
      else if (s.attn_type === "encoder_decoder" && !s.sliding_window) {
        assert.ok(r.seq_len >= 1, d.label);
      } else assert.ok(r.seq_len >= r.query_len, d.label);
    }
    assert.ok(pairs(s.requests) * s.num_heads * s.head_size <= WORK_BUDGET, d.label);
  }
  if (COUNT < 2 * ATTN_DECK.length) return; // too few draws to hold every value
  const seen = (f: (s: BatchSpec) => unknown) => new Set(DRAWN.map((d) => f(d.spec)));
  assert.deepEqual(seen((s) => s.dtype), new Set(DTYPES));
  assert.deepEqual(seen((s) => s.kv_cache_dtype), new Set(KV_CACHE_DTYPES));
  assert.deepEqual(seen((s) => s.layout), new Set(KV_LAYOUTS));
  assert.deepEqual(seen((s) => s.attn_type), new Set(ATTN_TYPES));
  assert.deepEqual(seen((s) => s.block_size), new Set(BLOCK_SIZES));
  for (const f of [(s: BatchSpec) => s.sliding_window !== null, (s: BatchSpec) => !!s.alibi]) {
    assert.deepEqual(seen(f), new Set([true, false]));
  }
  const kinds = new Map<string, number>();
  for (const d of DRAWN) for (const k of d.kinds) kinds.set(k, (kinds.get(k) ?? 0) + 1);
  console.log(`  request kinds: ${[...kinds].map(([k, n]) => `${k} ${n}`).join(", ")}`);
});

const { batchOf, referenceOf, forget } = sharedReferences((d: Drawn) =>
  generateBatch(d.spec, deriveSeed(SEED, `data ${d.index}`))
);

RUN.forEach((d, i) => {
  const name = `random batch ${d.index}/${COUNT} (SEED=${SEED}): ${d.label}`;
  Deno.test({ name, ...opts }, async (t) => {
    const g = batchOf(d);
    const replay =
      `(replay: SEED=${SEED} RANDOM_BATCHES=${COUNT} RANDOM_BATCHES_ONLY=${d.index}; ` +
      `batch ${d.index}: ${d.label})`;
    try {
      assert.deepEqual(
        forcedReasons(registry, CPU_REFERENCE, g.selector, ctx),
        [],
        `CPU_REFERENCE refuses ${replay}`,
      );
      const reference = referenceOf(d);
      for (const next of RUN.slice(i + 1, i + 1 + CPU_REFERENCE.pool.size)) referenceOf(next);
      for (const backend of registry.list()) {
        const refused = forcedReasons(registry, backend, g.selector, ctx);
        if (refused.length > 0) {
          const o = outcomes.get(backend.name)!;
          for (const why of refused) o.refused.set(why, (o.refused.get(why) ?? 0) + 1);
          await t.step({
            name: `${backend.name} — refused: ${refused.join("; ")}`,
            ignore: true,
            fn() {},
          });
          continue;
        }
        // The oracle's own step checks only what comparing it with itself can: finite values and
        // no cache byte changed outside the written slots.
        const step = backend === CPU_REFERENCE
          ? `${backend.name} (the oracle: finite, no stray cache write)`
          : backend.name;
        await t.step(step, async () => {
          try {
            const got = backend === CPU_REFERENCE
              ? await reference
              : await runOn(backend, g, ctx, (p) => assertPoisonsFirst(p, g.batch.return_lse));
            checkRun(g, got, await reference);
          } catch (e) {
            if (e instanceof Error) {
              e.message = `${backend.name}, accepted when forced: ${e.message} ${replay}`;
            }
            throw e;
          }
          outcomes.get(backend.name)!.ok++;
        });
      }
    } finally {
      forget(d);
    }
  });
});

Deno.test("random batches: summary", () => {
  console.log(`  seed ${SEED}: ${RUN.length} batches`);
  for (const [name, o] of outcomes) {
    const refused = [...o.refused].map(([why, n]) => `${n}x ${why}`);
    console.log(`  ${name}: ${o.ok} ok${refused.length ? `; refused: ${refused.join("; ")}` : ""}`);
  }
  // Every backend took some batches (a regression that refused all would pass every step).
  if (RUN.length >= 6) {
    for (const [name, o] of outcomes) {
      assert.ok(o.ok >= RUN.length / 3, `${name}: ${o.ok} of ${RUN.length} batches ran`);
    }
  }
});
