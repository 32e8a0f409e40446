/** server/main.ts: flag parsing, --help, a real start with --no-gpu on a free port, --instance-name. */
import assert from "node:assert/strict";
import { DEFAULT_DAWN_FLAGS } from "../../gpu/runtime_options.ts";
import { parseServeArgs } from "../../server/serve_options.ts";
import { EnvValueError } from "../../core/env.ts";
import { KEEP_WARM_DEFAULTS } from "../../gpu/keep_warm.ts";
import { spawnServer } from "./process.ts";

const DENO_RUNTIME = { choice: "deno", dawnFlags: [...DEFAULT_DAWN_FLAGS] };

const MAIN = new URL("../../server/main.ts", import.meta.url).pathname;

Deno.test("main: flags and defaults", () => {
  const defaults = {
    port: 8000,
    host: "127.0.0.1",
    maxBodyBytes: 512 * 1024 * 1024,
    maxJsonBodyBytes: 64 * 1024 * 1024,
    memoryBudgetBytes: 4 * 1024 ** 3,
    limits: {
      max_tokens: 262_144,
      max_attended_keys: 2 ** 32,
      max_attention_flops: Number.MAX_SAFE_INTEGER,
    },
    allowUnauthenticated: false,
    allowedHosts: [],
    shutdownDeadlineMs: 30_000,
    bodyTimeoutMs: 60_000,
    gpu: true,
    httpEngine: "deno",
    httpWorkers: 0,
    deviceThreads: 0,
    deviceThreadsHttp: false,
    keepWarm: { ...KEEP_WARM_DEFAULTS },
    runtime: DENO_RUNTIME,
    help: false,
  };
  assert.deepEqual(parseServeArgs([]), defaults);
  const o = parseServeArgs([
    "--port",
    "0",
    "--host",
    "0.0.0.0",
    "--max-body-bytes",
    "1000",
    "--memory-budget-bytes=5",
    "--no-gpu",
  ]);
  assert.deepEqual(o, {
    ...defaults,
    port: 0,
    host: "0.0.0.0",
    maxBodyBytes: 1000,
    memoryBudgetBytes: 5,
    gpu: false,
  });
  assert.deepEqual(
    parseServeArgs([
      "--max-json-body-bytes=2048",
      "--token-file",
      "/tmp/t",
      "--allow-unauthenticated",
      "--allowed-host",
      "a.example",
      "--allowed-host=b.example",
      "--shutdown-deadline-ms",
      "250",
    ]),
    {
      ...defaults,
      maxJsonBodyBytes: 2048,
      tokenFile: "/tmp/t",
      allowUnauthenticated: true,
      allowedHosts: ["a.example", "b.example"],
      shutdownDeadlineMs: 250,
    },
  );
  assert.throws(() => parseServeArgs(["--max-json-body-bytes", "0"]), />= 1/);
  // Both limits given, JSON's above the general one that caps it too: refused, both named.
  assert.throws(
    () => parseServeArgs(["--max-json-body-bytes", "200000", "--max-body-bytes", "40000"]),
    /--max-json-body-bytes 200000 is above --max-body-bytes 40000/,
  );
  assert.equal(
    parseServeArgs(["--max-body-bytes", "1000"]).maxBodyBytes,
    1000,
    "one alone is fine",
  );
  assert.equal(
    parseServeArgs(["--max-json-body-bytes", "1000", "--max-body-bytes", "1000"]).maxJsonBodyBytes,
    1000,
  );
  // --device-threads-http: the flag or ATTN_DEVICE_THREADS_HTTP (0 or 1), with device threads.
  assert.equal(
    parseServeArgs(["--device-threads=2", "--device-threads-http"]).deviceThreadsHttp,
    true,
  );
  const env = (v: string) => ({ ATTN_DEVICE_THREADS: "2", ATTN_DEVICE_THREADS_HTTP: v });
  assert.equal(parseServeArgs([], env("1")).deviceThreadsHttp, true);
  assert.equal(parseServeArgs([], env("0")).deviceThreadsHttp, false);
  assert.throws(
    () => parseServeArgs([], env("yes")),
    /ATTN_DEVICE_THREADS_HTTP must be 0 or 1, got "yes"/,
  );
  assert.throws(() => parseServeArgs(["--device-threads-http"]), /needs --device-threads N/);
  assert.deepEqual(
    parseServeArgs([
      "--max-tokens-per-call",
      "64",
      "--max-attended-keys=1000",
      "--max-attention-flops=2048000",
    ]).limits,
    { max_tokens: 64, max_attended_keys: 1000, max_attention_flops: 2_048_000 },
  );
  assert.throws(
    () => parseServeArgs(["--max-json-body-bytes", String(2 ** 30)]),
    /--max-json-body-bytes must be <= 268435456/,
  );
  assert.throws(
    () => parseServeArgs(["--shutdown-deadline-ms=-1"]),
    /--shutdown-deadline-ms must be an integer from 0 to 2147483647, got "-1"/,
  );
  assert.equal(parseServeArgs(["--body-timeout-ms", "250"]).bodyTimeoutMs, 250);
  assert.equal(parseServeArgs([], { ATTN_BODY_TIMEOUT_MS: "900" }).bodyTimeoutMs, 900);
  assert.equal(
    parseServeArgs(["--body-timeout-ms=5"], { ATTN_BODY_TIMEOUT_MS: "900" }).bodyTimeoutMs,
    5,
  );
  assert.throws(() => parseServeArgs(["--body-timeout-ms", "0"]), /from 1 to 2147483647, got "0"/);
  // setTimeout fires a longer timer at once: past 2^31 - 1 ms every body would time out.
  assert.throws(
    () => parseServeArgs(["--body-timeout-ms", "4000000000"]),
    /--body-timeout-ms must be an integer from 1 to 2147483647, got "4000000000"/,
  );
  assert.equal(parseServeArgs(["--body-timeout-ms", "2147483647"]).bodyTimeoutMs, 2 ** 31 - 1);
  assert.throws(
    () => parseServeArgs([], { ATTN_BODY_TIMEOUT_MS: "soon" }),
    /ATTN_BODY_TIMEOUT_MS must be an integer from 1 to 2147483647, got "soon"/,
  );
  assert.deepEqual(
    parseServeArgs(["--webgpu-runtime", "auto", "--dawn-flag", "backend=vulkan"], {
      ATTN_WEBGPU_RUNTIME: "dawn",
      ATTN_DAWN_FLAGS: "adapter=H200",
    }).runtime,
    { choice: "auto", dawnFlags: ["adapter=H200", "backend=vulkan"] },
  );
  assert.equal(parseServeArgs([], { ATTN_WEBGPU_RUNTIME: "dawn" }).runtime.choice, "dawn");
  assert.equal(parseServeArgs(["-h"]).help, true);
  assert.throws(() => parseServeArgs(["--port", "x"]), /--port must be an integer/);
  assert.throws(() => parseServeArgs(["--port", "70000"]), /<= 65535/);
  assert.throws(() => parseServeArgs(["--max-body-bytes", "0"]), />= 1/);
  assert.throws(() => parseServeArgs(["--bogus"]), /bogus/);
  assert.equal(parseServeArgs(["--http-workers", "4"]).httpWorkers, 4);
  assert.equal(parseServeArgs([], { ATTN_HTTP_WORKERS: "3" }).httpWorkers, 3);
  assert.equal(parseServeArgs(["--http-workers=0"], { ATTN_HTTP_WORKERS: "3" }).httpWorkers, 0);
  assert.throws(() => parseServeArgs(["--http-workers=-1"]), /--http-workers must be .*"-1"/);
  assert.throws(() => parseServeArgs(["--http-workers", "65"]), /from 0 to 64, got "65"/);
  assert.throws(() => parseServeArgs([], { ATTN_HTTP_WORKERS: "two" }), /ATTN_HTTP_WORKERS must/);
  assert.equal(parseServeArgs(["--device-threads", "4"]).deviceThreads, 4);
  assert.equal(parseServeArgs([], { ATTN_DEVICE_THREADS: "2" }).deviceThreads, 2);
  assert.throws(() => parseServeArgs(["--device-threads", "65"]), /--device-threads must be/);
  assert.throws(() => parseServeArgs([], { ATTN_DEVICE_THREADS: "x" }), /ATTN_DEVICE_THREADS must/);
  assert.deepEqual(parseServeArgs([]).keepWarm, KEEP_WARM_DEFAULTS);
  assert.deepEqual(
    parseServeArgs(["--keep-warm-ms=2000", "--keep-warm-spin-iters", "500", "--keep-warm-depth=2"])
      .keepWarm,
    { ...KEEP_WARM_DEFAULTS, hold_ms: 2000, spin_iters: 500, depth: 2 },
  );
  assert.deepEqual(
    parseServeArgs(["--keep-warm-ms=50", "--keep-warm-mode", "await", "--keep-warm-period-ms=7"])
      .keepWarm,
    { ...KEEP_WARM_DEFAULTS, hold_ms: 50, mode: "await", period_ms: 7 },
  );
  assert.equal(parseServeArgs([]).keepWarm.mode, "timer");
  assert.throws(
    () => parseServeArgs(["--keep-warm-mode=spin"]),
    { message: '--keep-warm-mode must be one of timer, await, process, got "spin"' },
  );
  assert.throws(
    () => parseServeArgs(["--keep-warm-period-ms=0"]),
    { message: '--keep-warm-period-ms must be an integer >= 1, got "0"' },
  );
  assert.throws(
    () => parseServeArgs(["--keep-warm-period-ms=1001"]),
    { message: "keep-warm period_ms must be an integer in [1, 1000], got 1001" },
  );
  assert.equal(parseServeArgs([], { ATTN_KEEP_WARM_MS: "300" }).keepWarm.hold_ms, 300);
  assert.equal(
    parseServeArgs(["--keep-warm-ms=0"], { ATTN_KEEP_WARM_MS: "300" }).keepWarm.hold_ms,
    0,
  );
  assert.throws(() => parseServeArgs(["--keep-warm-ms=x"]), /--keep-warm-ms must be .*"x"/);
  assert.throws(
    () => parseServeArgs([], { ATTN_KEEP_WARM_MS: "-5" }),
    /ATTN_KEEP_WARM_MS must .*"-5"/,
  );
  assert.throws(() => parseServeArgs(["--keep-warm-depth=9"]), /depth must be .*\[1, 8\], got 9/);
  assert.equal(parseServeArgs(["--instance-name", "gpu-0.a_b"]).instanceName, "gpu-0.a_b");
  assert.equal(parseServeArgs([]).instanceName, undefined);
  for (const bad of ["", "-x", "a b", "x".repeat(65), "é"]) {
    assert.throws(
      () => parseServeArgs([`--instance-name=${bad}`]),
      (e) =>
        e instanceof Error && /--instance-name must be/.test(e.message) &&
        e.message.includes(JSON.stringify(bad)),
      JSON.stringify(bad),
    );
  }
});

Deno.test("main: millisecond flags that set a timer stop at 2^31 - 1 (setTimeout's longest)", () => {
  // A longer timer fires at once (Node's TimeoutOverflowWarning): a 3e9 ms drain deadline
  // ended the drain at once.
  assert.throws(
    () => parseServeArgs(["--shutdown-deadline-ms", "3000000000"]),
    { message: '--shutdown-deadline-ms must be an integer from 0 to 2147483647, got "3000000000"' },
  );
  assert.equal(
    parseServeArgs(["--shutdown-deadline-ms", "2147483647"]).shutdownDeadlineMs,
    2 ** 31 - 1,
  );
  assert.equal(parseServeArgs(["--shutdown-deadline-ms", "0"]).shutdownDeadlineMs, 0);
  assert.throws(
    () => parseServeArgs(["--keep-warm-ms", "3000000000"]),
    { message: '--keep-warm-ms must be an integer from 0 to 3600000, got "3000000000"' },
  );
  assert.throws(
    () => parseServeArgs([], { ATTN_KEEP_WARM_MS: "3600001" }),
    { message: 'ATTN_KEEP_WARM_MS must be an integer from 0 to 3600000, got "3600001"' },
  );
  assert.equal(parseServeArgs(["--keep-warm-ms", "3600000"]).keepWarm.hold_ms, 3_600_000);
});

Deno.test("main: --allowed-host takes a host name or [IPv6] address, no port or spaces", () => {
  assert.deepEqual(
    parseServeArgs(["--allowed-host", "Box.Internal", "--allowed-host", "[fd00::1]"]).allowedHosts,
    ["Box.Internal", "[fd00::1]"],
  );
  for (const bad of ["foo.example:18251", "a b", "", "[::1]:80", "::1", "a/b", "-x.example"]) {
    assert.throws(
      () => parseServeArgs([`--allowed-host=${bad}`]),
      {
        message: `--allowed-host must be a host name or a bracketed IPv6 address, without a ` +
          `port (any port is answered), got ${JSON.stringify(bad)}`,
      },
      JSON.stringify(bad),
    );
  }
});

Deno.test("main: --help lists every flag", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-net", "--allow-read", "--allow-env", MAIN, "--help"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0);
  const text = new TextDecoder().decode(out.stdout);
  for (
    const f of [
      "--port",
      "--host",
      "--max-body-bytes",
      "--max-json-body-bytes",
      "--memory-budget-bytes",
      "--token-file",
      "--allow-unauthenticated",
      "--allowed-host",
      "--shutdown-deadline-ms",
      "--no-gpu",
      "--webgpu-runtime",
      "--dawn-flags",
      "--dawn-flag",
      "--help",
    ]
  ) {
    assert.ok(text.includes(f), f);
  }
});

Deno.test("main: starts with --no-gpu, prints the address, serves", async () => {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-net",
      "--allow-read",
      "--allow-env",
      MAIN,
      "--port",
      "0",
      "--no-gpu",
      "--max-body-bytes",
      "100",
    ],
    stdout: "piped",
    stderr: "null",
  }).spawn();
  try {
    const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    while (!/listening on http:\/\/\S+:\d+\n/.test(text)) {
      const { value, done } = await reader.read();
      if (done) break;
      text += value;
    }
    const m = text.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
    assert.ok(m, `no listening line in ${JSON.stringify(text)}`);
    const health = await fetch(`${m[1]}/healthz`);
    assert.deepEqual(await health.json(), { status: "ok" });
    const dev = await (await fetch(`${m[1]}/v1/device`)).json();
    assert.equal(dev.available, false);
    const big = await fetch(`${m[1]}/v1/backends/select`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ head_size: 64, dtype: "float16", pad: "x".repeat(200) }),
    });
    assert.equal(big.status, 413, "--max-body-bytes applies");
    await big.body?.cancel();
    reader.releaseLock();
  } finally {
    child.kill("SIGTERM");
    await child.status;
    await child.stdout.cancel().catch(() => {});
  }
});

Deno.test("main: --instance-name names the process's answers and its log", async () => {
  const srv = await spawnServer(["--no-gpu", "--instance-name", "p-7"]);
  try {
    const r = await fetch(`${srv.url}/healthz`);
    assert.equal(r.headers.get("x-attention-instance"), "p-7");
    assert.deepEqual(await r.json(), { status: "ok", instance: "p-7" });
    const p = await fetch(`${srv.url}/v1/kv-caches/nope`);
    assert.equal(p.status, 404);
    assert.equal(p.headers.get("x-attention-instance"), "p-7");
    await p.body?.cancel();
    assert.match(srv.stderr(), /^instance: p-7$/m);
  } finally {
    srv.kill("SIGTERM");
    assert.equal((await srv.exited).code, 0);
  }
});

Deno.test("main: a refused variable is an EnvValueError (one line, no usage), a flag's a plain Error", () => {
  const viaEnv: Record<string, string>[] = [
    { ATTN_HTTP_WORKERS: "abc" },
    { ATTN_DEVICE_THREADS: "65" },
    { ATTN_DEVICE_THREADS_HTTP: "maybe" },
    { ATTN_BODY_TIMEOUT_MS: "bad" },
    { ATTN_KEEP_WARM_MS: "-1" },
    { ATTN_WEBGPU_RUNTIME: "cuda" },
    { ATTN_DAWN_FLAGS: "verbose" },
    { ATTN_HTTP_WORKERS: "2", ATTN_DEVICE_THREADS: "2" },
    { ATTN_DEVICE_THREADS_HTTP: "1" },
  ];
  for (const env of viaEnv) {
    assert.throws(() => parseServeArgs([], env), (e: unknown) => {
      assert.ok(e instanceof EnvValueError, `${JSON.stringify(env)}: ${e}`);
      assert.ok(
        Object.keys(env).includes(e.variable),
        `${e.variable} is one of ${Object.keys(env)}`,
      );
      assert.match(e.message, /ATTN_/);
      return true;
    });
  }
  const viaFlags: [string[], Record<string, string>, RegExp][] = [
    [["--http-workers", "abc"], {}, /--http-workers must be/],
    [["--body-timeout-ms", "bad"], {}, /--body-timeout-ms/],
    [["--keep-warm-ms", "x"], {}, /--keep-warm-ms must be/],
    [
      ["--http-workers", "2"],
      { ATTN_DEVICE_THREADS: "2" },
      /--http-workers \(2\) and ATTN_DEVICE_THREADS \(2\)/,
    ],
    [["--device-threads-http"], {}, /--device-threads-http needs --device-threads/],
  ];
  for (const [args, env, re] of viaFlags) {
    assert.throws(() => parseServeArgs(args, env), (e: unknown) => {
      assert.ok(e instanceof Error && !(e instanceof EnvValueError), `${args}: ${e}`);
      assert.match(e.message, re);
      return true;
    });
  }
});

Deno.test("main: --http-engine: deno (the default) or http1, on this thread or the HTTP workers", () => {
  const engine = (args: string[], env: Record<string, string> = {}) =>
    parseServeArgs(args, env).httpEngine;
  assert.equal(engine([]), "deno");
  assert.equal(engine([], { ATTN_HTTP_ENGINE: "" }), "deno", "empty: unset");
  assert.equal(engine(["--http-engine", "http1"]), "http1");
  assert.equal(engine([], { ATTN_HTTP_ENGINE: "http1" }), "http1");
  assert.equal(engine(["--http-engine=deno"], { ATTN_HTTP_ENGINE: "http1" }), "deno");
  assert.equal(engine(["--http-engine", "http1", "--device-threads", "2"]), "http1");
  assert.equal(engine(["--http-engine", "deno", "--http-workers", "2"]), "deno");
  assert.equal(engine(["--http-engine", "http1", "--http-workers", "2"]), "http1");
  assert.throws(
    () =>
      parseServeArgs(["--http-engine", "http1", "--device-threads", "2", "--device-threads-http"]),
    /not with --device-threads-http/,
  );
  assert.throws(
    () => parseServeArgs(["--http-engine", "hyper"]),
    /--http-engine must be one of deno, http1, got "hyper"/,
  );
  assert.throws(() => parseServeArgs([], { ATTN_HTTP_ENGINE: "h2" }), (e: unknown) => {
    assert.ok(e instanceof EnvValueError && e.variable === "ATTN_HTTP_ENGINE", String(e));
    return true;
  });
});
