/**
 * A review of the environment-variable rules (core/env.ts, server/serve_env.ts) and of the device
 * threads' liveness watchdog (server/thread_watchdog.ts): each test states what an operator or a
 * library user expects, and failed when written. No GPU needed (CPU_REFERENCE threads; the
 * front's `hang` hook blocks a thread's JS thread as a long synchronous task would).
 */
import assert from "node:assert/strict";
import { logged, startNoGpuThreads } from "./no_gpu_threads.ts";
import type { DeviceThreads } from "../../server/device_threads.ts";
import type { WatchdogOptions } from "../../server/thread_watchdog.ts";
import { raceTimeout } from "../../core/timeout.ts";
import { HeldSeq } from "./held_seq.ts";
import { spawnServer } from "./process.ts";

const MAIN = new URL("../../server/main.ts", import.meta.url).pathname;
const CONFIG = new URL("../../deno.json", import.meta.url).pathname;
const MOD = new URL("../../mod.ts", import.meta.url).href;

/** `threads` CPU_REFERENCE device threads in process, with `watchdog`. */
function threadsFront(
  threads: number,
  watchdog: WatchdogOptions,
  lines: string[],
): Promise<DeviceThreads> {
  return startNoGpuThreads(threads, { watchdog, log: (m) => lines.push(m) });
}

const get = (front: DeviceThreads, path: string, method = "GET") =>
  front.handler(new Request(`http://127.0.0.1${path}`, { method }));

/** The server's stderr for `env` and `args` (it must refuse them): exit code and lines. */
async function refusedAtStart(env: Record<string, string>, args: string[] = ["--no-gpu"]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--config", CONFIG, "--allow-net", "--allow-read", "--allow-env", MAIN, ...args],
    env: { XDG_RUNTIME_DIR: "/tmp", ...env },
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(20_000),
  }).output();
  const text = new TextDecoder().decode(out.stderr) + new TextDecoder().decode(out.stdout);
  return { code: out.code, lines: text.split("\n").filter((l) => l !== "") };
}

// ---------------------------------------------------------------------------------------------
// Start-up: one line, whatever the value holds.

Deno.test("review env: a value with a newline is still refused in exactly one line", async () => {
  for (
    const [name, value] of [
      ["ATTN_PREFILL_MMA_SHAPE", "w8r1k16\nx"],
      ["ATTN_FLASH_TILE", "8x8x4x4\n"],
    ]
  ) {
    const r = await refusedAtStart({ [name]: value });
    assert.equal(r.code, 2, `${name}: exit code`);
    assert.equal(r.lines.length, 1, `${name}: ${JSON.stringify(r.lines)}`);
    assert.match(r.lines[0], new RegExp(`^${name}`));
  }
});

Deno.test("review env: --help answers whatever a serve variable holds", async () => {
  // The GPU layer's variables are checked after --help (serve_env.ts); the serve ones are not.
  for (const name of ["ATTN_HTTP_WORKERS", "ATTN_DEVICE_THREADS", "ATTN_BODY_TIMEOUT_MS"]) {
    const r = await refusedAtStart({ [name]: "x" }, ["--help"]);
    assert.equal(r.code, 0, `${name}=x --help: ${r.lines[0]}`);
    assert.match(r.lines[0], /^attention service/);
  }
});

Deno.test("review env: a lost limit no thread can keep is refused, not served as all 503s", async () => {
  // ATTN_THREAD_LOST_MS=1 with a 1 ms ping is taken at start-up; every idle thread is then
  // lost within milliseconds and the server answers nothing but 503 device_thread_lost.
  const srv = await spawnServer(
    ["--no-gpu", "--device-threads", "2"],
    { ATTN_THREAD_PING_MS: "1", ATTN_THREAD_LOST_MS: "1" },
  ).catch((e: Error) => e);
  if (srv instanceof Error) {
    assert.match(srv.message, /exited with 2[\s\S]*ATTN_THREAD_LOST_MS/);
    return;
  }
  try {
    await new Promise((r) => setTimeout(r, 1500)); // idle
    const res = await fetch(`${srv.url}/healthz`);
    const text = await res.text();
    assert.equal(res.status, 200, `idle threads lost: ${text}\n${srv.stderr()}`);
  } finally {
    srv.kill("SIGTERM");
    await srv.exited;
  }
});

// ---------------------------------------------------------------------------------------------
// A library user (mod.ts, the registered backends, createHandler): a bad value is an
// EnvValueError when the service is built, not a 500 to each client.

/** Runs `code` (an async module body with AttentionService etc. in scope) under `env`. */
async function library(env: Record<string, string>, code: string): Promise<string> {
  const src = `import { AttentionService, builtinBackends, createHandler, NoDeviceProvider } ` +
    `from "${MOD}";\n${code}`;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--config", CONFIG, "--ext=ts", src],
    env: { XDG_RUNTIME_DIR: "/tmp", ...env },
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(60_000),
  }).output();
  return new TextDecoder().decode(out.stdout).trim();
}

const LIB_CALLS = `
let built: string;
let service;
try {
  service = new AttentionService({
    backends: builtinBackends(),
    device: new NoDeviceProvider("library test"),
    memoryBudgetBytes: 1 << 26,
  });
  built = "built";
} catch (e) {
  built = e.name + ": " + e.message;
}
if (built !== "built") {
  console.log(JSON.stringify({ built }));
} else {
  const handler = createHandler(service);
  const call = async (method, path, body) => {
    const r = await handler(new Request("http://127.0.0.1" + path, {
      method,
      headers: { "content-type": "application/json" },
      body: body ? JSON.stringify(body) : undefined,
    }));
    return r.status + " " + (r.status >= 400 ? (await r.json()).code : (await r.text(), ""));
  };
  const spec = { num_blocks: 4, block_size: 4, num_kv_heads: 1, head_size: 8, dtype: "float32" };
  const created = await call("PUT", "/v1/kv-caches/a", spec);
  const n = 2, q = Array.from({ length: n * 16 }, (_, i) => (i % 7) / 7);
  const kv = Array.from({ length: n * 8 }, (_, i) => (i % 5) / 5);
  const forward = await call("POST", "/v1/attention/forward", {
    kv_cache: "a",
    dtype: "float32",
    layer: { num_heads: 2, num_kv_heads: 1, head_size: 8 },
    query: { dtype: "float32", shape: [n, 2, 8], data: q },
    key: { dtype: "float32", shape: [n, 1, 8], data: kv },
    value: { dtype: "float32", shape: [n, 1, 8], data: kv },
    metadata: { query_start_loc: [0, n], seq_lens: [n], block_table: [[0]], slot_mapping: [0, 1] },
  });
  const metrics = await call("GET", "/metrics");
  console.log(JSON.stringify({ built, created, forward, metrics }));
  await service.close();
}
`;

Deno.test("review env: the library answers with every variable good (the baseline)", async () => {
  const got = JSON.parse(await library({}, LIB_CALLS));
  assert.deepEqual(got, { built: "built", created: "201 ", forward: "200 ", metrics: "200 " });
});

for (
  const [name, value] of [
    ["ATTN_DEVICE_FINITE_BYTES", "-1"], // read by every forward's validation, CPU_REFERENCE too
    ["ATTN_HOST_POOL_MAX_FREE_BYTES", "x"], // read by /metrics
  ]
) {
  Deno.test(`review env: a library service with ${name}=${value} is refused when built`, async () => {
    const got = JSON.parse(await library({ [name]: value }, LIB_CALLS));
    // Observed: built, then a 500 internal_error to the forward call or the scrape.
    assert.match(
      got.built,
      new RegExp(`^EnvValueError: ${name} must be`),
      `no refusal when built; answers: ${JSON.stringify(got)}`,
    );
  });
}

// ---------------------------------------------------------------------------------------------
// Device threads: a thread blocked past ATTN_THREAD_LOST_MS, with --device-threads-http.

Deno.test("review watchdog: /healthz is not held while thread 0 is busy and thread 1 is free", async () => {
  const lines: string[] = [];
  // The default lost limit: a busy thread is not lost, but /healthz (and every route but the
  // caches', forward and /metrics) goes to thread 0 and waits on it, up to ATTN_THREAD_LOST_MS.
  const front = await threadsFront(2, { pingMs: 1000, lostMs: 30_000 }, lines);
  try {
    front.fault(0, { hangMs: 3000 });
    await new Promise((r) => setTimeout(r, 100));
    const t0 = performance.now();
    const res = await get(front, "/healthz");
    const ms = performance.now() - t0;
    await res.body?.cancel();
    assert.equal(res.status, 200);
    assert.ok(ms < 1000, `/healthz answered after ${ms.toFixed(0)} ms (thread 0 busy)`);
  } finally {
    await raceTimeout(front.close(), 10_000);
  }
});

Deno.test("review watchdog: /metrics is not held past 2 s by a thread that does not answer", async () => {
  const lines: string[] = [];
  // A busy (not lost) thread held every scrape up to ATTN_THREAD_LOST_MS (30 s by default: past
  // a scraper's timeout), though the others answered at once.
  const front = await threadsFront(2, { pingMs: 1000, lostMs: 30_000 }, lines);
  try {
    front.fault(1, { hangMs: 5000 });
    await new Promise((r) => setTimeout(r, 100));
    const t0 = performance.now();
    const res = await get(front, "/metrics");
    const ms = performance.now() - t0;
    const text = await res.text();
    assert.equal(res.status, 200);
    assert.ok(ms < 3500, `/metrics answered after ${ms.toFixed(0)} ms (thread 1 busy)`);
    assert.match(text, /^attn_device_thread_up\{device_thread="0"\} 1$/m);
    assert.match(text, /^attn_device_thread_up\{device_thread="1"\} 0$/m);
    assert.match(text, /^attn_kv_caches\{device_thread="0"\} \d+$/m, "thread 0's series");
    assert.doesNotMatch(text, /^attn_kv_caches\{device_thread="1"\}/m, "none of thread 1's");
    assert.equal((text.match(/^# TYPE attn_device_thread_up gauge$/gm) ?? []).length, 1);
  } finally {
    await raceTimeout(front.close(), 10_000);
  }
});

Deno.test("review watchdog: /metrics with every thread lost keeps the exposition content type", async () => {
  const lines: string[] = [];
  const front = await threadsFront(1, { pingMs: 100, lostMs: 1000 }, lines);
  try {
    const call = (m: string, p: string, b?: unknown) =>
      front.handler(
        new Request(`http://127.0.0.1${p}`, {
          method: m,
          headers: b ? { "content-type": "application/json" } : {},
          body: b ? JSON.stringify(b) : undefined,
        }),
      );
    assert.equal((await call("PUT", "/v1/kv-caches/a", HeldSeq.cacheSpec())).status, 201);
    const before = await get(front, "/metrics");
    const type = before.headers.get("content-type");
    await before.body?.cancel();
    front.fault(0, "exit");
    // Lost within 100 + 1000 ms where the watchdog's ticks come on time (a late one judges none).
    await logged(lines, /stopped/, 10_000);
    // Said once: a second verdict would come within another ping and lost limit.
    await new Promise((r) => setTimeout(r, 1200));
    assert.equal(lines.filter((l) => /stopped/.test(l)).length, 1, lines.join());
    await (await call("GET", "/v1/kv-caches/a")).body?.cancel(); // a front 503
    const after = await raceTimeout(get(front, "/metrics"), 3000);
    assert.notEqual(after, "timeout", "/metrics hung");
    const res = after as Response;
    const text = await res.text();
    assert.equal(res.status, 200);
    assert.match(text, /device_thread="front"/);
    assert.equal(res.headers.get("content-type"), type, "the content type a scraper expects");
  } finally {
    await raceTimeout(front.close(), 10_000);
  }
});
