/** validateForward: defaults, the selector config of a call, and every semantic problem at once. */
import assert from "node:assert/strict";
import { fromFloats } from "../../core/data.ts";
import { ServiceError } from "../../core/errors.ts";
import type { CacheTensor, DataTensor, IntTensor } from "../../wire/tensors.ts";
import type { KvCacheSpec } from "../../core/types.ts";
import { type ForwardInput, type HeldCacheInfo, validateForward } from "../../service/validate.ts";

const data = (shape: number[], fill = 0.25): DataTensor => ({
  dtype: "float32",
  shape,
  array: fromFloats("float32", new Float32Array(shape.reduce((a, b) => a * b, 1)).fill(fill)),
  encoding: "data",
});
const ints = (values: number[], shape = [values.length]): IntTensor => ({
  shape,
  values: Int32Array.from(values),
});

const SPEC: KvCacheSpec = {
  num_blocks: 4,
  block_size: 4,
  num_kv_heads: 2,
  head_size: 8,
  dtype: "float32",
  kv_cache_dtype: "auto",
  layout: "NHD",
};
const HELD: HeldCacheInfo = { spec: SPEC, storage: "host" };

/** 2 requests: 3 new of 6, 2 new of 2; H=4, Hkv=2, D=8. */
function input(): ForwardInput {
  return {
    dtype: "float32",
    layer: { num_heads: 4, num_kv_heads: 2, head_size: 8 },
    query: data([5, 4, 8]),
    key: data([5, 2, 8]),
    value: data([5, 2, 8]),
    metadata: {
      query_start_loc: ints([0, 3, 5]),
      seq_lens: ints([6, 2]),
      block_table: ints([1, 2, 999, 3, 999, 999], [2, 3]),
      slot_mapping: ints([7, 8, 9, 12, 13]),
    },
    kv_cache: "c1",
  };
}

function issuesOf(fn: () => unknown): { path: string; message: string }[] {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof ServiceError);
    assert.equal(e.status, 422);
    assert.equal(e.code, "invalid_batch");
    return e.issues!.map((i) => ({ path: i.path.join("."), message: i.message }));
  }
  assert.fail("expected invalid_batch");
}

function has(issues: { path: string; message: string }[], path: string, re?: RegExp): void {
  const hit = issues.find((i) => i.path === path);
  assert.ok(hit, `no issue at ${path}: ${JSON.stringify(issues)}`);
  if (re) assert.match(hit.message, re);
}

Deno.test("validateForward: defaults and the call's selector config", () => {
  const v = validateForward(input(), HELD);
  assert.equal(v.batch.layer.scale, 1 / Math.sqrt(8));
  assert.equal(v.batch.layer.causal, true);
  assert.equal(v.batch.layer.k_scale, 1);
  assert.equal(v.batch.metadata.num_reqs, 2);
  assert.equal(v.batch.metadata.max_blocks_per_req, 3);
  assert.equal(v.batch.num_tokens, 5);
  assert.equal(v.inline, null);
  assert.deepEqual(
    { ...v.selector },
    {
      head_size: 8,
      dtype: "float32",
      kv_cache_dtype: "auto",
      block_size: 4,
      use_mla: false,
      has_sink: false,
      use_sparse: false,
      use_mm_prefix: false,
      attn_type: "decoder",
      has_sliding_window: false,
      use_non_causal: false,
      use_batch_invariant: false,
      use_per_head_quant_scales: false,
      use_alibi: false,
      use_logits_soft_cap: false,
      return_lse: false,
      max_query_len: 3,
      kv_cache_layout: "NHD",
      cache_storage: "host",
    },
  );
  const i = input();
  i.layer = {
    ...i.layer,
    sinks: [0, 0, 0, 0],
    sliding_window: 2,
    alibi_slopes: [1, 1, 1, 1],
    logits_soft_cap: 30,
  };
  i.return_lse = true;
  const s = validateForward(i, HELD).selector;
  assert.ok(
    s.has_sink && s.has_sliding_window && s.use_alibi && s.use_logits_soft_cap && s.return_lse,
  );
});

Deno.test("validateForward: inline caches give spec, dtype and layout", () => {
  const i = input();
  delete i.kv_cache;
  const kc: CacheTensor = { dtype: "fp8_e5m2", shape: [4, 2, 4, 8], bytes: new Uint8Array(256) };
  i.key_cache = kc;
  i.value_cache = { ...kc, bytes: new Uint8Array(256) };
  i.kv_cache_layout = "HND";
  const v = validateForward(i, null);
  assert.deepEqual(v.inline!.spec, { ...SPEC, kv_cache_dtype: "fp8_e5m2", layout: "HND" });
  assert.equal(v.selector.kv_cache_dtype, "fp8_e5m2");
  assert.equal(v.selector.kv_cache_layout, "HND");
  assert.equal(v.selector.cache_storage, undefined, "inline caches do not constrain storage");
  // A float32 cache for float16 data is not expressible.
  const j = input();
  delete j.kv_cache;
  j.dtype = "float16";
  j.key_cache = { dtype: "float32", shape: [4, 4, 2, 8], bytes: new Uint8Array(1024) };
  j.value_cache = { dtype: "float32", shape: [4, 4, 2, 8], bytes: new Uint8Array(1024) };
  has(issuesOf(() => validateForward(j, null)), "key_cache.dtype");
  const k = input();
  delete k.kv_cache;
  k.key_cache = { dtype: "float32", shape: [4, 4, 3, 8], bytes: new Uint8Array(1536) };
  k.value_cache = { dtype: "float32", shape: [4, 4, 2, 8], bytes: new Uint8Array(1024) };
  const ks = issuesOf(() => validateForward(k, null));
  has(ks, "value_cache.shape");
  has(ks, "key_cache.shape.2", /num_kv_heads axis is 3/);
});

Deno.test("validateForward: encoder types, cross-attention", () => {
  const e: ForwardInput = {
    dtype: "float32",
    layer: { num_heads: 4, num_kv_heads: 2, head_size: 8, attn_type: "encoder_only" },
    query: data([5, 4, 8]),
    key: data([5, 2, 8]),
    value: data([5, 2, 8]),
    metadata: { query_start_loc: ints([0, 3, 5]), seq_lens: ints([3, 2]) },
  };
  const v = validateForward(e, null);
  assert.equal(v.batch.layer.causal, false);
  assert.equal(v.selector.use_non_causal, false, "non-causal is implied by the encoder type");
  const nc = input();
  nc.layer = { ...nc.layer, causal: false };
  assert.equal(validateForward(nc, HELD).selector.use_non_causal, true, "non-causal decoder");
  assert.deepEqual(Array.from(v.batch.metadata.slot_mapping), [-1, -1, -1, -1, -1]);
  has(
    issuesOf(() =>
      validateForward({ ...e, metadata: { ...e.metadata, seq_lens: ints([4, 2]) } }, null)
    ),
    "metadata.seq_lens.0",
    /must equal the query length 3/,
  );
  has(issuesOf(() => validateForward({ ...e, key: undefined, value: undefined }, null)), "key");
  has(
    issuesOf(() => validateForward({ ...e, kv_cache: "c1" }, HELD)),
    "kv_cache",
    /uses no KV cache/,
  );
  // encoder_decoder: queries attend to a cache of encoder keys; no key on this step.
  const x: ForwardInput = {
    dtype: "float32",
    layer: { num_heads: 4, num_kv_heads: 2, head_size: 8, attn_type: "encoder_decoder" },
    query: data([2, 4, 8]),
    metadata: {
      query_start_loc: ints([0, 1, 2]),
      seq_lens: ints([7, 3]),
      block_table: ints([0, 1, 2, 3], [2, 2]),
      slot_mapping: ints([]),
    },
    kv_cache: "c1",
  };
  const xv = validateForward(x, HELD);
  assert.equal(xv.batch.key, null);
  assert.equal(xv.batch.layer.causal, false);
  // With encoder keys: slot_mapping has one entry per key token.
  const xk = { ...x, key: data([6, 2, 8]), value: data([6, 2, 8]) };
  has(
    issuesOf(() => validateForward(xk, HELD)),
    "metadata.slot_mapping",
    /one entry per key token \(6\)/,
  );
  validateForward(
    { ...xk, metadata: { ...x.metadata, slot_mapping: ints([0, 1, 2, 3, 4, 5]) } },
    HELD,
  );
  has(
    issuesOf(() => validateForward({ ...x, layer: { ...x.layer, causal: true } }, HELD)),
    "layer.causal",
  );
});

Deno.test("validateForward: every problem listed with path and value", () => {
  const i = input();
  i.layer = {
    ...i.layer,
    scale: 0,
    sliding_window: 1.5,
    logits_soft_cap: -1,
    alibi_slopes: [1, 2],
    sinks: [1, 2, 3],
    k_scale: -2,
  };
  i.query = data([5, 4, 16]);
  i.metadata.query_start_loc = ints([1, 3, 2]);
  i.metadata.block_table = ints([1, 9, 0, 3, 0, 0], [2, 3]);
  i.metadata.slot_mapping = ints([7, 7, -1, 16, -5]);
  const is = issuesOf(() => validateForward(i, HELD));
  has(is, "layer.scale", /got 0/);
  has(is, "layer.sliding_window", /got 1.5/);
  has(is, "layer.logits_soft_cap", /must be finite and > 0 \(or null\), got -1/);
  has(is, "layer.alibi_slopes", /has 2 entries but num_heads is 4/);
  has(is, "layer.sinks", /has 3 entries/);
  has(is, "layer.k_scale", /got -2/);
  has(is, "query.shape", /\[5, 4, 16\]/);
  has(is, "metadata.query_start_loc.0", /must be 0, got 1/);
  has(is, "metadata.query_start_loc.2", /non-decreasing/);
  has(is, "metadata.block_table.0.1", /block id 9 out of range \[0, 4\)/);
  has(is, "metadata.slot_mapping.1", /slot 7 duplicates slot_mapping\[0\]/);
  has(is, "metadata.slot_mapping.3", /slot 16 out of range/);
  has(is, "metadata.slot_mapping.4", /slot -5 out of range/);
  assert.ok(is.length >= 13);
});

Deno.test("validateForward: block table coverage and cache agreement", () => {
  const i = input();
  i.metadata.seq_lens = ints([13, 2]); // needs 4 blocks, table has 3 columns
  has(
    issuesOf(() => validateForward(i, HELD)),
    "metadata.block_table.0",
    /needs 4 blocks of 4, block_table has 3 columns/,
  );
  const j = input();
  j.metadata.seq_lens = ints([2, 2]);
  has(
    issuesOf(() => validateForward(j, HELD)),
    "metadata.seq_lens.0",
    /shorter than request 0's query length 3/,
  );
  const k = input();
  k.layer = { ...k.layer, num_kv_heads: 1, head_size: 8 };
  k.key = data([5, 1, 8]);
  k.value = data([5, 1, 8]);
  has(issuesOf(() => validateForward(k, HELD)), "layer.num_kv_heads", /cache c1 has 2/);
  const l = input();
  l.key_cache = { dtype: "float32", shape: [4, 4, 2, 8], bytes: new Uint8Array(1024) };
  l.value_cache = l.key_cache;
  has(issuesOf(() => validateForward(l, HELD)), "kv_cache", /not both/);
  const m = input();
  delete m.kv_cache;
  has(issuesOf(() => validateForward(m, null)), "kv_cache", /needs a KV cache/);
  // Unneeded block-table columns are not checked (999 above), padding slots (-1) are fine.
  const n = input();
  n.metadata.slot_mapping = ints([-1, -1, 9, 12, -1]);
  validateForward(n, HELD);
});

Deno.test("validateForward: fp8 scales are refused where their float32 is not finite, is 0 or is subnormal", () => {
  // Before: 1e39 (Infinity in float32) and 1e-46 (0) were accepted; the backends answered NaN,
  // or disagreed (the HTTP audit).
  for (
    const [k, v, re] of [
      ["k_scale", 1e39, /finite as a float32.*got 1e\+39/],
      ["v_scale", 1e-46, /at least 1\.17549\d*e-38 as a float32.*got 1e-46/],
      ["v_scale", 1e-40, /GPUs flush smaller values to 0\), got 1e-40/],
    ] as const
  ) {
    const i = input();
    i.layer = { ...i.layer, [k]: v };
    has(issuesOf(() => validateForward(i, HELD)), `layer.${k}`, re);
  }
  for (const v of [2 ** -126, 3.4e38, 0.0123]) {
    const i = input();
    i.layer = { ...i.layer, k_scale: v, v_scale: v };
    validateForward(i, HELD);
  }
});

Deno.test("validateForward: query_start_loc steps that wrap as int32 are refused, not planned", () => {
  // Before: the lengths were taken in an Int32Array, 2^31 - 1 - (-2^31) wrapped to 1, the batch
  // passed as non-decreasing and the GPU planner built ~2^31 tiles (the server ran out of memory
  // and died; with the default limits a 422 limit_exceeded named no field). Session 38's audit.
  const e: ForwardInput = {
    dtype: "float32",
    layer: { num_heads: 4, num_kv_heads: 2, head_size: 8, attn_type: "encoder_only" },
    query: data([2, 4, 8]),
    key: data([2, 2, 8]),
    value: data([2, 2, 8]),
    metadata: {
      query_start_loc: ints([0, 2 ** 31 - 1, -(2 ** 31), -1, 2]),
      seq_lens: ints([2 ** 31 - 1, 1, 2 ** 31 - 1, 3]),
    },
  };
  const is = issuesOf(() => validateForward(e, null));
  has(is, "metadata.query_start_loc.1", /must be <= num_tokens 2, got 2147483647/);
  has(is, "metadata.query_start_loc.2", /non-decreasing/);
  // Steps within [0, num_tokens] that go back are named too.
  const back = {
    ...e,
    metadata: { query_start_loc: ints([0, 2, 1, 2]), seq_lens: ints([2, 0, 1]) },
  };
  has(issuesOf(() => validateForward(back, null)), "metadata.query_start_loc.2", /non-decreasing/);
});

Deno.test("validateForward: layer values the kernels take as float32 must be finite there", () => {
  // Before: sinks and ALiBi slopes of 1e39 (finite as float64, Infinity as float32) gave 200
  // with NaN heads, on CPU_REFERENCE too; a scale or soft cap of 1e39 reached the GPU as
  // Infinity. Session 38's audit.
  const cases: [Record<string, unknown>, string, RegExp][] = [
    [{ sinks: [1e39, 0, 0, 0] }, "layer.sinks.0", /finite as a float32.*got 1e\+39/],
    [{ alibi_slopes: [0.5, -1e308, 0, 0] }, "layer.alibi_slopes.1", /finite as a float32/],
    [{ scale: 1e39 }, "layer.scale", /finite as a float32.*got 1e\+39/],
    [{ scale: 1e-46 }, "layer.scale", /at least 1\.17549\d*e-38 as a float32/],
    [{ logits_soft_cap: 1e39 }, "layer.logits_soft_cap", /finite as a float32/],
  ];
  for (const [fields, path, re] of cases) {
    const i = input();
    i.layer = { ...i.layer, ...fields };
    has(issuesOf(() => validateForward(i, HELD)), path, re);
  }
  const ok = input();
  ok.layer = {
    ...ok.layer,
    sinks: [3.4e38, -3.4e38, 1e-45, 0],
    alibi_slopes: [1e-40, 2, -2, 0],
    scale: 3.4e38,
    logits_soft_cap: 2 ** -126,
  };
  validateForward(ok, HELD);
});

Deno.test("validateForward: a kv_cache_layout that contradicts the held cache's is refused", () => {
  // Before: `HND` on an NHD held cache was ignored and the call served (session 38's audit).
  const i = { ...input(), kv_cache_layout: "HND" as const };
  has(issuesOf(() => validateForward(i, HELD)), "kv_cache_layout", /is HND but cache c1 is NHD/);
  validateForward({ ...input(), kv_cache_layout: "NHD" as const }, HELD);
});
