/**
 * server/serve_env.ts: the GPU layer's variables are checked at start-up with the rules of the
 * modules that read them, and a bad value is refused in one line naming the variable and the
 * value. Empty is unset for every one (core/env.ts). That the check is the readers' own rule:
 * serve_env_readers_test.ts.
 */
import assert from "node:assert/strict";
import {
  CHECKED_ENV,
  checkedSettings,
  checkServeEnv,
  StartupEnvError,
} from "../../server/serve_env.ts";
import { serveEnv } from "../../server/serve_options.ts";
import { MMA_VARIANTS } from "../../gpu/flash_mma_shape.ts";

const refused = async (env: Record<string, string>, message: string) => {
  await assert.rejects(
    () => checkServeEnv(env),
    (e) => e instanceof StartupEnvError && e.message === message,
    JSON.stringify(env),
  );
};

Deno.test("serve env: the GPU layer's variables, refused in one line", async () => {
  await checkServeEnv({});
  const good: Record<string, string[]> = {
    ATTN_KERNEL_CACHE_LIMIT: ["1", "256", ""],
    ATTN_COMPILE_TIMEOUT_MS: ["1", "600000", "2147483647", ""],
    ATTN_GPU_TIMING: ["sampled", "total", "calls", "off", ""],
    ATTN_DEVICE_FINITE_BYTES: ["0", "65536", ""],
    ATTN_DAWN_TICK_SPIN_MS: ["0", "2", "0.5", "off", ""],
    ATTN_DAWN_TICK_GAP_MS: ["0", "0.01", "1", "off", ""],
    ATTN_GPU_POOL_MAX_FREE_BYTES: ["0", "1073741824", ""],
    ATTN_HOST_POOL_MAX_FREE_BYTES: ["0", "1073741824", ""],
    ATTN_THREAD_EXIT_GRACE_MS: ["0", "300", "10000", ""],
    ATTN_PREFILL_MMA: ["0", "1", ""],
    ATTN_PREFILL_SPLIT: ["0", "1", ""],
    ATTN_COMPILE_SERIAL: ["0", "1", ""],
    ATTN_COMPILE_LOG: ["0", "1", ""],
    ATTN_UPLOAD_STAGING: ["0", "1", ""],
    ATTN_EARLY_READ: ["0", "1", ""],
    ATTN_DEFER_READ: ["0", "1", ""],
    ATTN_HTTP_IDLE_TIMEOUT_MS: ["1", "120000", ""],
    ATTN_HTTP_HEAD_TIMEOUT_MS: ["1", "30000", ""],
    ATTN_HTTP_MAX_CONNECTIONS: ["1", "4096", ""],
  };
  for (const [name, values] of Object.entries(good)) {
    for (const v of values) await checkServeEnv({ [name]: v });
  }
  await refused(
    { ATTN_KERNEL_CACHE_LIMIT: "abc" },
    'ATTN_KERNEL_CACHE_LIMIT must be an integer >= 1, got "abc"',
  );
  await refused(
    { ATTN_KERNEL_CACHE_LIMIT: "0" },
    'ATTN_KERNEL_CACHE_LIMIT must be an integer >= 1, got "0"',
  );
  for (const v of ["abc", "0", "3000000000", "1.5"]) {
    await refused(
      { ATTN_COMPILE_TIMEOUT_MS: v },
      `ATTN_COMPILE_TIMEOUT_MS must be an integer from 1 to 2147483647 (ms), got "${v}"`,
    );
  }
  await refused(
    { ATTN_GPU_TIMING: "bogus" },
    'ATTN_GPU_TIMING must be one of sampled, total, calls, off, got "bogus"',
  );
  for (const v of ["-5", " ", "1e3"]) {
    await refused(
      { ATTN_DEVICE_FINITE_BYTES: v },
      `ATTN_DEVICE_FINITE_BYTES must be an integer >= 0 (bytes), got "${v}"`,
    );
  }
  await refused(
    { ATTN_DAWN_TICK_SPIN_MS: "abc" },
    'ATTN_DAWN_TICK_SPIN_MS must be a number of ms >= 0, or off, got "abc"',
  );
  await refused(
    { ATTN_DAWN_TICK_GAP_MS: "1e-2" },
    'ATTN_DAWN_TICK_GAP_MS must be a number of ms >= 0, or off, got "1e-2"',
  );
  await refused(
    { ATTN_GPU_POOL_MAX_FREE_BYTES: "1GiB" },
    'ATTN_GPU_POOL_MAX_FREE_BYTES must be an integer >= 0 (bytes), got "1GiB"',
  );
  await refused(
    { ATTN_HOST_POOL_MAX_FREE_BYTES: "-1" },
    'ATTN_HOST_POOL_MAX_FREE_BYTES must be an integer >= 0 (bytes), got "-1"',
  );
  await refused(
    { ATTN_THREAD_EXIT_GRACE_MS: "20000" },
    'ATTN_THREAD_EXIT_GRACE_MS must be an integer from 0 to 10000 (ms), got "20000"',
  );
  await refused(
    { ATTN_PREFILL_MMA: "off" },
    'ATTN_PREFILL_MMA must be 0 (off) or 1 (on), got "off"',
  );
  // Read as `=== "1"` and as set-or-not until v0.24: `yes` was ignored, `0` turned logging on.
  await refused(
    { ATTN_COMPILE_SERIAL: "yes" },
    'ATTN_COMPILE_SERIAL must be 0 (off) or 1 (on), got "yes"',
  );
  await refused(
    { ATTN_COMPILE_LOG: "true" },
    'ATTN_COMPILE_LOG must be 0 (off) or 1 (on), got "true"',
  );
  // Read as `=== "1"` / `=== "0"` until v0.26, unchecked at start-up: `yes` ran the default.
  await refused(
    { ATTN_DEFER_READ: "off" },
    'ATTN_DEFER_READ must be 0 (off) or 1 (on), got "off"',
  );
  await refused(
    { ATTN_UPLOAD_STAGING: "yes" },
    'ATTN_UPLOAD_STAGING must be 0 (off) or 1 (on), got "yes"',
  );
  // The HTTP/1.1 server's bounds (--http-engine http1): a bad value was the default, silently.
  for (const v of ["0", "abc", "-5"]) {
    await refused(
      { ATTN_HTTP_HEAD_TIMEOUT_MS: v },
      `ATTN_HTTP_HEAD_TIMEOUT_MS must be an integer from 1 to 2147483647 (ms), got "${v}"`,
    );
  }
  await refused(
    { ATTN_HTTP_IDLE_TIMEOUT_MS: "1.5" },
    'ATTN_HTTP_IDLE_TIMEOUT_MS must be an integer from 1 to 2147483647 (ms), got "1.5"',
  );
  await refused(
    { ATTN_HTTP_MAX_CONNECTIONS: "0" },
    'ATTN_HTTP_MAX_CONNECTIONS must be an integer from 1 to 1000000, got "0"',
  );
});

Deno.test("serve env: serveEnv reads the checked variables", () => {
  const names = Object.keys(serveEnv());
  for (
    const n of [
      "ATTN_KERNEL_CACHE_LIMIT",
      "ATTN_COMPILE_TIMEOUT_MS",
      "ATTN_GPU_TIMING",
      "ATTN_DEVICE_FINITE_BYTES",
      "ATTN_DAWN_TICK_SPIN_MS",
      "ATTN_DAWN_TICK_GAP_MS",
      "ATTN_GPU_POOL_MAX_FREE_BYTES",
      "ATTN_DECODE_TUNING",
      "ATTN_PREFILL_MMA_SHAPE",
      "ATTN_FLASH_TILE",
    ]
  ) {
    assert.ok(names.includes(n), n);
  }
});

Deno.test("serve env: empty is unset for every variable (was refused for two)", async () => {
  // core/data.ts read "" as 0 and device_threads.ts as 0 ms, so start-up refused it; both
  // readers' rules now read it as unset, as every other variable's does.
  for (const name of CHECKED_ENV) await checkServeEnv({ [name]: "" });
});

Deno.test("serve env: CHECKED_ENV names the settings checked, in order", async () => {
  assert.deepEqual((await checkedSettings()).map((s) => s.name), CHECKED_ENV);
});

Deno.test("serve env: the backends' variables are checked in the env given", async () => {
  // Their check read the process's environment (where these are unset in a test run), not
  // `env`: each of these passed.
  const cases: [string, string, RegExp][] = [
    ["ATTN_DECODE_TUNING", '{"bogus_knob":1}', /unknown field or wrong type: bogus_knob/],
    ["ATTN_PREFILL_MMA_SHAPE", "nosuch", /^ATTN_PREFILL_MMA_SHAPE="nosuch" names no shape/],
    ["ATTN_FLASH_TILE", "3x8x4x4", /^ATTN_FLASH_TILE must be a tile .*TX must be/],
  ];
  for (const [name, value, want] of cases) {
    await assert.rejects(
      () => checkServeEnv({ [name]: value }),
      (e) => e instanceof StartupEnvError && want.test(e.message),
      name,
    );
  }
});

Deno.test("serve env: names and tiles the backends took by accident are refused", async () => {
  // An own shape name only: "constructor" named Object's constructor, taken as a shape.
  for (const v of ["constructor", "toString"]) {
    await refused(
      { ATTN_PREFILL_MMA_SHAPE: v },
      `ATTN_PREFILL_MMA_SHAPE=${JSON.stringify(v)} names no shape; known: ${
        Object.keys(MMA_VARIANTS)
      }`,
    );
  }
  // A tile's numbers are digits only: Number() took spaces, exponents, signs and decimals.
  for (const v of [" 8x8x4x4", "8x8x4x4 ", "8x8x4e0x4", "8x8x+4x4", "8x8x4x4.0"]) {
    await refused(
      { ATTN_FLASH_TILE: v },
      `ATTN_FLASH_TILE must be a tile TXxTYxRMxRN (e.g. 8x8x4x4), got ${JSON.stringify(v)}: ` +
        `flash tile "${v}": expected TXxTYxRMxRN, e.g. 8x8x4x4`,
    );
  }
});
