/**
 * Load: 32 concurrent clients against a real server process (server/main.ts --no-gpu, so
 * CPU_REFERENCE) for LOAD_SECONDS (default 5; the README's figure uses 20). Every answer is
 * checked against the float64 reference of tests/server/helpers.ts, and concurrent answers
 * must equal sequential ones bit for bit:
 *
 * - 24 clients send stateless calls (encoder_only, and prefill over an inline cache) drawn from
 *   a fixed set whose sequential answers were taken first;
 * - 8 clients each own a server-held cache and run prefill then decode steps on it; afterwards
 *   every step is replayed sequentially on a fresh cache and both the outputs and the final
 *   cache bytes must match.
 *
 * Prints requests, throughput and latency percentiles. `SEED=n` fixes the data.
 */
import assert from "node:assert/strict";
import { AttentionClient, type ForwardAnswer, type ForwardBody } from "../../client/client.ts";
import { Rng } from "../support/rng.ts";
import { refAttention, to3d } from "./helpers.ts";
import { spawnServer } from "./process.ts";

const SECONDS = Number(Deno.env.get("LOAD_SECONDS") ?? 5);
const SEED = Number(Deno.env.get("SEED") ?? Math.floor(Math.random() * 2 ** 31));
const CLIENTS = 32, HELD_CLIENTS = 8;
const H = 4, HKV = 2, D = 32, BS = 16, BLOCKS_PER_REQ = 8;
const TOL = 2e-5;

const vals = (r: Rng, n: number) => Array.from({ length: n }, () => Math.fround(r.uniform(-1, 1)));
const tensor = (shape: number[], data: number[]) => ({ dtype: "float32", shape, data });

/** A call and its float64 reference output. */
interface Case {
  body: ForwardBody;
  ref: number[];
}

/** Requests' K/V by position plus the new queries → body pieces and the reference. */
function attend(qs: number[][][][], ks: number[][][][], vs: number[][][][], causal: boolean) {
  const ref: number[] = [];
  qs.forEach((q, i) =>
    ref.push(...refAttention({ q, k: ks[i], v: vs[i] }, { causal }).out.flat(2))
  );
  return ref;
}

function encoderCase(r: Rng): Case {
  const T = 2 + r.int(30);
  const q = vals(r, T * H * D), k = vals(r, T * HKV * D), v = vals(r, T * HKV * D);
  const ref = attend([to3d(q, T, H, D)], [to3d(k, T, HKV, D)], [to3d(v, T, HKV, D)], false);
  return {
    body: {
      dtype: "float32",
      layer: { num_heads: H, num_kv_heads: HKV, head_size: D, attn_type: "encoder_only" },
      query: tensor([T, H, D], q),
      key: tensor([T, HKV, D], k),
      value: tensor([T, HKV, D], v),
      metadata: { query_start_loc: [0, T], seq_lens: [T] },
    },
    ref,
  };
}

/** Prefill of 2 requests over an inline float32 cache holding some context. */
function inlineCase(r: Rng): Case {
  const NB = 2 * BLOCKS_PER_REQ;
  const ids = r.shuffle(Array.from({ length: NB }, (_, i) => i));
  const table = [ids.slice(0, BLOCKS_PER_REQ), ids.slice(BLOCKS_PER_REQ)];
  const kc = vals(r, NB * BS * HKV * D), vc = vals(r, NB * BS * HKV * D);
  const ctx = [r.int(40), r.int(40)], qlen = [1 + r.int(8), 1 + r.int(8)];
  const T = qlen[0] + qlen[1];
  const q = vals(r, T * H * D), k = vals(r, T * HKV * D), v = vals(r, T * HKV * D);
  const slot = (i: number, p: number) => table[i][Math.floor(p / BS)] * BS + (p % BS);
  const row = (flat: number[], s: number) =>
    to3d(flat.slice(s * HKV * D, (s + 1) * HKV * D), 1, HKV, D)[0];
  const qs: number[][][][] = [], ks: number[][][][] = [], vs: number[][][][] = [];
  const slots: number[] = [];
  let t = 0;
  for (let i = 0; i < 2; i++) {
    ks.push([]);
    vs.push([]);
    for (let p = 0; p < ctx[i]; p++) {
      ks[i].push(row(kc, slot(i, p)));
      vs[i].push(row(vc, slot(i, p)));
    }
    qs.push(to3d(q.slice(t * H * D, (t + qlen[i]) * H * D), qlen[i], H, D));
    for (let j = 0; j < qlen[i]; j++, t++) {
      slots.push(slot(i, ctx[i] + j));
      ks[i].push(row(k, t));
      vs[i].push(row(v, t));
    }
  }
  return {
    body: {
      dtype: "float32",
      layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
      query: tensor([T, H, D], q),
      key: tensor([T, HKV, D], k),
      value: tensor([T, HKV, D], v),
      key_cache: tensor([NB, BS, HKV, D], kc),
      value_cache: tensor([NB, BS, HKV, D], vc),
      metadata: {
        query_start_loc: [0, qlen[0], T],
        seq_lens: [ctx[0] + qlen[0], ctx[1] + qlen[1]],
        block_table: table,
        slot_mapping: slots,
      },
      return_lse: true,
    },
    ref: attend(qs, ks, vs, true),
  };
}

/** One client's server-held cache: 2 requests, a prefill then decode steps. */
class HeldSequence {
  readonly table = [
    [...Array(BLOCKS_PER_REQ).keys()],
    [...Array(BLOCKS_PER_REQ).keys()].map((b) => b + BLOCKS_PER_REQ),
  ];
  k: number[][][][] = [[], []];
  v: number[][][][] = [[], []];
  bodies: ForwardBody[] = [];
  constructor(readonly r: Rng) {}
  get full(): boolean {
    return this.k[0].length >= BLOCKS_PER_REQ * BS;
  }
  next(cache: string): Case {
    const qlen = this.k[0].length === 0 ? [8, 5] : [1, 1];
    const T = qlen[0] + qlen[1];
    const q = vals(this.r, T * H * D), k = vals(this.r, T * HKV * D), v = vals(this.r, T * HKV * D);
    const k3 = to3d(k, T, HKV, D), v3 = to3d(v, T, HKV, D);
    const slots: number[] = [], qs: number[][][][] = [];
    let t = 0;
    for (let i = 0; i < 2; i++) {
      qs.push(to3d(q.slice(t * H * D, (t + qlen[i]) * H * D), qlen[i], H, D));
      for (let j = 0; j < qlen[i]; j++, t++) {
        const p = this.k[i].length;
        slots.push(this.table[i][Math.floor(p / BS)] * BS + (p % BS));
        this.k[i].push(k3[t]);
        this.v[i].push(v3[t]);
      }
    }
    const body: ForwardBody = {
      dtype: "float32",
      layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
      query: tensor([T, H, D], q),
      key: tensor([T, HKV, D], k),
      value: tensor([T, HKV, D], v),
      metadata: {
        query_start_loc: [0, qlen[0], T],
        seq_lens: [this.k[0].length, this.k[1].length],
        block_table: this.table,
        slot_mapping: slots,
      },
      kv_cache: cache,
    };
    this.bodies.push(body);
    return { body, ref: attend(qs, this.k, this.v, true) };
  }
}

const bits = (a: Float32Array) => new Uint32Array(a.buffer, a.byteOffset, a.length);
const sameBits = (a: Float32Array, b: Float32Array) => {
  const x = bits(a), y = bits(b);
  return x.length === y.length && x.every((w, i) => w === y[i]);
};

function checkRef(ans: ForwardAnswer, ref: number[]): number {
  assert.equal(ans.output.values.length, ref.length);
  let m = 0;
  for (let i = 0; i < ref.length; i++) m = Math.max(m, Math.abs(ans.output.values[i] - ref[i]));
  return m;
}

const spec = {
  num_blocks: 2 * BLOCKS_PER_REQ,
  block_size: BS,
  num_kv_heads: HKV,
  head_size: D,
  dtype: "float32" as const,
};

Deno.test(`load: ${CLIENTS} clients for ${SECONDS} s, answers vs float64, concurrent = sequential`, async () => {
  console.log(`load: SEED=${SEED} LOAD_SECONDS=${SECONDS}`);
  const srv = await spawnServer(["--no-gpu"]);
  try {
    const client = new AttentionClient(srv.url);
    const r = new Rng(SEED);
    const cases = Array.from({ length: 24 }, (_, i) => (i % 2 ? inlineCase(r) : encoderCase(r)));
    const seq: ForwardAnswer[] = [];
    for (const c of cases) seq.push(await client.forward(c.body)); // sequential answers first
    cases.forEach((c, i) => assert.ok(checkRef(seq[i], c.ref) < TOL, `case ${i} vs reference`));

    const latencies: number[] = [];
    let errors = 0, mismatches = 0, worst = 0;
    const held: { seq: HeldSequence; answers: ForwardAnswer[]; cache: string }[] = [];
    const deadline = performance.now() + SECONDS * 1000;
    const timed = async <T>(p: () => Promise<T>): Promise<T | null> => {
      const t0 = performance.now();
      try {
        return await p();
      } catch (e) {
        errors++;
        console.error(`load: ${e}`);
        return null;
      } finally {
        latencies.push(performance.now() - t0);
      }
    };
    const stateless = async (c: number) => {
      for (let j = 0; performance.now() < deadline; j++) {
        const i = (c * 7 + j) % cases.length;
        const ans = await timed(() => client.forward(cases[i].body, { binary: (c + j) % 2 === 1 }));
        if (!ans) continue;
        worst = Math.max(worst, checkRef(ans, cases[i].ref));
        if (!sameBits(ans.output.values, seq[i].output.values)) mismatches++;
      }
    };
    const owner = async (c: number) => {
      const cache = (await client.createCache(spec)).id;
      const h = {
        seq: new HeldSequence(new Rng(SEED + 1000 + c)),
        answers: [] as ForwardAnswer[],
        cache,
      };
      held.push(h);
      while (performance.now() < deadline && !h.seq.full) {
        const step = h.seq.next(cache);
        const ans = await timed(() => client.forward(step.body, { binary: c % 2 === 1 }));
        if (!ans) break;
        worst = Math.max(worst, checkRef(ans, step.ref));
        h.answers.push(ans);
      }
      if (performance.now() < deadline) await stateless(c);
    };
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: CLIENTS }, (_, c) => (c < HELD_CLIENTS ? owner(c) : stateless(c))),
    );
    const wall = (performance.now() - t0) / 1000;

    // Replay each held sequence alone on a fresh cache: same outputs, same final cache bytes.
    let steps = 0;
    for (const h of held) {
      const fresh = (await client.createCache(spec)).id;
      for (let s = 0; s < h.answers.length; s++) {
        const again = await client.forward({ ...h.seq.bodies[s], kv_cache: fresh });
        if (!sameBits(again.output.values, h.answers[s].output.values)) mismatches++;
        steps++;
      }
      const [a, b] = await Promise.all([client.cacheData(h.cache), client.cacheData(fresh)]);
      assert.deepEqual(
        a.key_cache.data,
        b.key_cache.data,
        "held cache keys, concurrent vs sequential",
      );
      assert.deepEqual(a.value_cache.data, b.value_cache.data, "held cache values");
    }
    latencies.sort((a, b) => a - b);
    const pct = (p: number) =>
      latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))];
    console.log(
      `load: ${latencies.length} calls by ${CLIENTS} clients in ${wall.toFixed(1)} s ` +
        `(${(latencies.length / wall).toFixed(0)}/s), p50 ${pct(0.5).toFixed(1)} ms, ` +
        `p99 ${pct(0.99).toFixed(1)} ms; ${errors} errors, ${mismatches} concurrent/sequential ` +
        `mismatches; ${steps} held-cache steps replayed; worst |err| vs float64 ${
          worst.toExponential(1)
        }`,
    );
    assert.equal(errors, 0, "errors");
    assert.equal(mismatches, 0, "concurrent answers differ from sequential ones");
    assert.ok(worst < TOL, `worst error vs the float64 reference: ${worst}`);
    assert.ok(latencies.length >= CLIENTS, "every client made calls");
  } finally {
    srv.kill("SIGTERM");
    await srv.exited;
  }
});
