/**
 * The validator's issue-9 rules: one policy for non-finite values (JSON numbers, base64 and
 * safetensors bytes alike: 422 naming the tensor and the first bad index), a block id repeated
 * within a request's row (the 1.2 KB body that claimed seq_lens of 16.7 million), per-call
 * limits (422 `limit_exceeded` naming the limit and the value; with any other problem, listed in
 * the one `invalid_batch`), and the stats and plan key it derives.
 */
import assert from "node:assert/strict";
import { dataArray, fromFloats } from "../../core/data.ts";
import { rawFromJson, rawFromSafetensors, toDataTensor } from "../../wire/tensors.ts";
import type { KvCacheSpec } from "../../core/types.ts";
import {
  attachCache,
  checkFiniteOnHost,
  type ForwardInput,
  validateForward,
} from "../../service/validate.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { DECODE_HELD, DECODE_SPEC, decodeInput, ints, refused422 } from "./decode_input.ts";

const SPEC = DECODE_SPEC;
const HELD = DECODE_HELD;
const input = decodeInput;

Deno.test("validate: non-finite values are 422 naming the tensor and the first bad index", () => {
  // base64 / safetensors bytes: an f16 NaN (0x7e00) and an inf (0x7c00) in the key.
  const bytes = new Uint16Array(4).fill(0x3c00);
  bytes[2] = 0x7e00;
  bytes[3] = 0x7c00;
  const key = {
    dtype: "float16" as const,
    shape: [1, 1, 4],
    array: dataArray("float16", new Uint8Array(bytes.buffer)),
    encoding: "binary" as const,
  };
  const e = refused422(() => validateForward(input({ key }), HELD), "invalid_batch");
  const hit = e.issues!.find((i) => i.path[0] === "key");
  assert.deepEqual(hit?.path, ["key", 2]);
  assert.match(hit!.message, /NaN/);
  // The same rule for a safetensors tensor (F32 inf at index 5 of the query).
  const q = new Float32Array(8).fill(1);
  q[5] = Infinity;
  const st = toDataTensor(
    rawFromSafetensors({ dtype: "F32", shape: [1, 2, 4], data: new Uint8Array(q.buffer) }),
    ["query"],
  );
  const e2 = refused422(() => validateForward(input({ query: st }), HELD), "invalid_batch");
  assert.deepEqual(e2.issues!.find((i) => i.path[0] === "query")?.path, ["query", 5]);
  // And for JSON numbers: 1e999 parses to Infinity; 1e6 overflows float16 to inf.
  for (const big of [1e999, 1e6]) {
    const data = [0, 0, 0, big, 0, 0, 0, 0];
    const t = toDataTensor(rawFromJson({ dtype: "float16", shape: [1, 2, 4], data }, ["q"]), [
      "query",
    ]);
    const e3 = refused422(() => validateForward(input({ query: t }), HELD), "invalid_batch");
    assert.deepEqual(e3.issues!.find((i) => i.path[0] === "query")?.path, ["query", 3]);
  }
});

Deno.test("validate: a block id repeated within a request's row is 422", () => {
  const md = { ...input().metadata, block_table: ints([5, 2, 5], [1, 3]) };
  const e = refused422(() => validateForward(input({ metadata: md }), HELD), "invalid_batch");
  const hit = e.issues!.find((i) => i.path.join(".") === "metadata.block_table.0.2");
  assert.ok(hit, JSON.stringify(e.issues));
  assert.match(hit.message, /block id 5 repeats block_table\[0\]\[0\]/);
  // Two requests may share a block (prefix caching); only a row may not repeat one.
  const two = input({
    query: {
      ...input().query,
      shape: [2, 2, 4],
      array: fromFloats("float16", new Float32Array(16)),
    },
    key: { ...input().key!, shape: [2, 1, 4], array: fromFloats("float16", new Float32Array(8)) },
    value: { ...input().key!, shape: [2, 1, 4], array: fromFloats("float16", new Float32Array(8)) },
    metadata: {
      query_start_loc: ints([0, 1, 2]),
      seq_lens: ints([5, 5]),
      block_table: ints([3, 1, 3, 4], [2, 2]),
      slot_mapping: ints([4, 16]),
    },
  });
  validateForward(two, HELD);
});

Deno.test("validate: per-call limits are 422 limit_exceeded naming the limit and value", () => {
  const limits = { max_tokens: 4, max_attended_keys: 9 };
  const e = refused422(() => validateForward(input(), HELD, limits), "limit_exceeded");
  assert.match(e.message, /attended keys 10 exceeds the per-call limit max_attended_keys = 9/);
  assert.equal(e.extra?.limit, "max_attended_keys");
  assert.equal(e.extra?.value, 10);
  validateForward(input(), HELD, { ...limits, max_attended_keys: 10 }); // at the limit: fine
  const t = refused422(
    () => validateForward(input(), HELD, { max_tokens: 0, max_attended_keys: 100 }),
    "limit_exceeded",
  );
  assert.equal(t.extra?.limit, "max_tokens");
});

Deno.test("validate: limits join the other issues: one 422 invalid_batch lists them all", () => {
  // Out of range slot (a rule) and both limits: one invalid_batch naming all three.
  const md = { ...input().metadata, slot_mapping: ints([99]) };
  const limits = { max_tokens: 0, max_attended_keys: 9 };
  const e = refused422(
    () => validateForward(input({ metadata: md }), HELD, limits),
    "invalid_batch",
  );
  assert.deepEqual(e.issues!.map((i) => `${i.path.join(".")}: ${i.message}`), [
    "metadata.slot_mapping.0: slot 99 out of range: -1 or [0, 32) (num_blocks 8 x block_size 4)",
    "query.shape.0: num_tokens 1 exceeds max_tokens = 0",
    "metadata.seq_lens: attended keys 10 exceeds max_attended_keys = 9",
  ]);
  // The first limit's fields, as a limit_exceeded document has them.
  assert.deepEqual(e.extra, { limit: "max_tokens", value: 1, max: 0 });
  // Only limits: limit_exceeded, every limit listed.
  const only = refused422(() => validateForward(input(), HELD, limits), "limit_exceeded");
  assert.deepEqual(only.issues!.map((i) => i.path.join(".")), [
    "query.shape.0",
    "metadata.seq_lens",
  ]);
  assert.deepEqual(only.extra, { limit: "max_tokens", value: 1, max: 0 });
});

Deno.test("validate: attended keys are counted only from valid query_start_loc and seq_lens", () => {
  const limits = { max_tokens: 0, max_attended_keys: 0 };
  // seq_lens breaks a rule: no attended-keys count (it would be meaningless); max_tokens still.
  const md = { ...input().metadata, seq_lens: ints([-1]) };
  const e = refused422(
    () => validateForward(input({ metadata: md }), HELD, limits),
    "invalid_batch",
  );
  assert.deepEqual(e.issues!.map((i) => i.path.join(".")), [
    "metadata.seq_lens.0",
    "query.shape.0",
  ]);
  // So does an invalid sliding window (the count depends on it).
  const layer = { num_heads: 2, num_kv_heads: 1, head_size: 4, sliding_window: 0 };
  const w = refused422(() => validateForward(input({ layer }), HELD, limits), "invalid_batch");
  assert.deepEqual(w.issues!.map((i) => i.path.join(".")), [
    "layer.sliding_window",
    "query.shape.0",
  ]);
  // A valid window is counted: 3 keys.
  const win = { ...layer, sliding_window: 3 };
  const ok = refused422(
    () => validateForward(input({ layer: win }), HELD, { max_tokens: 1, max_attended_keys: 2 }),
    "limit_exceeded",
  );
  assert.equal(ok.extra?.value, 3);
});

Deno.test("validate: the limits are listed past the issue cap, before the count of the rest", () => {
  // One decode request over 120 blocks, every id out of range: 120 issues, 100 listed.
  const md = {
    query_start_loc: ints([0, 1]),
    seq_lens: ints([480]),
    block_table: ints(Array.from({ length: 120 }, () => 8), [1, 120]),
    slot_mapping: ints([29]),
  };
  const limits = { max_tokens: 100, max_attended_keys: 100 };
  const e = refused422(
    () => validateForward(input({ metadata: md }), HELD, limits),
    "invalid_batch",
  );
  assert.equal(e.issues!.length, 102);
  assert.deepEqual(e.issues!.slice(99).map((i) => `${i.path.join(".")}: ${i.message}`), [
    "metadata.block_table.0.99: block id 8 out of range [0, 8)",
    "metadata.seq_lens: attended keys 480 exceeds max_attended_keys = 100",
    ": 20 more issues not listed",
  ]);
});

Deno.test("validate: stats count attended keys under the mask; the plan key names the shape", () => {
  const v = validateForward(input(), HELD);
  assert.deepEqual(v.batch.stats, {
    max_query_len: 1,
    max_seq_len: 10,
    num_decode_reqs: 1,
    attended_keys: 10,
  });
  const windowed = validateForward(
    input({ layer: { num_heads: 2, num_kv_heads: 1, head_size: 4, sliding_window: 3 } }),
    HELD,
  );
  assert.equal(windowed.batch.stats.attended_keys, 3);
  const again = validateForward(input(), HELD);
  assert.equal(again.batch.plan_key, v.batch.plan_key, "same metadata, same key");
  const md = { ...input().metadata, block_table: ints([5, 2, 6], [1, 3]) };
  const other = validateForward(input({ metadata: md }), HELD);
  // The key names the shape, not the metadata's values (the plan cache compares those).
  assert.equal(other.batch.plan_key, v.batch.plan_key, "another block table, the same key");
  const lse = validateForward(input({ return_lse: true }), HELD);
  assert.notEqual(lse.batch.plan_key, v.batch.plan_key, "another shape, another key");
});

Deno.test("validate: repeats are named with their first occurrence, in every call", () => {
  // One request of 4 blocks (seq_len 13): block 5 three times, block 2 twice.
  const i = input({
    metadata: {
      query_start_loc: ints([0, 1]),
      seq_lens: ints([13]),
      block_table: ints([5, 2, 5, 5, 2], [1, 5]),
      slot_mapping: ints([29]),
    },
  });
  for (let call = 0; call < 2; call++) {
    const e = refused422(() => validateForward(i, HELD), "invalid_batch");
    const msgs = e.issues!.map((x) => `${x.path.join(".")}: ${x.message}`);
    assert.deepEqual(msgs.filter((m) => m.includes("repeats")).map((m) => m.split(":")[0]), [
      "metadata.block_table.0.2",
      "metadata.block_table.0.3",
    ], `call ${call}: ${msgs.join("; ")}`);
    assert.ok(msgs.every((m) => !m.includes("repeats") || m.includes("block_table[0][0]")));
  }
  // Column 4 is beyond what seq_len 13 needs (4 blocks): its repeat of 2 is not looked at.
  // The same blocks in another call, each once per row: valid, whatever the earlier call saw.
  const ok = input({
    metadata: { ...i.metadata, block_table: ints([5, 2, 6, 7, 2], [1, 5]) },
  });
  validateForward(ok, HELD);
  validateForward(ok, HELD);
});

Deno.test("validate: slot repeats, padding and out-of-range slots, in index order", () => {
  const q = (n: number) => ({
    dtype: "float16" as const,
    shape: [n, 2, 4],
    array: fromFloats("float16", new Float32Array(n * 8)),
    encoding: "base64" as const,
  });
  const kv = (n: number) => ({
    ...q(n),
    shape: [n, 1, 4],
    array: fromFloats("float16", new Float32Array(n * 4)),
  });
  const call = (slots: number[]) =>
    input({
      query: q(slots.length),
      key: kv(slots.length),
      value: kv(slots.length),
      metadata: {
        query_start_loc: ints([0, slots.length]),
        seq_lens: ints([slots.length]),
        block_table: ints([1, 2, 3], [1, 3]),
        slot_mapping: ints(slots),
      },
    });
  // Padding (-1) may repeat; in-range slots may not; out-of-range ones are named once each.
  validateForward(call([-1, 4, -1, -1, 5, 6]), HELD);
  const e = refused422(
    () => validateForward(call([9, 4, 9, 40, 40, -1, 9, -3]), HELD),
    "invalid_batch",
  );
  const msgs = e.issues!.map((x) => `${x.path.join(".")}: ${x.message}`);
  assert.deepEqual(msgs, [
    "metadata.slot_mapping.2: slot 9 duplicates slot_mapping[0]",
    "metadata.slot_mapping.3: slot 40 out of range: -1 or [0, 32) (num_blocks 8 x block_size 4)",
    "metadata.slot_mapping.4: slot 40 out of range: -1 or [0, 32) (num_blocks 8 x block_size 4)",
    "metadata.slot_mapping.6: slot 9 duplicates slot_mapping[0]",
    "metadata.slot_mapping.7: slot -3 out of range: -1 or [0, 32) (num_blocks 8 x block_size 4)",
  ]);
  // The marks of one call do not leak into the next: the same slots again are no repeats.
  for (let i = 0; i < 3; i++) validateForward(call([3, 7, 11, -1]), HELD);
  // A cache of more slots than the marks cover (2^24 here) takes the sorted path: same answers.
  const huge = { ...HELD, spec: { ...SPEC, num_blocks: 1 << 22 } };
  validateForward(call([-1, 4, -1, (1 << 24) - 1]), huge);
  const big = refused422(() => validateForward(call([9, 1 << 24, 9]), huge), "invalid_batch");
  assert.deepEqual(big.issues!.map((x) => `${x.path.join(".")}: ${x.message}`), [
    "metadata.slot_mapping.1: slot 16777216 out of range: -1 or [0, 16777216) (num_blocks 4194304 x block_size 4)",
    "metadata.slot_mapping.2: slot 9 duplicates slot_mapping[0]",
  ]);
});

Deno.test("validate: deferFinite leaves a large batch's scan, unless the call fails anyway", () => {
  // One 1400-token prefill, f16, 8 q / 2 kv heads of 128: 4.3 MB of query/key/value.
  const T = 1400;
  const spec: KvCacheSpec = {
    ...SPEC,
    num_blocks: 100,
    block_size: 16,
    head_size: 128,
    num_kv_heads: 2,
  };
  const f16 = (n: number, shape: number[]) => {
    const a = new Float32Array(n).map((_, i) => (i % 13) / 8);
    return {
      dtype: "float16" as const,
      shape,
      array: fromFloats("float16", a),
      encoding: "binary" as const,
    };
  };
  const x: ForwardInput = {
    dtype: "float16",
    layer: { num_heads: 8, num_kv_heads: 2, head_size: 128 },
    query: f16(T * 8 * 128, [T, 8, 128]),
    key: f16(T * 2 * 128, [T, 2, 128]),
    value: f16(T * 2 * 128, [T, 2, 128]),
    metadata: {
      query_start_loc: ints([0, T]),
      seq_lens: ints([T]),
      block_table: ints(Array.from({ length: 88 }, (_, i) => i + 1), [1, 88]),
      slot_mapping: ints(Array.from({ length: T }, (_, t) => 16 + t)),
    },
    kv_cache: "c",
  };
  const held = { spec, storage: "webgpu" as const };
  const at = 123457;
  x.value!.array.bytes.set([0x00, 0x7e], 2 * at); // a float16 NaN
  // Without deferral the host scan finds it; with it, the batch passes, marked deferred.
  const e = refused422(() => validateForward(x, held), "invalid_batch");
  assert.deepEqual(e.issues!.map((i) => i.path), [["value", at]]);
  const v = validateForward(x, held, undefined, { deferFinite: true });
  assert.equal(v.finite_deferred, true);
  assert.equal(
    validateForward(input(), HELD, undefined, { deferFinite: true }).finite_deferred,
    false,
  );
  // The host scan a plan without the device check gets: the same 422.
  const h = refused422(() => checkFiniteOnHost(v.batch), "invalid_batch");
  assert.deepEqual(h.issues, e.issues);
  // A call that fails anyway lists every problem, the NaN included.
  const bad = {
    ...x,
    metadata: {
      ...x.metadata,
      slot_mapping: ints([...x.metadata.slot_mapping!.values.slice(0, T - 1), 99999]),
    },
  };
  const both = refused422(
    () => validateForward(bad, held, undefined, { deferFinite: true }),
    "invalid_batch",
  );
  assert.deepEqual(both.issues!.map((i) => i.path.join(".")), [
    `metadata.slot_mapping.${T - 1}`,
    `value.${at}`,
  ]);
  // So does a call over a limit: the NaN is scanned now and listed with it, one invalid_batch.
  const over = refused422(
    () =>
      validateForward(x, held, { max_tokens: 1000, max_attended_keys: 2 ** 32 }, {
        deferFinite: true,
      }),
    "invalid_batch",
  );
  assert.deepEqual(over.issues!.map((i) => `${i.path.join(".")}: ${i.message}`), [
    `value.${at}: ${e.issues![0].message}`,
    "query.shape.0: num_tokens 1400 exceeds max_tokens = 1000",
  ]);
});

Deno.test("validate: attachCache takes the validated spec's cache and names a differing field", () => {
  const v = validateForward(input(), HELD);
  const ok = attachCache(v.batch, HostKvCache.create(SPEC));
  assert.equal(ok.cache?.spec.block_size, 4);
  assert.throws(
    () => attachCache(v.batch, HostKvCache.create({ ...SPEC, num_blocks: 9 })),
    /num_blocks is 9, the validated spec's 8/,
  );
  assert.throws(() => attachCache(v.batch, null), /needs/);
});
