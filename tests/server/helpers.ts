/**
 * Test helpers: a real server on port 0 (CPU_REFERENCE, no GPU), a float64 attention
 * reference independent of every backend, and random paged-batch builders.
 * @module
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import type {
  AttentionBackend,
  DeviceProvider,
  DeviceReport,
  GpuContext,
} from "../../core/types.ts";
import { AttentionApiError, AttentionClient, type ForwardBody } from "../../client/client.ts";
import type { AccessPolicy } from "../../server/auth.ts";
import { DEFAULT_MAX_BODY_BYTES } from "../../server/body.ts";
import { createHandler } from "../../server/handler.ts";
import { serveHttp } from "../../server/worker_front.ts";
import { Metrics } from "../../server/metrics.ts";
import { AttentionService } from "../../service/service.ts";
import type { CallLimits } from "../../service/validate.ts";

/** A device provider with no device (local fake: no dependency on gpu/). */
export class FakeNoDevice implements DeviceProvider {
  current(): GpuContext | null {
    return null;
  }
  acquire(): Promise<GpuContext | null> {
    return Promise.resolve(null);
  }
  report(): DeviceReport {
    return {
      available: false,
      runtime: "none",
      reason: "test: no GPU",
      features: [],
      limits: {},
      generation: 0,
    };
  }
}

/** A running test server. */
export interface TestServer {
  url: string;
  port: number;
  metrics: Metrics;
  client: AttentionClient;
  service: AttentionService;
  errors: unknown[];
  close(): Promise<void>;
}

/**
 * How {@link startServer} and process.ts's spawnServer serve: `httpWorkers` > 0 puts that many
 * HTTP worker threads in front (server/worker_front.ts), `engine` "http1" serves with
 * server/http1_server.ts. Set from ATTN_TEST_HTTP_WORKERS and ATTN_TEST_HTTP_ENGINE; the worker
 * and engine suites (http_workers_suites_test.ts, http1_suites_test.ts) set them for the suites
 * they import.
 */
export const serverMode: { httpWorkers: number; engine: "deno" | "http1" } = {
  httpWorkers: Number(Deno.env.get("ATTN_TEST_HTTP_WORKERS") ?? 0),
  engine: Deno.env.get("ATTN_TEST_HTTP_ENGINE") === "http1" ? "http1" : "deno",
};

/** {@link startServer} with the service's own HTTP/1.1 server (`--http-engine http1`), whatever the mode. */
export async function startHttp1Server(
  opts: Parameters<typeof startServer>[0] = {},
): Promise<TestServer> {
  const before = serverMode.engine;
  serverMode.engine = "http1";
  try {
    return await startServer(opts);
  } finally {
    serverMode.engine = before;
  }
}

/** Starts a real server on 127.0.0.1:0 (with HTTP workers when {@link serverMode} asks). */
export async function startServer(opts: {
  maxBodyBytes?: number;
  maxJsonBodyBytes?: number;
  memoryBudgetBytes?: number;
  backends?: AttentionBackend[];
  device?: DeviceProvider;
  access?: AccessPolicy;
  /** Extra headers on every call of the typed client (e.g. a token). */
  clientHeaders?: Record<string, string>;
  /** The instance name the handler answers with. */
  instance?: string;
  /** Per-call limits (default DEFAULT_CALL_LIMITS). */
  limits?: Partial<CallLimits>;
} = {}): Promise<TestServer> {
  const service = new AttentionService({
    backends: opts.backends ?? [CPU_REFERENCE as AttentionBackend],
    device: opts.device ?? new FakeNoDevice(),
    memoryBudgetBytes: opts.memoryBudgetBytes ?? 64 * 1024 * 1024,
    limits: opts.limits,
  });
  const errors: unknown[] = [];
  const metrics = new Metrics({
    cacheBytes: () => service.caches.usedBytes,
    cacheCount: () => service.caches.list().length,
  });
  const handler = createHandler(service, {
    maxBodyBytes: opts.maxBodyBytes,
    maxJsonBodyBytes: opts.maxJsonBodyBytes,
    access: opts.access,
    metrics,
    log: (_m, e) => errors.push(e),
    instance: opts.instance,
  });
  const server = await serveHttp({
    engine: serverMode.engine,
    workers: serverMode.httpWorkers,
    port: 0,
    hostname: "127.0.0.1",
    access: opts.access ?? {},
    maxBodyBytes: opts.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES,
    maxJsonBodyBytes: opts.maxJsonBodyBytes,
    log: (_m, e) => errors.push(e),
    metrics,
    instance: opts.instance,
  }, handler);
  const url = `http://127.0.0.1:${server.addr.port}`;
  return {
    url,
    port: server.addr.port,
    metrics,
    client: new AttentionClient(url, { headers: opts.clientHeaders }),
    service,
    errors,
    async close() {
      await server.shutdown();
      await service.close();
    },
  };
}

/** Expects an AttentionApiError with a status, code and (optionally) an issue at a path. */
export async function expectProblem(
  p: Promise<unknown>,
  status: number,
  code: string,
  path?: (string | number)[],
): Promise<AttentionApiError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof AttentionApiError, `expected AttentionApiError, got ${e}`);
    assert.equal(e.status, status, JSON.stringify(e.problem));
    assert.equal(e.problem.status, status);
    assert.equal(e.code, code, JSON.stringify(e.problem));
    assert.equal(typeof e.problem.type, "string");
    assert.equal(typeof e.problem.title, "string");
    assert.equal(typeof e.problem.detail, "string");
    assert.ok(!/\n\s+at /.test(JSON.stringify(e.problem)), "no stack trace");
    if (path) {
      const paths = (e.problem.issues ?? []).map((i) => JSON.stringify(i.path));
      assert.ok(
        paths.includes(JSON.stringify(path)),
        `no issue at ${JSON.stringify(path)}: ${paths.join(" ")}`,
      );
    }
    return e;
  }
  assert.fail(`expected a ${status} ${code} problem, the call succeeded`);
}

/** Uniform random values in [-1, 1). */
export function rand(n: number): number[] {
  return Array.from({ length: n }, () => Math.random() * 2 - 1);
}

/** One request's keys/values by position, for the reference. */
export interface RefRequest {
  /** [qlen][H][D] */
  q: number[][][];
  /** [seq_len][Hkv][D] */
  k: number[][][];
  v: number[][][];
}

/** Reference options. */
export interface RefOptions {
  scale?: number;
  causal?: boolean;
  sliding_window?: number | null;
  logits_soft_cap?: number | null;
  alibi?: number[] | null;
  sinks?: number[] | null;
}

/**
 * float64 paged-attention reference for one request: its queries are the last qlen positions
 * of its seq_len keys. Returns out [qlen][H][D] and lse [H][qlen].
 */
export function refAttention(
  r: RefRequest,
  o: RefOptions = {},
): { out: number[][][]; lse: number[][] } {
  const ql = r.q.length, sl = r.k.length, H = r.q[0]?.length ?? 0, D = r.q[0]?.[0]?.length ?? 0;
  const Hkv = r.k[0]?.length ?? 1;
  const scale = o.scale ?? 1 / Math.sqrt(D);
  const causal = o.causal ?? true;
  const out: number[][][] = [], lse: number[][] = Array.from({ length: H }, () => []);
  for (let i = 0; i < ql; i++) {
    const p = sl - ql + i;
    out.push([]);
    for (let h = 0; h < H; h++) {
      const kh = Math.floor(h / (H / Hkv));
      const s: number[] = [], idx: number[] = [];
      for (let j = 0; j < sl; j++) {
        if (causal && j > p) continue;
        // The window: p - j < w; without causality both sides, |p - j| < w (docs/api.md).
        if (o.sliding_window && (causal ? p - j : Math.abs(p - j)) >= o.sliding_window) continue;
        let x = 0;
        for (let d = 0; d < D; d++) x += r.q[i][h][d] * r.k[j][kh][d];
        x *= scale;
        if (o.logits_soft_cap) x = o.logits_soft_cap * Math.tanh(x / o.logits_soft_cap);
        if (o.alibi) x += -o.alibi[h] * (p - j);
        s.push(x);
        idx.push(j);
      }
      const m = Math.max(...s, o.sinks ? o.sinks[h] : -Infinity);
      let den = 0;
      const acc = new Array(D).fill(0);
      s.forEach((x, n) => {
        const e = Math.exp(x - m);
        den += e;
        for (let d = 0; d < D; d++) acc[d] += e * r.v[idx[n]][kh][d];
      });
      if (o.sinks) den += Math.exp(o.sinks[h] - m);
      lse[h].push(m + Math.log(den)); // with the sink (docs/api.md: lse)
      out[i].push(acc.map((a) => a / den));
    }
  }
  return { out, lse };
}

/** Reshapes a flat array into [a][b][c]. */
export function to3d(flat: ArrayLike<number>, a: number, b: number, c: number): number[][][] {
  return Array.from(
    { length: a },
    (_, i) =>
      Array.from(
        { length: b },
        (_, j) => Array.from({ length: c }, (_, k) => flat[(i * b + j) * c + k]),
      ),
  );
}

/** Largest absolute difference of two equally long arrays. */
export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  assert.equal(a.length, b.length, "lengths differ");
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

/** A held cache's bytes, K then V (base64), to tell whether a call wrote anything. */
export async function cacheSnapshot(srv: TestServer, id: string): Promise<string> {
  const d = await srv.client.cacheData(id);
  return d.key_cache.data.toBase64() + "|" + d.value_cache.data.toBase64();
}

/** The dtype, layer and random float32 q / k / v of a call of `t` tokens. */
function f32Tokens(t: number, h: number, hkv: number, d: number) {
  return {
    dtype: "float32" as const,
    layer: { num_heads: h, num_kv_heads: hkv, head_size: d },
    query: { dtype: "float32" as const, shape: [t, h, d], data: rand(t * h * d) },
    key: { dtype: "float32" as const, shape: [t, hkv, d], data: rand(t * hkv * d) },
    value: { dtype: "float32" as const, shape: [t, hkv, d], data: rand(t * hkv * d) },
  };
}

/**
 * A float32 prefill of `t` tokens of one request (random data), writing slots `first` ..
 * `first + t - 1` through blocks 0, 1, ... of block size `bs`.
 */
export function prefillBody(
  o: { h: number; hkv: number; d: number; bs: number; t: number; first?: number },
): ForwardBody {
  const { h, hkv, d, bs, t } = o, first = o.first ?? 0;
  const blocks = Array.from({ length: Math.ceil((first + t) / bs) }, (_, i) => i);
  return {
    ...f32Tokens(t, h, hkv, d),
    metadata: {
      query_start_loc: [0, t],
      seq_lens: [first + t],
      block_table: [blocks],
      slot_mapping: Array.from({ length: t }, (_, i) => first + i),
    },
  };
}

/**
 * A one-token decode step on cache `kv_cache` writing `slot` and attending to it alone (block 0),
 * float32, `h` q / `hkv` kv heads of `d`.
 */
export function oneTokenBody(
  kv_cache: string,
  slot: number,
  o: { h: number; hkv: number; d: number } = { h: 4, hkv: 2, d: 8 },
): ForwardBody {
  return {
    ...f32Tokens(1, o.h, o.hkv, o.d),
    metadata: { query_start_loc: [0, 1], seq_lens: [1], block_table: [[0]], slot_mapping: [slot] },
    kv_cache,
  };
}

/**
 * An encoder_only call (no cache, non-causal, MHA) of `T` tokens, `H` heads of `D`, fresh
 * float32 data, and its float64 reference output flattened (computed when first read: a call
 * made only to keep the server busy never pays for it). Its cost grows with T^2: the tests that
 * need a call still running (shutdown, deploy) make it long.
 */
export function encoderCall(
  T: number,
  H: number,
  D: number,
): { readonly body: ForwardBody; readonly ref: number[] } {
  const data = () => rand(T * H * D).map(Math.fround);
  const q = data(), k = data(), v = data();
  const tensor = (x: number[]) => ({ dtype: "float32", shape: [T, H, D], data: x });
  const r = (x: number[]) => to3d(x, T, H, D);
  let ref: number[] | undefined;
  return {
    body: {
      dtype: "float32",
      layer: { num_heads: H, num_kv_heads: H, head_size: D, attn_type: "encoder_only" },
      query: tensor(q),
      key: tensor(k),
      value: tensor(v),
      metadata: { query_start_loc: [0, T], seq_lens: [T] },
    },
    get ref() {
      return ref ??= refAttention({ q: r(q), k: r(k), v: r(v) }, { causal: false }).out.flat(2);
    },
  };
}
