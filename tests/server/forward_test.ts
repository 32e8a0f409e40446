/**
 * Forward numerics over HTTP (real port, CPU_REFERENCE) against an independent float64
 * computation: prefill, decode and chunked-prefill steps on a server-held cache, both
 * transports, base64, inline caches, encoder-only and layer options; the answer's
 * `Server-Timing` header (the handler's `parse`); a step with no new tokens on both transports.
 */
import assert from "node:assert/strict";
import type { ForwardBody } from "../../client/client.ts";
import {
  decodeJsonAnswer,
  decodeSafetensorsAnswer,
  forwardBodyToSafetensors,
} from "../../wire/client_codec.ts";
import { cacheSnapshot, maxAbsDiff, rand, refAttention, startServer, to3d } from "./helpers.ts";
import { BS, D, F32_CACHE, H, HKV, NB, Seqs, TABLE } from "./seqs.ts";

Deno.test("forward over HTTP: prefill, decode, chunked prefill on a held float32 cache (JSON)", async () => {
  const srv = await startServer();
  try {
    const info = await srv.client.createCache(F32_CACHE);
    const seqs = new Seqs(Math.fround);
    for (
      const [name, lens] of [["prefill", [5, 3]], ["decode", [1, 1]], ["mixed", [1, 2]]] as const
    ) {
      const { body, refOut, refLse, T } = seqs.step([...lens], "float32");
      const ans = await srv.client.forward({ ...body, kv_cache: info.id });
      assert.equal(ans.backend, "CPU_REFERENCE");
      assert.deepEqual(ans.output.shape, [T, H, D]);
      assert.equal(ans.output.dtype, "float32");
      const err = maxAbsDiff(ans.output.values, refOut);
      assert.ok(err < 2e-5, `${name}: output max abs err ${err}`);
      assert.deepEqual(ans.lse!.shape, [H, T]);
      assert.ok(maxAbsDiff(ans.lse!.values, refLse) < 2e-5, `${name}: lse`);
      assert.ok(typeof ans.timings?.total === "number");
    }
    // The cache holds exactly what was written, at the slots the test chose.
    const data = await srv.client.cacheData(info.id);
    assert.deepEqual(data.key_cache.shape, [NB, BS, HKV, D]);
    assert.equal(data.key_cache.dtype, "F32");
    const kc = new Float32Array(data.key_cache.data.slice().buffer);
    const vc = new Float32Array(data.value_cache.data.slice().buffer);
    for (let r = 0; r < TABLE.length; r++) {
      seqs.k[r].forEach((kp, p) => {
        const base = seqs.slot(r, p) * HKV * D;
        assert.deepEqual(Array.from(kc.subarray(base, base + HKV * D)), kp.flat(), `K r${r} p${p}`);
        assert.deepEqual(
          Array.from(vc.subarray(base, base + HKV * D)),
          seqs.v[r][p].flat(),
          `V r${r} p${p}`,
        );
      });
    }
  } finally {
    await srv.close();
  }
});

Deno.test("forward over HTTP: float16 through the safetensors transport, HND cache", async () => {
  const srv = await startServer();
  try {
    const info = await srv.client.createCache({
      num_blocks: NB,
      block_size: BS,
      num_kv_heads: HKV,
      head_size: D,
      dtype: "float16",
      layout: "HND",
    });
    assert.equal(info.storage_dtype, "float16");
    const seqs = new Seqs(Math.f16round);
    for (const lens of [[4, 6], [1, 1]]) {
      const { body, refOut, refLse, T } = seqs.step(lens, "float16");
      const ans = await srv.client.forward({ ...body, kv_cache: info.id }, { binary: true });
      assert.equal(ans.backend, "CPU_REFERENCE");
      assert.equal(ans.output.dtype, "float16");
      assert.deepEqual(ans.output.shape, [T, H, D]);
      const err = maxAbsDiff(ans.output.values, refOut);
      assert.ok(err < 2e-3, `f16 output err ${err}`);
      assert.ok(maxAbsDiff(ans.lse!.values, refLse) < 1e-4, "f16 lse");
      for (const x of ans.output.values) assert.equal(x, Math.f16round(x), "output is float16");
    }
  } finally {
    await srv.close();
  }
});

Deno.test("forward over HTTP: base64 in → base64 out; output_encoding overrides", async () => {
  const srv = await startServer();
  try {
    const info = await srv.client.createCache(F32_CACHE);
    const seqs = new Seqs(Math.fround);
    const { body, refOut } = seqs.step([2, 3], "float32");
    const b64 = (t: { dtype: string; shape: number[]; data?: number[] }) => ({
      dtype: t.dtype,
      shape: t.shape,
      base64: new Uint8Array(Float32Array.from(t.data!).buffer).toBase64(),
    });
    const req = {
      ...body,
      kv_cache: info.id,
      query: b64(body.query),
      key: b64(body.key!),
      value: b64(body.value!),
    };
    const res = await fetch(`${srv.url}/v1/attention/forward`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(req),
    });
    assert.equal(res.status, 200);
    const j = await res.json();
    assert.equal(typeof j.output.base64, "string");
    assert.equal(j.output.data, undefined);
    const out = new Float32Array(Uint8Array.fromBase64(j.output.base64).buffer);
    assert.ok(maxAbsDiff(out, refOut) < 2e-5);
    // Same call shape, explicit data encoding (the cache now holds these K/V again: rewrite same slots).
    const seqs2 = new Seqs(Math.fround);
    const again = seqs2.step([2, 3], "float32");
    const ans = await (await fetch(`${srv.url}/v1/attention/forward`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...again.body, kv_cache: info.id, output_encoding: "base64" }),
    })).json();
    assert.equal(typeof ans.output.base64, "string");
  } finally {
    await srv.close();
  }
});

Deno.test("forward over HTTP: inline caches (HND, float16 storage) leave no trace", async () => {
  const srv = await startServer();
  try {
    // Context of 6 tokens for one request already in an inline cache, plus 2 new tokens.
    const ctxLen = 6, newLen = 2, nb = 3, table = [2, 0];
    const kAll = to3d(
      rand((ctxLen + newLen) * HKV * D).map(Math.f16round),
      ctxLen + newLen,
      HKV,
      D,
    );
    const vAll = to3d(
      rand((ctxLen + newLen) * HKV * D).map(Math.f16round),
      ctxLen + newLen,
      HKV,
      D,
    );
    const q = rand(newLen * H * D).map(Math.fround);
    const kc = new Array(nb * HKV * BS * D).fill(0), vc = new Array(nb * HKV * BS * D).fill(0);
    const at = (slot: number, h: number, d: number) =>
      ((Math.floor(slot / BS) * HKV + h) * BS + (slot % BS)) * D + d;
    const slotOf = (p: number) => table[Math.floor(p / BS)] * BS + (p % BS);
    for (let p = 0; p < ctxLen; p++) {
      for (let h = 0; h < HKV; h++) {
        for (let d = 0; d < D; d++) {
          kc[at(slotOf(p), h, d)] = kAll[p][h][d];
          vc[at(slotOf(p), h, d)] = vAll[p][h][d];
        }
      }
    }
    const body: ForwardBody = {
      dtype: "float32",
      layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
      query: { dtype: "float32", shape: [newLen, H, D], data: q },
      key: { dtype: "float32", shape: [newLen, HKV, D], data: kAll.slice(ctxLen).flat(2) },
      value: { dtype: "float32", shape: [newLen, HKV, D], data: vAll.slice(ctxLen).flat(2) },
      metadata: {
        query_start_loc: [0, newLen],
        seq_lens: [ctxLen + newLen],
        block_table: [table],
        slot_mapping: [slotOf(6), slotOf(7)],
      },
      key_cache: { dtype: "float16", shape: [nb, HKV, BS, D], data: kc },
      value_cache: { dtype: "float16", shape: [nb, HKV, BS, D], data: vc },
      kv_cache_layout: "HND",
    };
    const ref = refAttention({ q: to3d(q, newLen, H, D), k: kAll, v: vAll });
    const ans = await srv.client.forward(body);
    assert.ok(maxAbsDiff(ans.output.values, ref.out.flat(2)) < 2e-5);
    assert.equal(ans.lse, undefined, "no lse unless asked");
    const bin = await srv.client.forward(body, { binary: true });
    assert.ok(maxAbsDiff(bin.output.values, ref.out.flat(2)) < 2e-5);
    assert.equal(srv.service.caches.usedBytes, 0, "nothing held");
  } finally {
    await srv.close();
  }
});

Deno.test("forward over HTTP: encoder_only (no cache, non-causal) and layer options", async () => {
  const srv = await startServer();
  try {
    const lens = [3, 4], T = 7;
    const q = rand(T * H * D).map(Math.fround), k = rand(T * HKV * D).map(Math.fround);
    const v = rand(T * HKV * D).map(Math.fround);
    const body: ForwardBody = {
      dtype: "float32",
      layer: { num_heads: H, num_kv_heads: HKV, head_size: D, attn_type: "encoder_only" },
      query: { dtype: "float32", shape: [T, H, D], data: q },
      key: { dtype: "float32", shape: [T, HKV, D], data: k },
      value: { dtype: "float32", shape: [T, HKV, D], data: v },
      metadata: { query_start_loc: [0, 3, 7], seq_lens: lens },
    };
    const ans = await srv.client.forward(body);
    const q3 = to3d(q, T, H, D), k3 = to3d(k, T, HKV, D), v3 = to3d(v, T, HKV, D);
    const ref = [
      ...refAttention({ q: q3.slice(0, 3), k: k3.slice(0, 3), v: v3.slice(0, 3) }, {
        causal: false,
      }).out.flat(2),
      ...refAttention({ q: q3.slice(3), k: k3.slice(3), v: v3.slice(3) }, { causal: false }).out
        .flat(2),
    ];
    assert.ok(maxAbsDiff(ans.output.values, ref) < 2e-5, "encoder_only");

    // Non-causal with a window (both sides: |p - j| < w), sinks and the LSE, which holds the
    // sink term (docs/api.md). The reference helper had neither until a review found it.
    const wo = { causal: false, sliding_window: 2, sinks: [0.4, -0.3, 1.2, 0.1] };
    const ws = await srv.client.forward({
      ...body,
      layer: { ...body.layer, sliding_window: wo.sliding_window, sinks: wo.sinks },
      return_lse: true,
    });
    const parts = [[0, 3], [3, 7]].map(([a, b]) =>
      refAttention({ q: q3.slice(a, b), k: k3.slice(a, b), v: v3.slice(a, b) }, wo)
    );
    const wOut = parts.flatMap((r) => r.out.flat(2));
    assert.ok(maxAbsDiff(ws.output.values, wOut) < 2e-5, "encoder_only, window and sinks");
    const wLse = Array.from({ length: H }, (_, h) => parts.flatMap((r) => r.lse[h])).flat();
    assert.deepEqual(ws.lse!.shape, [H, T]);
    assert.ok(maxAbsDiff(ws.lse!.values, wLse) < 2e-5, "encoder_only, the LSE with the sinks");

    // Decoder with sliding window, soft cap, ALiBi, sinks and a custom scale.
    const info = await srv.client.createCache(F32_CACHE);
    const opts = {
      scale: 0.7,
      sliding_window: 3,
      logits_soft_cap: 1.5,
      alibi: [0.5, 0.25, 0.125, 0.0625],
      sinks: [0.3, -0.2, 1, 0],
    };
    const seqs = new Seqs(Math.fround);
    const { body: b2, refOut } = seqs.step([6, 5], "float32", opts);
    b2.layer = {
      ...b2.layer,
      scale: opts.scale,
      sliding_window: opts.sliding_window,
      logits_soft_cap: opts.logits_soft_cap,
      alibi_slopes: opts.alibi,
      sinks: opts.sinks,
    };
    const a2 = await srv.client.forward({ ...b2, kv_cache: info.id });
    assert.ok(maxAbsDiff(a2.output.values, refOut) < 2e-5, "layer options");
  } finally {
    await srv.close();
  }
});

Deno.test("forward over HTTP: the answer's Server-Timing header carries the handler's parse", async () => {
  const srv = await startServer();
  try {
    const T = 6;
    const q = rand(T * H * D).map(Math.fround), k = rand(T * HKV * D).map(Math.fround);
    const v = rand(T * HKV * D).map(Math.fround);
    const ref = refAttention(
      { q: to3d(q, T, H, D), k: to3d(k, T, HKV, D), v: to3d(v, T, HKV, D) },
      { causal: false },
    ).out.flat(2);
    const t = (shape: number[], data: number[]) => ({ dtype: "float32", shape, data });
    const body: ForwardBody = {
      dtype: "float32",
      layer: { num_heads: H, num_kv_heads: HKV, head_size: D, attn_type: "encoder_only" },
      query: t([T, H, D], q),
      key: t([T, HKV, D], k),
      value: t([T, HKV, D], v),
      metadata: { query_start_loc: [0, T], seq_lens: [T] },
    };
    const bin = "application/octet-stream";
    for (
      const [type, payload] of [
        ["application/json", JSON.stringify(body)],
        [bin, forwardBodyToSafetensors(body)],
      ] as const
    ) {
      const t0 = performance.now();
      const res = await fetch(`${srv.url}/v1/attention/forward`, {
        method: "POST",
        headers: { "content-type": type, accept: type },
        body: payload as BodyInit,
      });
      const bytes = new Uint8Array(await res.arrayBuffer());
      const ms = performance.now() - t0;
      assert.equal(res.status, 200, new TextDecoder().decode(bytes));
      const out = type === bin
        ? decodeSafetensorsAnswer(bytes).output.values
        : decodeJsonAnswer(JSON.parse(new TextDecoder().decode(bytes))).output.values;
      assert.ok(maxAbsDiff(out, ref) < 2e-5, `${type}: output`);
      const timing = res.headers.get("server-timing") ?? "";
      const m = /^parse;dur=(\d+\.\d{3})$/.exec(timing);
      assert.ok(m, `${type}: Server-Timing ${JSON.stringify(timing)}`);
      assert.ok(Number(m[1]) >= 0 && Number(m[1]) <= ms, `${type}: parse ${m[1]} of ${ms} ms`);
    }
  } finally {
    await srv.close();
  }
});

Deno.test("forward over HTTP: a step with no new tokens, on both transports", async () => {
  const srv = await startServer();
  try {
    const info = await srv.client.createCache(F32_CACHE);
    const seqs = new Seqs(Math.fround);
    await srv.client.forward({ ...seqs.step([3, 2], "float32").body, kv_cache: info.id });
    const body: ForwardBody = {
      dtype: "float32",
      layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
      query: { dtype: "float32", shape: [0, H, D], data: [] },
      key: { dtype: "float32", shape: [0, HKV, D], data: [] },
      value: { dtype: "float32", shape: [0, HKV, D], data: [] },
      metadata: {
        query_start_loc: [0, 0, 0],
        seq_lens: [3, 2],
        block_table: TABLE,
        slot_mapping: [],
      },
      kv_cache: info.id,
      return_lse: true,
    };
    // The client once sent an empty plain array as an I32 tensor of shape [0, 0] (a 422).
    const file = new TextDecoder().decode(forwardBodyToSafetensors(body).subarray(8, 2000));
    assert.match(file, /"slot_mapping":\{"dtype":"I32","shape":\[0\]/);
    const before = await cacheSnapshot(srv, info.id);
    for (const binary of [false, true]) {
      const ans = await srv.client.forward(body, { binary });
      assert.deepEqual(ans.output.shape, [0, H, D], `binary ${binary}`);
      assert.equal(ans.output.values.length, 0);
      assert.deepEqual(ans.lse!.shape, [H, 0]);
    }
    assert.equal(
      await cacheSnapshot(srv, info.id),
      before,
      "a step with no new tokens wrote nothing",
    );
  } finally {
    await srv.close();
  }
});
