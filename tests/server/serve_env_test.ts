/**
 * server/serve_env.ts: the GPU layer's variables are checked at start-up with the rules of the
 * modules that read them, and a bad value is refused in one line naming the variable and the
 * value, where those modules fell back to their defaults unsaid (or warned at the first GPU
 * call). Empty is unset where the module reads it so.
 */
import assert from "node:assert/strict";
import { checkServeEnv, StartupEnvError } from "../../server/serve_env.ts";
import { serveEnv } from "../../server/serve_options.ts";

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
    ATTN_DEVICE_FINITE_BYTES: ["0", "65536"],
    ATTN_DAWN_TICK_SPIN_MS: ["0", "2", "0.5", "off", ""],
    ATTN_GPU_POOL_MAX_FREE_BYTES: ["0", "1073741824", ""],
    ATTN_HOST_POOL_MAX_FREE_BYTES: ["0", "1073741824", ""],
    ATTN_THREAD_EXIT_GRACE_MS: ["0", "300", "10000"],
    ATTN_PREFILL_MMA: ["0", "1", ""],
    ATTN_PREFILL_SPLIT: ["0", "1", ""],
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
  for (const v of ["-5", "", "1e3"]) {
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
      "ATTN_GPU_POOL_MAX_FREE_BYTES",
      "ATTN_DECODE_TUNING",
      "ATTN_PREFILL_MMA_SHAPE",
      "ATTN_FLASH_TILE",
    ]
  ) {
    assert.ok(names.includes(n), n);
  }
});
