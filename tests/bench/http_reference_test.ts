/**
 * The HTTP bench's checker against tests/support/naive.ts (the project's independent float64
 * attention): the bench's own request bodies are decoded into batches, run through the naive
 * reference one after another on one cache (chunked prefill, then decode steps), and every
 * output row is compared with the checker's row attention. Also: the checker's tallies count
 * what they compare, and flag a wrong row.
 * @module
 */
import assert from "node:assert/strict";
import { decode, encode, roundTo } from "../../core/dtype.ts";
import { parseSafetensors } from "../../core/safetensors.ts";
import type { ForwardBatch, KvCacheSpec } from "../../core/types.ts";
import { decodeBody, prefillBody } from "../../bench/http_bodies.ts";
import { checkDecode } from "../../bench/http_checks.ts";
import { attendRow, Reference } from "../../bench/http_reference.ts";
import { chunkQuery, chunksOf, type HttpShape, layoutOf } from "../../bench/http_workload.ts";
import { naiveAttention } from "../support/naive.ts";
import { assertClose } from "../support/compare.ts";
import { plainLayer } from "../../core/layer.ts";

const SHAPE: HttpShape = {
  reqs: 2,
  ctx: 24,
  num_heads: 4,
  num_kv_heads: 2,
  head_size: 16,
  block_size: 4,
  prefill_reqs: 1,
  prefill_tokens: 16, // two chunks per request: the second sees the first's keys
  steps: 3,
  clients: 1,
  layers: 1,
};

/** A bench request body as the host batch the naive reference takes. */
function batchOf(body: Uint8Array): Omit<ForwardBatch, "cache"> {
  const f = parseSafetensors(body);
  const req = JSON.parse(f.metadata.request);
  const ints = (n: string) => {
    const d = f.tensors[n].data;
    return new Int32Array(d.slice().buffer);
  };
  const floats = (n: string) => decode("float16", f.tensors[n].data);
  const qsl = ints("query_start_loc");
  return {
    dtype: "float16",
    layer: plainLayer(req.layer),
    num_tokens: qsl[qsl.length - 1],
    query: floats("query"),
    key: floats("key"),
    value: floats("value"),
    metadata: {
      num_reqs: qsl.length - 1,
      query_start_loc: qsl,
      seq_lens: ints("seq_lens"),
      block_table: ints("block_table"),
      max_blocks_per_req: f.tensors.block_table.shape[1],
      slot_mapping: ints("slot_mapping"),
    },
    return_lse: false,
  };
}

Deno.test("HTTP bench checker agrees with the naive float64 reference, row by row", () => {
  const s = SHAPE, seed = 7, l = layoutOf(s, seed), ref = new Reference(s, seed);
  const H = s.num_heads, D = s.head_size, group = H / s.num_kv_heads;
  const spec: KvCacheSpec = {
    num_blocks: l.num_blocks,
    block_size: s.block_size,
    num_kv_heads: s.num_kv_heads,
    head_size: s.head_size,
    dtype: "float16",
    kv_cache_dtype: "auto",
    layout: "NHD",
  };
  const n = l.num_blocks * s.block_size * s.num_kv_heads * D;
  let cache = {
    spec,
    key: encode("float16", new Float32Array(n)),
    value: encode("float16", new Float32Array(n)),
  };
  const run = (body: Uint8Array) => {
    const r = naiveAttention(batchOf(body), cache);
    cache = { spec, key: encode("float16", r.key_cache), value: encode("float16", r.value_cache) };
    return r.output;
  };
  const close = { atol: 1e-3, rtol: 1e-3 }; // both float64; the naive one rounded to f16
  let rows = 0;
  const chunks = chunksOf(s);
  assert.equal(chunks.length, 4);
  for (const c of chunks) {
    const q = chunkQuery(s, seed, c);
    const want = run(prefillBody(s, l, "id", c, q, ref.ctxK, ref.ctxV));
    for (let row = 0; row < c.n * c.len * H; row++) {
      const tok = Math.floor(row / H), h = row % H;
      const r = c.r0 + Math.floor(tok / c.len), pos = c.p0 + tok % c.len;
      const got = attendRow(s, ref.source(r, null), r, Math.floor(h / group), q, row * D, pos + 1)
        .map((x) => roundTo("float16", x));
      assertClose(got, want.subarray(row * D, (row + 1) * D), {
        ...close,
        label: `chunk ${c.index} row ${row}`,
      });
      rows++;
    }
  }
  for (let step = 0; step < s.steps; step++) {
    const q = ref.decodeStep(0, step);
    const want = run(decodeBody(s, l, "id", step, { q, ...stepKv(ref, step) }));
    for (let row = 0; row < s.reqs * H; row++) {
      const r = Math.floor(row / H), h = row % H;
      const got = attendRow(
        s,
        ref.source(r, 0),
        r,
        Math.floor(h / group),
        q,
        row * D,
        s.ctx + step + 1,
      )
        .map((x) => roundTo("float16", x));
      assertClose(got, want.subarray(row * D, (row + 1) * D), {
        ...close,
        label: `step ${step} row ${row}`,
      });
      rows++;
    }
  }
  assert.equal(rows, s.reqs * s.ctx * H + s.steps * s.reqs * H);
});

/** The K/V the reference regenerated for cache 0's step. */
function stepKv(ref: Reference, step: number) {
  const src = ref.source(0, 0);
  return { k: src.stepK[step], v: src.stepV[step] };
}

Deno.test("HTTP bench checker: tallies what it compares and flags a wrong row", () => {
  const s = SHAPE, seed = 3, ref = new Reference(s, seed), D = s.head_size, H = s.num_heads;
  // Exact float64 answers rounded to f16 for rows 1 and 6 of steps 0 and 1.
  const answer = (step: number, rows: number[]) => {
    const q = ref.decodeStep(0, step);
    const values = new Uint16Array(rows.length * D);
    rows.forEach((row, i) => {
      const r = Math.floor(row / H), h = row % H;
      const o = attendRow(
        s,
        ref.source(r, 0),
        r,
        Math.floor(h / (H / s.num_kv_heads)),
        q,
        row * D,
        s.ctx + step + 1,
      );
      values.set(new Uint16Array(encode("float16", o).buffer), i * D);
    });
    return { cache: 0, step, ms: 1, backend: "x", timings: {}, rows, values };
  };
  const calls = [answer(0, [1, 6]), answer(1, [1, 6])];
  ref.forget(0);
  const ok = checkDecode(ref, calls);
  assert.deepEqual(
    { calls: ok.calls, failed: ok.failed_calls, rows: ok.rows_checked, of: ok.rows_total },
    { calls: 2, failed: 0, rows: 4, of: 2 * s.reqs * H },
  );
  calls[1].values[D + 5] ^= 0x4000; // row 6, element 5: a big change of exponent
  const bad = checkDecode(ref, calls);
  assert.equal(bad.failed_calls, 1);
  assert.match(bad.failures[0], /^decode cache 0 step 1: request 1, head 2, element 5: got /);
});
