/**
 * Read-backs lent from the host pool (gpu/host_pool.ts) to safetensors answers over a real
 * port (server/lent_body.ts), on the WebGPU device: calls on two server-held caches of
 * different shapes and dtypes, run concurrently, answer exactly the bytes the same calls give
 * run one after another (no answer ever sees memory lent to another), every answer matches
 * the float64 reference, every lease comes back once its answer was delivered (no leak), and
 * no host-pool lease is taken (on Deno's runtime the answers own its copies of the mapped ranges,
 * on Dawn the server lends them the mapped read-back buffers: gpu/readback_memory.ts); once as the
 * server runs by default, once behind two HTTP worker threads (the answers' bytes then cross to
 * the worker that writes them out).
 */
import assert from "node:assert/strict";
import type { ForwardBody } from "../../client/client.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { WEBGPU_DECODE } from "../../backends/webgpu_decode.ts";
import { hostPool } from "../../gpu/host_pool.ts";
import { lentReadbackStats } from "../../gpu/readback_memory.ts";
import { ownsMappedCopies } from "../../gpu/map_read.ts";
import { MANAGER } from "../support/gpu.ts";
import { freshSeed, GPU_TEST, rng } from "./helpers.ts";
import { maxAbsDiff, refAttention, serverMode, startServer, to3d } from "../server/helpers.ts";

const opts = GPU_TEST;

interface Shape {
  dtype: "float16" | "float32";
  layout: "NHD" | "HND";
  H: number;
  HKV: number;
  D: number;
}
const SHAPES: Shape[] = [
  { dtype: "float16", layout: "NHD", H: 4, HKV: 2, D: 64 },
  { dtype: "float32", layout: "HND", H: 8, HKV: 2, D: 128 },
];
const BS = 16, NB = 8, TABLE = [[3, 0, 6], [5, 1, 7]];
/** Tokens each request adds per step: a prefill, then decode steps. */
const STEPS = [[5, 3], [1, 1], [1, 1], [2, 1]];

/** Every step's body and reference output for one cache, from one seed. */
function script(s: Shape, seed: number): { body: ForwardBody; ref: number[] }[] {
  const r = rng(seed);
  const round = s.dtype === "float16" ? Math.f16round : Math.fround;
  const rand = (n: number) => Array.from({ length: n }, () => round(r() * 2 - 1));
  const k: number[][][][] = [[], []], v: number[][][][] = [[], []];
  return STEPS.map((lens) => {
    const T = lens[0] + lens[1];
    const q = rand(T * s.H * s.D), kn = rand(T * s.HKV * s.D), vn = rand(T * s.HKV * s.D);
    const q3 = to3d(q, T, s.H, s.D), k3 = to3d(kn, T, s.HKV, s.D), v3 = to3d(vn, T, s.HKV, s.D);
    const slots: number[] = [], seq: number[] = [], ref: number[] = [];
    let t = 0;
    lens.forEach((n, req) => {
      const t0 = t;
      for (let i = 0; i < n; i++, t++) {
        const p = k[req].length;
        slots.push(TABLE[req][Math.floor(p / BS)] * BS + (p % BS));
        k[req].push(k3[t]);
        v[req].push(v3[t]);
      }
      seq.push(k[req].length);
      ref.push(...refAttention({ q: q3.slice(t0, t), k: k[req], v: v[req] }).out.flat(2));
    });
    const body = {
      dtype: s.dtype,
      layer: { num_heads: s.H, num_kv_heads: s.HKV, head_size: s.D },
      query: { dtype: s.dtype, shape: [T, s.H, s.D], data: q },
      key: { dtype: s.dtype, shape: [T, s.HKV, s.D], data: kn },
      value: { dtype: s.dtype, shape: [T, s.HKV, s.D], data: vn },
      metadata: {
        query_start_loc: [0, lens[0], T],
        seq_lens: seq,
        block_table: TABLE,
        slot_mapping: slots,
      },
    } as ForwardBody;
    return { body, ref };
  });
}

/** Host leases and lent read-back buffers out, once they stop going down (1 s at most). */
async function settled(baseline: number[]): Promise<number[]> {
  const out = () => [hostPool.stats().in_use, lentReadbackStats().out];
  for (let i = 0; i < 100 && out().some((n, j) => n > baseline[j]); i++) {
    await new Promise((r) => setTimeout(r, 10));
  }
  return out();
}

/** The server of these tests, behind `workers` HTTP worker threads (0: none). */
async function gpuServer(workers: number) {
  const before = serverMode.httpWorkers;
  serverMode.httpWorkers = workers;
  try {
    return await startServer({
      backends: [WEBGPU_DECODE as AttentionBackend],
      device: MANAGER,
      memoryBudgetBytes: 2 ** 28,
    });
  } finally {
    serverMode.httpWorkers = before;
  }
}

for (const workers of [0, 2]) {
  const front = workers ? `, behind ${workers} HTTP workers` : "";
  Deno.test({
    name:
      `lent readbacks: concurrent calls on two caches = the same calls in sequence; no leak${front}`,
    ...opts,
    fn: () => concurrentEqualsSequential(workers),
  });
}

async function concurrentEqualsSequential(workers: number): Promise<void> {
  const srv = await gpuServer(workers);
  try {
    const seeds = SHAPES.map(() => freshSeed());
    const scripts = SHAPES.map((s, i) => script(s, seeds[i]));
    const caches = () =>
      Promise.all(SHAPES.map((s) =>
        srv.client.createCache({
          num_blocks: NB,
          block_size: BS,
          num_kv_heads: s.HKV,
          head_size: s.D,
          dtype: s.dtype,
          layout: s.layout,
        })
      ));
    const call = (c: number, step: number, id: string) =>
      srv.client.forward({ ...scripts[c][step].body, kv_cache: id }, { binary: true });
    const baseline = [hostPool.stats().in_use, lentReadbackStats().out];
    const lentBefore = lentReadbackStats();
    // One after another.
    const seqIds = await caches();
    const seqOut: Float32Array[][] = SHAPES.map(() => []);
    for (let step = 0; step < STEPS.length; step++) {
      for (let c = 0; c < SHAPES.length; c++) {
        const a = await call(c, step, seqIds[c].id);
        assert.equal(a.backend, "WEBGPU_DECODE");
        const tol = SHAPES[c].dtype === "float16" ? 3e-3 : 2e-5;
        const err = maxAbsDiff(a.output.values, scripts[c][step].ref);
        assert.ok(err < tol, `cache ${c} step ${step}: max abs err ${err} (seed ${seeds[c]})`);
        seqOut[c].push(a.output.values);
      }
    }
    assert.deepEqual(await settled(baseline), baseline, "memory out after sequential answers");
    const before = hostPool.stats();
    // Concurrently on fresh caches: each step's two calls in flight together.
    const conIds = await caches();
    for (let step = 0; step < STEPS.length; step++) {
      const answers = await Promise.all(SHAPES.map((_, c) => call(c, step, conIds[c].id)));
      answers.forEach((a, c) => {
        assert.deepEqual(a.output.values, seqOut[c][step], `cache ${c} step ${step}`);
      });
    }
    assert.deepEqual(await settled(baseline), baseline, "memory out after concurrent answers");
    // Every lent buffer came back by its answer's delivery, none by the collector.
    const lent = lentReadbackStats();
    assert.equal(lent.collected, lentBefore.collected, "a lent read-back was never released");
    const calls = 2 * STEPS.length * SHAPES.length;
    const dawn = !ownsMappedCopies(MANAGER.current()!.device);
    assert.equal(lent.lent - lentBefore.lent, dawn ? calls : 0, "answers lent the mapping");
    const after = hostPool.stats();
    // Deno's runtime: a result owns the runtime's own copy of the range. Dawn: the server lends
    // each answer the mapped read-back buffer itself (gpu/readback_memory.ts). No lease either
    // way.
    assert.deepEqual([after.created, after.reused], [before.created, before.reused]);
  } finally {
    await srv.close();
  }
}
