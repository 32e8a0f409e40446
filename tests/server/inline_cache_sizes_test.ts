/**
 * An inline cache's spec is read from `key_cache.shape`; each size axis keeps its rule of
 * core/cache_spec.ts (an integer in [1, 2^31 - 1]) and is refused at its own place in the
 * request, `key_cache.shape[axis]`, in the rule's words. A `num_blocks` axis of 0 passed
 * validation and was refused late by importCache as 422 `invalid_cache_spec` at
 * `["num_blocks"]`, a field the request does not have.
 */
import assert from "node:assert/strict";
import type { ForwardBody } from "../../client/client.ts";
import { builtinBackends } from "../../backends/index.ts";
import { fromFloats } from "../../core/data.ts";
import { ServiceError } from "../../core/errors.ts";
import type { KvLayout } from "../../core/types.ts";
import { NoDeviceProvider } from "../../gpu/device.ts";
import { AttentionService } from "../../service/service.ts";
import { type ForwardInput, validateForward } from "../../service/validate.ts";
import { expectProblem, startServer } from "./helpers.ts";

const H = 1, HKV = 1, D = 4;

/** The rule's words for a size axis of value `v`. */
const ruleWords = (field: string, v: number) =>
  `${field} axis must be an integer in [1, 2147483647], got ${v}`;

/** One bad axis: the cache shape, its layout, the path refused and the message. */
interface Case {
  layout: KvLayout;
  shape: number[];
  axis: number;
  message: string;
}

const CASES: Case[] = [
  { layout: "NHD", shape: [0, 4, HKV, D], axis: 0, message: ruleWords("num_blocks", 0) },
  { layout: "HND", shape: [0, HKV, 4, D], axis: 0, message: ruleWords("num_blocks", 0) },
  { layout: "NHD", shape: [2, 0, HKV, D], axis: 1, message: ruleWords("block_size", 0) },
  { layout: "HND", shape: [2, HKV, 0, D], axis: 2, message: ruleWords("block_size", 0) },
  { layout: "NHD", shape: [2, 4, 0, D], axis: 2, message: ruleWords("num_kv_heads", 0) },
  { layout: "HND", shape: [2, 0, 4, D], axis: 1, message: ruleWords("num_kv_heads", 0) },
  { layout: "NHD", shape: [2, 4, HKV, 0], axis: 3, message: ruleWords("head_size", 0) },
  { layout: "HND", shape: [2, HKV, 4, 0], axis: 3, message: ruleWords("head_size", 0) },
  // A size inside the rule that disagrees with the layer keeps its own words.
  {
    layout: "NHD",
    shape: [2, 4, 3, D],
    axis: 2,
    message: "num_kv_heads axis is 3 but layer.num_kv_heads is 1",
  },
  {
    layout: "HND",
    shape: [2, HKV, 4, 5],
    axis: 3,
    message: "head_size axis is 5 but layer.head_size is 4",
  },
];

const count = (shape: number[]) => shape.reduce((a, b) => a * b, 1);

/** An empty batch (no request, no token) on an inline cache of `shape`. */
function libraryInput(shape: number[], layout: KvLayout): ForwardInput {
  const t = (h: number) => ({
    dtype: "float32" as const,
    shape: [0, h, D],
    array: fromFloats("float32", new Float32Array(0)),
    encoding: "data" as const,
  });
  const cache = () => ({
    dtype: "float32" as const,
    shape: [...shape],
    bytes: new Uint8Array(4 * count(shape)),
  });
  return {
    dtype: "float32",
    layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
    query: t(H),
    key: t(HKV),
    value: t(HKV),
    key_cache: cache(),
    value_cache: cache(),
    kv_cache_layout: layout,
    metadata: {
      query_start_loc: { shape: [1], values: Int32Array.from([0]) },
      seq_lens: { shape: [0], values: new Int32Array(0) },
      block_table: { shape: [0, 0], values: new Int32Array(0) },
      slot_mapping: { shape: [0], values: new Int32Array(0) },
    },
  };
}

/** The same call as an HTTP body. */
function httpBody(shape: number[], layout: KvLayout): ForwardBody {
  const t = (h: number) => ({ dtype: "float32" as const, shape: [0, h, D], data: [] });
  const cache = () => ({
    dtype: "float32" as const,
    shape: [...shape],
    data: new Array(count(shape)).fill(0),
  });
  return {
    dtype: "float32",
    layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
    query: t(H),
    key: t(HKV),
    value: t(HKV),
    key_cache: cache(),
    value_cache: cache(),
    kv_cache_layout: layout,
    metadata: { query_start_loc: [0], seq_lens: [], block_table: [], slot_mapping: [] },
  };
}

/** Asserts `e` is the 422 `invalid_batch` with exactly the case's issue. */
function refusedAt(e: unknown, c: Case): true {
  assert.ok(e instanceof ServiceError, `a ServiceError, not ${e}`);
  assert.equal(e.status, 422, e.message);
  assert.equal(e.code, "invalid_batch", e.message);
  assert.deepEqual(e.issues, [{ path: ["key_cache", "shape", c.axis], message: c.message }]);
  return true;
}

Deno.test("inline cache: each size axis is refused at key_cache.shape[axis] by validateForward", () => {
  for (const c of CASES) {
    assert.throws(() => validateForward(libraryInput(c.shape, c.layout), null), (e) => {
      return refusedAt(e, c);
    }, `${c.layout} ${JSON.stringify(c.shape)}`);
  }
  // The good shapes still pass, in either layout.
  for (const layout of ["NHD", "HND"] as const) {
    const shape = layout === "NHD" ? [2, 4, HKV, D] : [2, HKV, 4, D];
    const v = validateForward(libraryInput(shape, layout), null);
    assert.equal(v.inline?.spec.num_blocks, 2);
    assert.equal(v.inline?.spec.block_size, 4);
  }
});

Deno.test("inline cache: AttentionService.forward refuses each size axis before any import", async () => {
  const svc = new AttentionService({
    backends: builtinBackends(),
    device: new NoDeviceProvider("a test without a GPU"),
    memoryBudgetBytes: 1 << 20,
  });
  try {
    for (const c of CASES) {
      await assert.rejects(
        () => svc.forward(libraryInput(c.shape, c.layout)),
        (e) => refusedAt(e, c),
        `${c.layout} ${JSON.stringify(c.shape)}`,
      );
    }
    assert.equal(svc.caches.usedBytes, 0, "nothing reserved or held");
    // A good inline cache with the empty batch runs.
    const ok = await svc.forward(libraryInput([2, 4, HKV, D], "NHD"));
    assert.equal(ok.backend, "CPU_REFERENCE");
  } finally {
    await svc.close();
  }
});

Deno.test("inline cache: over HTTP a bad size axis is a 422 naming key_cache.shape[axis], both transports", async () => {
  const srv = await startServer();
  try {
    for (const c of CASES) {
      for (const binary of [false, true]) {
        const e = await expectProblem(
          srv.client.forward(httpBody(c.shape, c.layout), { binary }),
          422,
          "invalid_batch",
          ["key_cache", "shape", c.axis],
        );
        assert.deepEqual(
          e.problem.issues,
          [{ path: ["key_cache", "shape", c.axis], message: c.message }],
          `${c.layout} ${JSON.stringify(c.shape)} binary ${binary}`,
        );
      }
    }
    assert.deepEqual(srv.errors, [], "no server fault logged");
    assert.equal(srv.service.caches.usedBytes, 0);
    const ok = await srv.client.forward(httpBody([2, 4, HKV, D], "NHD"));
    assert.deepEqual(ok.output.shape, [0, H, D]);
  } finally {
    await srv.close();
  }
});
