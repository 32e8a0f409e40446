/**
 * CPU_REFERENCE (backends/cpu/cpu_reference.ts over backends/cpu/reference.ts) against hand-derived
 * cases and invariants, on fresh random data: exact single-key output, hand softmax, row
 * sums, causal masking, GQA mapping, sliding-window edges, sinks, soft cap, ALiBi, LSE,
 * padding slots, layouts, cache rounding, encoder vs decoder, cross-attention, permuted
 * block tables with a NaN null block, and the descriptor itself.
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../../backends/cpu/cpu_reference.ts";
import { decode, roundTo } from "../../../core/dtype.ts";
import { ServiceError } from "../../../core/errors.ts";
import { HostKvCache } from "../../../backends/cpu/host_cache.ts";
import { toFloat32 } from "../../../core/data.ts";
import { validHostBatch } from "../../../service/host_input.ts";
import type {
  DType,
  ForwardBatch,
  KvCache,
  KvCacheDType,
  KvLayout,
  LayerSpec,
} from "../../../core/types.ts";

const ctx = { gpu: null };

/** Normal(0, std) values, float32-exact. */
function randn(n: number, std = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    a[i] = std * Math.sqrt(-2 * Math.log(1 - Math.random())) *
      Math.cos(2 * Math.PI * Math.random());
  }
  return a;
}

interface Case {
  H: number;
  Hkv: number;
  D: number;
  layer?: Partial<LayerSpec>;
  dtype?: DType;
  /** Query tokens per request; seq_lens default to these (pure prefill). */
  qlens: number[];
  seq?: number[];
  bt?: number[][];
  slots?: number[];
  query?: Float32Array;
  key?: Float32Array | null;
  value?: Float32Array | null;
  cache?: KvCache | null;
  lse?: boolean;
}

function batchOf(c: Case): ForwardBatch {
  const T = c.qlens.reduce((a, b) => a + b, 0);
  const qsl = [0];
  for (const q of c.qlens) qsl.push(qsl[qsl.length - 1] + q);
  const bt = c.bt ?? c.qlens.map(() => [0]);
  const width = Math.max(...bt.map((r) => r.length));
  const attn_type = c.layer?.attn_type ?? "decoder";
  const layer: LayerSpec = {
    num_heads: c.H,
    num_kv_heads: c.Hkv,
    head_size: c.D,
    scale: 1 / Math.sqrt(c.D),
    sliding_window: null,
    logits_soft_cap: null,
    alibi_slopes: null,
    sinks: null,
    attn_type,
    causal: attn_type === "decoder",
    k_scale: 1,
    v_scale: 1,
    ...c.layer,
  };
  const key = c.key === undefined ? randn(T * c.Hkv * c.D) : c.key;
  return {
    dtype: c.dtype ?? "float32",
    layer,
    num_tokens: T,
    query: c.query ?? randn(T * c.H * c.D),
    key,
    value: c.value === undefined ? randn(T * c.Hkv * c.D) : c.value,
    metadata: {
      num_reqs: c.qlens.length,
      query_start_loc: Int32Array.from(qsl),
      seq_lens: Int32Array.from(c.seq ?? c.qlens),
      block_table: Int32Array.from(bt.flatMap((r) => [...r, ...Array(width - r.length).fill(0)])),
      max_blocks_per_req: width,
      slot_mapping: Int32Array.from(c.slots ?? Array.from({ length: T }, (_, t) => t)),
    },
    cache: c.cache === undefined ? null : c.cache,
    return_lse: c.lse ?? true,
  };
}

function cache(
  blocks: number,
  bs: number,
  Hkv: number,
  D: number,
  kv: KvCacheDType = "auto",
  layout: KvLayout = "NHD",
  dtype: DType = "float32",
): HostKvCache {
  return HostKvCache.create({
    num_blocks: blocks,
    block_size: bs,
    num_kv_heads: Hkv,
    head_size: D,
    dtype,
    kv_cache_dtype: kv,
    layout,
  });
}

/** Validates `b` (the one validator), plans and runs it; the output decoded to float32. */
async function forward(b: ForwardBatch) {
  const v = validHostBatch(b, b.cache);
  const r = await CPU_REFERENCE.run(await CPU_REFERENCE.plan(v, ctx), v, ctx);
  return { out: toFloat32(r.output).slice(), lse: r.lse!, r };
}

const dot = (a: ArrayLike<number>, ao: number, b: ArrayLike<number>, bo: number, n: number) => {
  let s = 0;
  for (let d = 0; d < n; d++) s += a[ao + d] * b[bo + d];
  return s;
};
function close(got: number, want: number, tol: number, what: string) {
  assert.ok(
    Math.abs(got - want) <= tol * (1 + Math.abs(want)),
    `${what}: got ${got}, want ${want}`,
  );
}
/** V rows that are one-hot: key token t, every kv head, has a 1 at element t. */
function oneHot(T: number, Hkv: number, D: number): Float32Array {
  const v = new Float32Array(T * Hkv * D);
  for (let t = 0; t < T; t++) for (let h = 0; h < Hkv; h++) v[(t * Hkv + h) * D + t] = 1;
  return v;
}

Deno.test("one token, one key: output is v exactly, lse is the score", async () => {
  const D = 8;
  const c = cache(2, 4, 1, D);
  const b = batchOf({ H: 1, Hkv: 1, D, qlens: [1], bt: [[1]], slots: [4], cache: c });
  const { out, lse } = await forward(b);
  assert.deepEqual(out, b.value);
  close(lse[0], dot(b.query, 0, b.key!, 0, D) / Math.sqrt(D), 1e-6, "lse");
});

Deno.test("two keys: hand softmax; lse hand case", async () => {
  const D = 4;
  const c = cache(1, 4, 1, D);
  // Context key 0 already in the cache, new token at position 1.
  const k0 = randn(D), v0 = randn(D);
  c.writeRow("key", 0, 0, 0, k0);
  c.writeRow("value", 0, 0, 0, v0);
  const b = batchOf({ H: 1, Hkv: 1, D, qlens: [1], seq: [2], slots: [1], cache: c });
  const { out, lse } = await forward(b);
  const s0 = dot(b.query, 0, k0, 0, D) / 2, s1 = dot(b.query, 0, b.key!, 0, D) / 2;
  const e0 = Math.exp(s0), e1 = Math.exp(s1);
  for (let d = 0; d < D; d++) {
    close(out[d], (e0 * v0[d] + e1 * b.value![d]) / (e0 + e1), 1e-6, `out[${d}]`);
  }
  close(lse[0], Math.log(e0 + e1), 1e-6, "lse");
  // Exact constants: q = e0, k = [e0, e1], scale 1 -> s = [1, 0], lse = log(e + 1).
  const q = Float32Array.from([1, 0]);
  const c2 = cache(1, 2, 1, 2);
  const b2 = batchOf({
    H: 1,
    Hkv: 1,
    D: 2,
    qlens: [2],
    query: Float32Array.from([0, 0, ...q]),
    key: Float32Array.from([1, 0, 0, 1]),
    value: Float32Array.from([3, 0, 0, 5]),
    cache: c2,
    layer: { scale: 1 },
  });
  const r2 = await forward(b2);
  close(r2.lse[1], Math.log(Math.E + 1), 1e-7, "lse(e + 1)");
  close(r2.lse[0], 0, 1e-7, "lse of one zero score");
  close(r2.out[2], 3 * Math.E / (Math.E + 1), 1e-7, "out[1][0]");
  close(r2.out[3], 5 / (Math.E + 1), 1e-7, "out[1][1]");
});

Deno.test("softmax rows sum to 1; causal rows end at the diagonal", async () => {
  const T = 6, D = 8, H = 2;
  const b = batchOf({ H, Hkv: 1, D, qlens: [T], value: oneHot(T, 1, D), cache: cache(1, 8, 1, D) });
  const { out } = await forward(b);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < H; h++) {
      const p = out.subarray((t * H + h) * D, (t * H + h + 1) * D);
      close(p.reduce((a, x) => a + x, 0), 1, 1e-6, `row t=${t} h=${h}`);
      for (let k = 0; k < D; k++) {
        assert.ok(k <= t ? p[k] > 0 : p[k] === 0, `t=${t} h=${h} weight of key ${k} is ${p[k]}`);
      }
    }
  }
});

Deno.test("causal: a huge future key does not leak", async () => {
  const D = 4, T = 3;
  const key = randn(T * D), value = randn(T * D);
  key.fill(1e3, 2 * D, 3 * D); // key 2 scores enormously for positive queries
  value.fill(1e30, 2 * D, 3 * D);
  const query = new Float32Array(T * D).fill(1);
  const b = batchOf({ H: 1, Hkv: 1, D, qlens: [T], query, key, value, cache: cache(1, 4, 1, D) });
  const { out } = await forward(b);
  assert.deepEqual(out.subarray(0, D), value.subarray(0, D), "token 0 sees only key 0");
  const s = [0, 1].map((k) => dot(query, D, key, k * D, D) / 2);
  const z = Math.exp(s[0]) + Math.exp(s[1]);
  for (let d = 0; d < D; d++) {
    close(
      out[D + d],
      (Math.exp(s[0]) * value[d] + Math.exp(s[1]) * value[D + d]) / z,
      1e-6,
      `t1[${d}]`,
    );
  }
  assert.ok(out.subarray(0, 2 * D).every((x) => Math.abs(x) < 1e3));
});

Deno.test("GQA: q head h reads kv head floor(h / group)", async () => {
  const H = 6, Hkv = 3, D = 4, T = 3;
  const value = new Float32Array(T * Hkv * D);
  for (let t = 0; t < T; t++) {
    for (let g = 0; g < Hkv; g++) {
      value.fill(10 * (g + 1), (t * Hkv + g) * D, (t * Hkv + g + 1) * D);
    }
  }
  const b = batchOf({ H, Hkv, D, qlens: [T], value, cache: cache(1, 4, Hkv, D) });
  const { out } = await forward(b);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < H; h++) {
      for (let d = 0; d < D; d++) {
        close(out[(t * H + h) * D + d], 10 * (Math.floor(h / 2) + 1), 1e-6, `t${t} h${h}`);
      }
    }
  }
  // And the weights come from that kv head's keys: random V, hand softmax for head 3 (kv 1).
  const b2 = batchOf({ H, Hkv, D, qlens: [2], cache: cache(1, 4, Hkv, D) });
  const { out: o2 } = await forward(b2);
  const h = 3, g = 1, t = 1;
  const s = [0, 1].map((k) =>
    Math.exp(dot(b2.query, (t * H + h) * D, b2.key!, (k * Hkv + g) * D, D) / 2)
  );
  for (let d = 0; d < D; d++) {
    const want = (s[0] * b2.value![g * D + d] + s[1] * b2.value![(Hkv + g) * D + d]) /
      (s[0] + s[1]);
    close(o2[(t * H + h) * D + d], want, 1e-6, `head 3 [${d}]`);
  }
});

Deno.test("sliding window: w=1 sees only itself, w=2 exactly two keys", async () => {
  const T = 5, D = 8;
  for (const w of [1, 2]) {
    const b = batchOf({
      H: 1,
      Hkv: 1,
      D,
      qlens: [T],
      value: oneHot(T, 1, D),
      cache: cache(1, 8, 1, D),
      layer: { sliding_window: w },
    });
    const { out } = await forward(b);
    for (let t = 0; t < T; t++) {
      for (let k = 0; k < D; k++) {
        const seen = k <= t && t - k < w;
        const p = out[t * D + k];
        assert.ok(seen ? p > 0 : p === 0, `w=${w} t=${t} key ${k}: ${p}`);
        if (w === 1 && seen) assert.equal(p, 1);
      }
    }
  }
});

Deno.test("non-causal sliding window is symmetric: |p - k| < w", async () => {
  const T = 6, D = 8, w = 2;
  const b = batchOf({
    H: 1,
    Hkv: 1,
    D,
    qlens: [T],
    value: oneHot(T, 1, D),
    layer: { attn_type: "encoder", causal: false, sliding_window: w },
  });
  const { out } = await forward(b);
  for (let t = 0; t < T; t++) {
    for (let k = 0; k < D; k++) {
      const p = out[t * D + k];
      assert.ok(k < T && Math.abs(t - k) < w ? p > 0 : p === 0, `t=${t} key ${k}: ${p}`);
    }
  }
});

Deno.test("sinks: total weight below 1, matching the formula; lse includes the sink", async () => {
  const T = 4, D = 4, H = 2;
  const sinks = Float32Array.from([0.7, -1.3]);
  const b = batchOf({
    H,
    Hkv: 1,
    D,
    qlens: [T],
    value: oneHot(T, 1, D),
    cache: cache(1, 4, 1, D),
    layer: { sinks },
  });
  const { out, lse } = await forward(b);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < H; h++) {
      const e = Array.from(
        { length: t + 1 },
        (_, k) => Math.exp(dot(b.query, (t * H + h) * D, b.key!, k * D, D) / 2),
      );
      const z = e.reduce((a, x) => a + x, 0) + Math.exp(sinks[h]);
      const p = out.subarray((t * H + h) * D, (t * H + h + 1) * D);
      const sum = p.reduce((a, x) => a + x, 0);
      assert.ok(sum < 1, `t${t} h${h}: weights sum to ${sum}`);
      for (let k = 0; k <= t; k++) close(p[k], e[k] / z, 1e-6, `t${t} h${h} key ${k}`);
      close(lse[h * T + t], Math.log(z), 1e-6, `lse t${t} h${h}`);
    }
  }
});

Deno.test("soft cap: scores bounded by c; matches c*tanh(s/c)", async () => {
  const T = 4, D = 4, cap = 2;
  const b = batchOf({
    H: 1,
    Hkv: 1,
    D,
    qlens: [T],
    query: randn(T * D, 100),
    value: oneHot(T, 1, D),
    cache: cache(1, 4, 1, D),
    layer: { logits_soft_cap: cap },
  });
  const { out, lse } = await forward(b);
  const t = T - 1;
  const e = [0, 1, 2, 3].map((k) =>
    Math.exp(cap * Math.tanh(dot(b.query, t * D, b.key!, k * D, D) / 2 / cap))
  );
  const z = e.reduce((a, x) => a + x, 0);
  const p = out.subarray(t * D, (t + 1) * D);
  for (let k = 0; k < T; k++) close(p[k], e[k] / z, 1e-6, `key ${k}`);
  assert.ok(
    Math.max(...p) / Math.min(...p) <= Math.exp(2 * cap) * (1 + 1e-6),
    "weight ratio within e^(2c)",
  );
  assert.ok(
    lse[t] <= cap + Math.log(T) + 1e-6 && lse[t] >= -cap + Math.log(T) - 1e-6,
    `lse ${lse[t]}`,
  );
});

Deno.test("ALiBi: s += -slope * (p - k), per head", async () => {
  const T = 3, D = 4, H = 2;
  const slopes = Float32Array.from([0.5, 2]);
  const b = batchOf({
    H,
    Hkv: 1,
    D,
    qlens: [T],
    query: new Float32Array(T * H * D), // zero scores: only the bias remains
    value: oneHot(T, 1, D),
    cache: cache(1, 4, 1, D),
    layer: { alibi_slopes: slopes },
  });
  const { out, lse } = await forward(b);
  for (let h = 0; h < H; h++) {
    const e = [2, 1, 0].map((dist) => Math.exp(-slopes[h] * dist)); // p = 2, k = 0, 1, 2
    const z = e[0] + e[1] + e[2];
    for (let k = 0; k < 3; k++) close(out[(2 * H + h) * D + k], e[k] / z, 1e-6, `h${h} key ${k}`);
    close(lse[h * T + 2], Math.log(z), 1e-6, `lse h${h}`);
  }
});

Deno.test("slot -1 writes nothing; written rows hold the keys", async () => {
  const D = 4, Hkv = 2, bs = 4;
  const n = 2 * bs * Hkv * D * 4;
  const kb = crypto.getRandomValues(new Uint8Array(n)),
    vb = crypto.getRandomValues(new Uint8Array(n));
  const c = HostKvCache.fromBytes(cache(2, bs, Hkv, D).spec, kb, vb);
  const b = batchOf({ H: 2, Hkv, D, qlens: [3], seq: [3], bt: [[1]], slots: [4, -1, 6], cache: c });
  b.layer.causal = false;
  await forward(b);
  for (const [which, orig, src] of [["key", kb, b.key!], ["value", vb, b.value!]] as const) {
    const now = c[which];
    const changed = new Set<number>();
    for (const [t, slot] of [[0, 4], [2, 6]]) {
      for (let h = 0; h < Hkv; h++) {
        const o = c.offset(1, slot - 4, h);
        for (let d = 0; d < D * 4; d++) changed.add(o * 4 + d);
        assert.deepEqual([...c.readRow(which, 1, slot - 4, h)], [
          ...src.subarray((t * Hkv + h) * D, (t * Hkv + h + 1) * D),
        ]);
      }
    }
    for (let i = 0; i < n; i++) {
      if (!changed.has(i)) assert.equal(now[i], orig[i], `${which} byte ${i}`);
    }
  }
});

Deno.test("NHD and HND give the same output for the same logical data", async () => {
  const D = 8, Hkv = 2, H = 4, bs = 4;
  const ctxK = randn(5 * Hkv * D), ctxV = randn(5 * Hkv * D);
  const q = randn(2 * H * D), k = randn(2 * Hkv * D), v = randn(2 * Hkv * D);
  const outs = [];
  for (const layout of ["NHD", "HND"] as const) {
    const c = cache(3, bs, Hkv, D, "auto", layout);
    for (let pos = 0; pos < 5; pos++) {
      for (let h = 0; h < Hkv; h++) {
        const blk = [2, 1][Math.floor(pos / bs)];
        c.writeRow("key", blk, pos % bs, h, ctxK, (pos * Hkv + h) * D);
        c.writeRow("value", blk, pos % bs, h, ctxV, (pos * Hkv + h) * D);
      }
    }
    const b = batchOf({
      H,
      Hkv,
      D,
      qlens: [2],
      seq: [7],
      bt: [[2, 1]],
      slots: [5, 6],
      query: q,
      key: k,
      value: v,
      cache: c,
    });
    outs.push({ ...(await forward(b)), bytes: c.key.slice() });
  }
  assert.deepEqual(outs[0].out, outs[1].out);
  assert.deepEqual(outs[0].lse, outs[1].lse);
  assert.notDeepEqual(outs[0].bytes, outs[1].bytes, "the layouts really differ in memory");
});

Deno.test("fp8 / f16 / bf16 caches store rounded values and attend with them", async () => {
  const D = 8;
  for (const kv of ["float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] as const) {
    const fp8 = kv.startsWith("fp8");
    const ks = fp8 ? 0.25 : 1, vs = fp8 ? 2 : 1;
    const c = cache(1, 4, 1, D, kv);
    // Scales are ignored for non-fp8 caches: pass odd ones there to prove it.
    const b = batchOf({
      H: 1,
      Hkv: 1,
      D,
      qlens: [1],
      cache: c,
      layer: { k_scale: fp8 ? ks : 3, v_scale: fp8 ? vs : 5 },
    });
    const { out } = await forward(b);
    const storedK = decode(kv, c.key.slice(0, fp8 ? D : 2 * D));
    const storedV = decode(kv, c.value.slice(0, fp8 ? D : 2 * D));
    for (let d = 0; d < D; d++) {
      assert.equal(storedK[d], roundTo(kv, Math.fround(b.key![d] / ks)), `${kv} K[${d}]`);
      assert.equal(storedV[d], roundTo(kv, Math.fround(b.value![d] / vs)), `${kv} V[${d}]`);
      // `+ 0` folds -0 into 0: a V that rounded to -0 sums to +0 in the float64 accumulator.
      assert.equal(
        out[d] + 0,
        Math.fround(storedV[d] * vs) + 0,
        `${kv} out[${d}] is the dequantized V`,
      );
    }
  }
  // Output rounds to the batch dtype.
  const b16 = batchOf({
    H: 1,
    Hkv: 1,
    D,
    qlens: [3],
    dtype: "bfloat16",
    cache: cache(1, 4, 1, D, "auto", "NHD", "bfloat16"),
  });
  const { out } = await forward(b16);
  assert.ok(out.every((x) => roundTo("bfloat16", x) === x), "bf16 output values");
});

Deno.test("encoder (no cache) equals a non-causal decoder prefill on the same data", async () => {
  const H = 4, Hkv = 2, D = 8, qlens = [3, 5];
  const T = 8, q = randn(T * H * D), k = randn(T * Hkv * D), v = randn(T * Hkv * D);
  for (const attn_type of ["encoder", "encoder_only"] as const) {
    // ALiBi and a window make positions matter; the encoder's seq_lens equal its query lengths.
    const extra = { alibi_slopes: Float32Array.from([0.1, 0.3, 0.5, 0.9]), sliding_window: 3 };
    const enc = batchOf({
      H,
      Hkv,
      D,
      qlens,
      query: q,
      key: k,
      value: v,
      layer: { attn_type, ...extra },
    });
    const dec = batchOf({
      H,
      Hkv,
      D,
      qlens,
      query: q,
      key: k,
      value: v,
      bt: [[0], [1]],
      slots: [0, 1, 2, 8, 9, 10, 11, 12],
      cache: cache(2, 8, Hkv, D),
      layer: { causal: false, ...extra },
    });
    const a = await forward(enc), b = await forward(dec);
    assert.deepEqual(a.out, b.out, attn_type);
    assert.deepEqual(a.lse, b.lse, attn_type);
    // Causal encoder matches the causal decoder too.
    enc.layer.causal = dec.layer.causal = true;
    assert.deepEqual(
      (await forward(enc)).out,
      (await forward({ ...dec, cache: cache(2, 8, Hkv, D) })).out,
    );
  }
});

Deno.test("encoder_decoder: key=null reads the cache written earlier, non-causal", async () => {
  const H = 2, Hkv = 1, D = 4, E = 5;
  const c = cache(2, 4, Hkv, D);
  const layer = { attn_type: "encoder_decoder" as const, causal: false };
  const encK = randn(E * D), encV = randn(E * D);
  // Step 1: one decoder token, the encoder's 5 K/V rows written into blocks [1, 0].
  const step1 = batchOf({
    H,
    Hkv,
    D,
    qlens: [1],
    seq: [E],
    bt: [[1, 0]],
    slots: [4, 5, 6, 7, 0],
    key: encK,
    value: encV,
    cache: c,
    layer,
  });
  await forward(step1);
  // Step 2: two new decoder tokens, no K/V.
  const before = c.key.slice();
  const step2 = batchOf({
    H,
    Hkv,
    D,
    qlens: [2],
    seq: [E],
    bt: [[1, 0]],
    slots: [],
    key: null,
    value: null,
    cache: c,
    layer,
  });
  const { out, lse } = await forward(step2);
  assert.deepEqual(c.key, before, "nothing written");
  // Cross-attention is non-causal: validation refuses layer.causal = true.
  const causalToo = { ...step2, layer: { ...step2.layer, causal: true } };
  await assert.rejects(
    forward(causalToo),
    (e) => e instanceof ServiceError && e.issues?.[0].path.join(".") === "layer.causal",
  );
  for (let t = 0; t < 2; t++) {
    for (let h = 0; h < H; h++) {
      const e = Array.from(
        { length: E },
        (_, k) => Math.exp(dot(step2.query, (t * H + h) * D, encK, k * D, D) / 2),
      );
      const z = e.reduce((a, x) => a + x, 0);
      for (let d = 0; d < D; d++) {
        const want = e.reduce((a, w, k) => a + w * encV[k * D + d], 0) / z;
        close(out[(t * H + h) * D + d], want, 1e-6, `t${t} h${h} [${d}]`);
      }
      close(lse[h * 2 + t], Math.log(z), 1e-6, `lse t${t} h${h}`);
    }
  }
  // A request with queries but no encoder tokens is refused by validation.
  const empty = batchOf({
    H,
    Hkv,
    D,
    qlens: [1],
    seq: [0],
    bt: [[1]],
    slots: [],
    key: null,
    value: null,
    cache: c,
    layer,
  });
  await assert.rejects(
    forward(empty),
    (e) => e instanceof ServiceError && e.issues?.[0].path.join(".") === "metadata.seq_lens.0",
  );
});

Deno.test("permuted block table: the NaN null block 0 is never read", async () => {
  const H = 2, Hkv = 1, D = 4, bs = 2, blocks = 6;
  const c = cache(blocks, bs, Hkv, D);
  c.key.set(new Uint8Array(new Float32Array(bs * D).fill(NaN).buffer));
  c.value.set(new Uint8Array(new Float32Array(bs * D).fill(NaN).buffer));
  // Request 0: 5 tokens in blocks [3, 1, 4]; request 1: 3 tokens in [5, 2]; unused columns -> 0.
  const table = [[3, 1, 4, 0], [5, 2, 0, 0]];
  const slots = [6, 7, 2, 3, 8, 10, 11, 4];
  const b = batchOf({ H, Hkv, D, qlens: [5, 3], bt: table, slots, cache: c });
  const { out, lse } = await forward(b);
  assert.ok(out.every(Number.isFinite) && lse.every(Number.isFinite), "no NaN from the null block");
  for (const [t, q0] of [[4, 0], [7, 5]]) {
    const j = t - q0;
    for (let h = 0; h < H; h++) {
      const e = Array.from(
        { length: j + 1 },
        (_, k) => Math.exp(dot(b.query, (t * H + h) * D, b.key!, (q0 + k) * D, D) / 2),
      );
      const z = e.reduce((a, x) => a + x, 0);
      for (let d = 0; d < D; d++) {
        const want = e.reduce((a, w, k) => a + w * b.value![(q0 + k) * D + d], 0) / z;
        close(out[(t * H + h) * D + d], want, 1e-6, `t${t} h${h} [${d}]`);
      }
    }
  }
});

Deno.test("descriptor: capabilities, cache factories, plan/run contract", async (t) => {
  await t.step("static fields", () => {
    const b = CPU_REFERENCE;
    assert.equal(b.name, "CPU_REFERENCE");
    assert.equal(b.priority, 100);
    assert.equal(b.cache_storage, "host");
    assert.deepEqual(b.requires, { needs_device: false, features: [], limits: {} });
    const c = b.capabilities;
    assert.deepEqual(c.dtypes, ["float32", "float16", "bfloat16"]);
    assert.deepEqual(c.kv_cache_dtypes, [
      "auto",
      "float16",
      "bfloat16",
      "fp8",
      "fp8_e4m3",
      "fp8_e5m2",
    ]);
    assert.deepEqual([c.block_sizes, c.head_sizes], [[], []]);
    assert.deepEqual(c.kv_cache_layouts, ["NHD", "HND"]);
    assert.equal(c.attn_types.length, 4);
    for (
      const f of [
        "sinks",
        "sliding_window",
        "alibi",
        "logits_soft_cap",
        "non_causal",
        "lse",
        "batch_invariant",
      ] as const
    ) {
      assert.equal(c[f], true, f);
    }
    for (
      const f of ["is_mla", "sparse", "mm_prefix", "per_head_quant_scales", "kv_connector"] as const
    ) {
      assert.equal(c[f], false, f);
    }
    assert.equal(c.graph_support, "NEVER");
    assert.equal(c.reorder_batch_threshold, null);
  });
  await t.step("createCache / importCache give host caches", async () => {
    const spec = cache(2, 4, 1, 4, "fp8_e4m3").spec;
    const made = await CPU_REFERENCE.createCache(spec, ctx);
    assert.ok(made instanceof HostKvCache && made.bytes === 2 * 32);
    const bytes = crypto.getRandomValues(new Uint8Array(32));
    const imp = await CPU_REFERENCE.importCache(spec, bytes, bytes, ctx);
    assert.deepEqual((await imp.read()).key, bytes);
  });
  await t.step("a non-host cache is 422 cache_storage_mismatch", async () => {
    const fake: KvCache = {
      spec: cache(1, 4, 1, 4).spec,
      storage: "webgpu",
      bytes: 0,
      read: () => Promise.resolve({ key: new Uint8Array(), value: new Uint8Array() }),
      destroy: () => {},
    };
    const b = batchOf({ H: 1, Hkv: 1, D: 4, qlens: [1], cache: fake });
    await assert.rejects(
      forward(b),
      (e) => e instanceof ServiceError && e.status === 422 && e.code === "cache_storage_mismatch",
    );
  });
  await t.step("lse only when asked; timings; bad block ids rejected", async () => {
    const b = batchOf({ H: 1, Hkv: 1, D: 4, qlens: [2], cache: cache(1, 4, 1, 4), lse: false });
    const { r } = await forward(b);
    assert.equal(r.lse, null);
    assert.deepEqual(Object.keys(r.timings!).sort(), ["attend", "queue", "write"]);
    // A bad block id or slot is rejected by plan, before anything is written.
    for (
      const [bt, slots, path] of [[[3], [0, 1], "block_table"], [
        [0],
        [0, 4],
        "slot_mapping",
      ]] as const
    ) {
      const c = cache(1, 4, 1, 4);
      const bad = batchOf({
        H: 1,
        Hkv: 1,
        D: 4,
        qlens: [2],
        bt: [[...bt]],
        slots: [...slots],
        cache: c,
      });
      await assert.rejects(forward(bad), (e) => {
        assert.ok(e instanceof ServiceError && e.status === 422 && e.code === "invalid_batch");
        assert.equal(e.issues?.[0].path[1], path);
        return true;
      });
      assert.ok(c.key.every((x) => x === 0) && c.value.every((x) => x === 0), "cache unchanged");
    }
  });
});
