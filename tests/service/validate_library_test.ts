/**
 * The library's one validation step (`validHostBatch` / `validateHostBatch` / `validateForward`)
 * refuses, for a caller that skips the HTTP schema, every batch the HTTP path refuses: wrong
 * enums, counts that are not positive, lengths and shapes that disagree, wrong typed-array
 * kinds and missing fields, each as an issue naming the field and its current value, all in one
 * 422 `invalid_batch`, never a TypeError; and a refused call writes nothing to the cache.
 */
import assert from "node:assert/strict";
import { fromFloats } from "../../core/data.ts";
import { type Issue, ServiceError } from "../../core/errors.ts";
import type { ForwardBatch, KvCacheSpec } from "../../core/types.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { NoDeviceProvider } from "../../gpu/device.ts";
import { hostInput, validateHostBatch, validHostBatch } from "../../service/host_input.ts";
import { type ForwardInput, validateForward } from "../../service/validate.ts";
import { AttentionService } from "../../service/service.ts";
import { DECODE_HELD, decodeInput } from "./decode_input.ts";
import { fakeBackend } from "./helpers.ts";

/** The cache of the brief's batch: 2 blocks of 16, 1 kv head of 32. */
const SPEC: KvCacheSpec = {
  num_blocks: 2,
  block_size: 16,
  num_kv_heads: 1,
  head_size: 32,
  dtype: "float32",
  kv_cache_dtype: "auto",
  layout: "NHD",
};

// deno-lint-ignore no-explicit-any
type Loose = any;

/** One decode token at position 16 (17 keys, 2 blocks), 2 heads over 1 kv head of 32. */
function batch(): Omit<ForwardBatch, "cache"> {
  return {
    dtype: "float32",
    layer: {
      num_heads: 2,
      num_kv_heads: 1,
      head_size: 32,
      scale: 0.25,
      sliding_window: null,
      logits_soft_cap: null,
      alibi_slopes: null,
      sinks: null,
      attn_type: "decoder",
      causal: true,
      k_scale: 1,
      v_scale: 1,
    },
    num_tokens: 1,
    query: new Float32Array(64).fill(0.5),
    key: new Float32Array(32).fill(1),
    value: new Float32Array(32).fill(2),
    metadata: {
      num_reqs: 1,
      query_start_loc: Int32Array.of(0, 1),
      seq_lens: Int32Array.of(17),
      block_table: Int32Array.of(0, 1),
      max_blocks_per_req: 2,
      slot_mapping: Int32Array.of(16),
    },
    return_lse: false,
  };
}

/** The batch with `edit` applied to a deep copy (loosely typed: library callers are). */
function bad(edit: (b: Loose) => void): Loose {
  const b: Loose = batch();
  b.layer = { ...b.layer };
  b.metadata = { ...b.metadata };
  edit(b);
  return b;
}

/** The issues of the 422 `invalid_batch` that `f` throws (fails on a TypeError or none). */
function issuesOf(f: () => unknown): Issue[] {
  try {
    f();
  } catch (e) {
    assert.ok(e instanceof ServiceError, `expected a ServiceError, got ${e}`);
    assert.equal(e.status, 422, e.message);
    assert.equal(e.code, "invalid_batch", e.message);
    return e.issues!;
  }
  assert.fail("expected 422 invalid_batch, the batch passed validation");
}

/** The issue at `path` (fails naming the issues there are). */
function at(issues: Issue[], path: (string | number)[]): Issue {
  const hit = issues.find((i) => i.path.join(".") === path.join("."));
  assert.ok(hit, `no issue at ${path.join(".")}: ${JSON.stringify(issues)}`);
  return hit;
}

/** The host batch's bullets: each edit, the field it must name, and the value it must show. */
const HOST_CASES: [string, (b: Loose) => void, (string | number)[], RegExp][] = [
  [
    "block_table shorter than num_reqs x max_blocks_per_req",
    (b) => (b.metadata.block_table = Int32Array.of(7)),
    ["metadata", "block_table"],
    /\b1 entr.*\b2\b/,
  ],
  ["query of 63 of 64 elements", (b) => (b.query = new Float32Array(63)), ["query"], /\b63\b/],
  ["value of 2 rows, key of 1", (b) => (b.value = new Float32Array(64)), ["value"], /\b64\b/],
  ["num_heads 0", (b) => (b.layer.num_heads = 0), ["layer", "num_heads"], /\b0\b/],
  ["attn_type bogus", (b) => (b.layer.attn_type = "bogus"), ["layer", "attn_type"], /bogus/],
  ["dtype float64", (b) => (b.dtype = "float64"), ["dtype"], /float64/],
  ["metadata missing", (b) => delete b.metadata, ["metadata"], /missing/],
  ["layer missing", (b) => delete b.layer, ["layer"], /missing/],
  ["query missing", (b) => delete b.query, ["query"], /missing/],
  [
    "slot_mapping missing",
    (b) => delete b.metadata.slot_mapping,
    ["metadata", "slot_mapping"],
    /missing/,
  ],
];

for (const [name, edit, path, shows] of HOST_CASES) {
  Deno.test(`validHostBatch: ${name} is 422 naming ${path.join(".")}`, () => {
    const issues = issuesOf(() => validHostBatch(bad(edit), HostKvCache.create(SPEC)));
    assert.match(at(issues, path).message, shows);
  });
}

Deno.test("validHostBatch: wrong types and null anywhere are issues, never a TypeError", () => {
  const cases: [(b: Loose) => void, (string | number)[]][] = [
    [(b) => (b.layer = null), ["layer"]],
    [(b) => (b.metadata = null), ["metadata"]],
    [(b) => (b.metadata = 5), ["metadata"]],
    [(b) => (b.layer.num_heads = "2"), ["layer", "num_heads"]],
    [(b) => (b.layer.head_size = 1.5), ["layer", "head_size"]],
    [(b) => (b.layer.num_kv_heads = -1), ["layer", "num_kv_heads"]],
    [(b) => (b.layer.causal = "yes"), ["layer", "causal"]],
    [(b) => (b.layer.scale = "big"), ["layer", "scale"]],
    [(b) => (b.layer.sliding_window = "4"), ["layer", "sliding_window"]],
    [(b) => (b.layer.alibi_slopes = 3), ["layer", "alibi_slopes"]],
    [(b) => (b.layer.sinks = {}), ["layer", "sinks"]],
    [(b) => (b.layer.k_scale = null), ["layer", "k_scale"]],
    [(b) => (b.query = Array.from({ length: 64 }, () => 0)), ["query"]],
    [(b) => (b.query = new Float64Array(64)), ["query"]],
    [(b) => (b.query = null), ["query"]],
    [(b) => (b.key = null), ["key"]],
    [(b) => (b.key = "k"), ["key"]],
    [(b) => (b.num_tokens = -1), ["num_tokens"]],
    [(b) => delete b.num_tokens, ["num_tokens"]],
    [(b) => (b.return_lse = 1), ["return_lse"]],
    [(b) => (b.metadata.num_reqs = 1.5), ["metadata", "num_reqs"]],
    [(b) => delete b.metadata.max_blocks_per_req, ["metadata", "max_blocks_per_req"]],
    [(b) => (b.metadata.query_start_loc = [0, 1]), ["metadata", "query_start_loc"]],
    [(b) => (b.metadata.seq_lens = Int32Array.of(17, 1)), ["metadata", "seq_lens"]],
    [(b) => (b.metadata.block_table = new Uint32Array(2)), ["metadata", "block_table"]],
    [(b) => (b.metadata.slot_mapping = null), ["metadata", "slot_mapping"]],
  ];
  for (const [edit, path] of cases) {
    const b = bad(edit);
    const issues = issuesOf(() => validHostBatch(b, HostKvCache.create(SPEC)));
    at(issues, path);
  }
  for (const whole of [null, undefined, 7, "batch", [], {}]) {
    const issues = issuesOf(() => validHostBatch(whole as Loose, HostKvCache.create(SPEC)));
    assert.ok(issues.length >= 1);
  }
  // A cache that is not one.
  at(issuesOf(() => validHostBatch(batch(), 7 as Loose)), ["cache"]);
  at(issuesOf(() => validHostBatch(batch(), { spec: null, storage: "host" } as Loose)), [
    "cache",
    "spec",
  ]);
  at(issuesOf(() => validateHostBatch(batch(), { ...SPEC, num_blocks: 0 })), [
    "cache",
    "spec",
    "num_blocks",
  ]);
});

Deno.test("validHostBatch: every problem of a batch comes in one problem document", () => {
  const b = bad((b) => {
    b.dtype = "float64";
    b.layer.num_heads = 0;
    b.layer.attn_type = "bogus";
    b.query = new Float32Array(63);
    b.metadata.block_table = Int32Array.of(7);
  });
  const issues = issuesOf(() => validHostBatch(b, HostKvCache.create(SPEC)));
  for (
    const p of [["dtype"], ["layer", "num_heads"], ["layer", "attn_type"], [
      "metadata",
      "block_table",
    ]]
  ) at(issues, p);
});

Deno.test("validHostBatch: the valid batch and an encoder batch without cache metadata pass", () => {
  const v = validHostBatch(batch(), HostKvCache.create(SPEC));
  assert.equal(v.metadata.max_blocks_per_req, 2);
  const enc = bad((b) => {
    b.layer.attn_type = "encoder_only";
    b.layer.causal = false;
    b.metadata.seq_lens = Int32Array.of(1);
    b.metadata.block_table = new Int32Array(0);
    b.metadata.max_blocks_per_req = 0;
    b.metadata.slot_mapping = Int32Array.of(-1);
  });
  assert.equal(validHostBatch(enc, null).cache, null);
  delete enc.metadata.block_table;
  delete enc.metadata.slot_mapping;
  delete enc.metadata.max_blocks_per_req;
  assert.equal(validHostBatch(enc, null).cache, null);
});

Deno.test("validateForward: a request-form input is checked the same way", () => {
  const base = decodeInput;
  const cases: [(i: Loose) => void, (string | number)[]][] = [
    [
      (i) => (i.query = { ...i.query, array: fromFloats("float16", new Float32Array(7)) }),
      ["query", "array"],
    ],
    [
      (
        i,
      ) => (i.metadata = {
        ...i.metadata,
        block_table: { shape: [1, 3], values: Int32Array.of(5) },
      }),
      ["metadata", "block_table", "values"],
    ],
    [
      (i) => (i.metadata = { ...i.metadata, seq_lens: { shape: [1], values: [10] } }),
      ["metadata", "seq_lens", "values"],
    ],
    [(i) => (i.query = { ...i.query, array: new Float32Array(8) }), ["query", "array"]],
    [(i) => (i.query = { ...i.query, dtype: "float64" }), ["query", "dtype"]],
    [(i) => (i.query = { ...i.query, shape: [1, -2, 4] }), ["query", "shape"]],
    [(i) => (i.value = { ...i.value, array: fromFloats("float16", new Float32Array(8)) }), [
      "value",
      "array",
    ]],
    [(i) => delete i.metadata, ["metadata"]],
    [(i) => (i.metadata = { ...i.metadata, query_start_loc: undefined }), [
      "metadata",
      "query_start_loc",
    ]],
    [(i) => (i.layer = { ...i.layer, num_heads: 0 }), ["layer", "num_heads"]],
    [(i) => (i.layer = { ...i.layer, attn_type: "bogus" }), ["layer", "attn_type"]],
    [(i) => (i.dtype = "float64"), ["dtype"]],
    [(i) => (i.key = null), ["key"]],
    [(i) => (i.kv_cache_layout = "NDH"), ["kv_cache_layout"]],
    [(i) => (i.return_lse = "yes"), ["return_lse"]],
    [(i) => (i.kv_cache = 3), ["kv_cache"]],
    [(i) => (i.backend = 3), ["backend"]],
    [
      (i) => (i.key_cache = { dtype: "float16", shape: [2, 4, 1, 4], bytes: new Uint8Array(3) }),
      ["key_cache", "bytes"],
    ],
    [(i) => (i.value_cache = { dtype: "int8", shape: [], bytes: new Uint8Array(0) }), [
      "value_cache",
      "dtype",
    ]],
  ];
  for (const [edit, path] of cases) {
    const input: Loose = base();
    edit(input);
    at(issuesOf(() => validateForward(input, DECODE_HELD)), path);
  }
  for (const whole of [null, undefined, 3, [], {}]) {
    assert.ok(issuesOf(() => validateForward(whole as Loose, DECODE_HELD)).length >= 1);
  }
  // The valid input still passes.
  assert.equal(validateForward(base(), DECODE_HELD).batch.num_tokens, 1);
});

/** The cache's bytes, K then V. */
async function contents(c: { read(): Promise<{ key: Uint8Array; value: Uint8Array }> }) {
  const { key, value } = await c.read();
  return [key.slice(), value.slice()];
}

Deno.test("CPU_REFERENCE: a refused host batch leaves the cache as it was", async () => {
  try {
    for (const [name, edit] of HOST_CASES) {
      const cache = HostKvCache.create(SPEC);
      const before = await contents(cache);
      let err: unknown = null;
      try {
        const v = validHostBatch(bad(edit), cache);
        const ctx = { gpu: null };
        await CPU_REFERENCE.run(await CPU_REFERENCE.plan(v, ctx), v, ctx);
      } catch (e) {
        err = e;
      }
      assert.deepEqual(await contents(cache), before, `${name}: the cache was written`);
      assert.ok(err instanceof ServiceError && err.code === "invalid_batch", `${name}: ${err}`);
    }
  } finally {
    await CPU_REFERENCE.close();
  }
});

Deno.test("AttentionService.forward: a refused call leaves the held cache as it was", async () => {
  // A backend that trusts its ValidBatch, as the WebGPU ones do: it writes each slot it is given.
  const service = new AttentionService({
    backends: [fakeBackend()],
    device: new NoDeviceProvider("test without a GPU"),
    memoryBudgetBytes: 1 << 20,
  });
  try {
    const { id } = await service.createCache({
      num_blocks: 2,
      block_size: 16,
      num_kv_heads: 1,
      head_size: 32,
      dtype: "float32",
    });
    const read = async () => {
      const d = await service.cacheData(id);
      return [d.key.slice(), d.value.slice()];
    };
    const before = await read();
    const refusals: [string, () => ForwardInput][] = [
      ["a block_table shorter than its shape", () => {
        const i = hostInput(batch(), id);
        i.metadata.block_table = { shape: [1, 2], values: Int32Array.of(7) };
        return i;
      }],
      ["a query of 63 of 64 elements", () => {
        const i = hostInput(batch(), id);
        i.query = { ...i.query, array: fromFloats("float32", new Float32Array(63)) };
        return i;
      }],
      ["a value of 2 rows where the shape says 1", () => {
        const i = hostInput(batch(), id);
        i.value = { ...i.value!, array: fromFloats("float32", new Float32Array(64)) };
        return i;
      }],
      ["num_heads 0", () => {
        const i = hostInput(batch(), id);
        i.layer = { ...i.layer, num_heads: 0 };
        return i;
      }],
      ["attn_type bogus", () => {
        const i = hostInput(batch(), id);
        i.layer = { ...i.layer, attn_type: "bogus" as Loose };
        return i;
      }],
      ["no slot_mapping", () => {
        const i = hostInput(batch(), id);
        delete i.metadata.slot_mapping;
        i.metadata = { ...i.metadata, slot_mapping: null as Loose };
        return i;
      }],
    ];
    for (const [name, make] of refusals) {
      let err: unknown = null;
      await service.forward(make()).catch((e) => (err = e));
      assert.deepEqual(await read(), before, `${name}: the cache was written`);
      assert.ok(
        err instanceof ServiceError && err.status === 422 && err.code === "invalid_batch",
        `${name}: ${err}`,
      );
    }
    await assert.rejects(
      () => service.forward(null as Loose),
      (e: unknown) => e instanceof ServiceError && e.code === "invalid_batch",
    );
    // The valid call runs and writes its slot.
    await service.forward(hostInput(batch(), id));
    assert.notDeepEqual(await read(), before);
  } finally {
    await service.close();
  }
});
