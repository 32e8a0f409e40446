/**
 * server/serve_env.ts's start-up check and the modules that read each variable apply one rule:
 * over values that tell rules apart (empty, whitespace, leading zeros, exponents, hex, signs,
 * decimals, huge numbers, enum case, JSON that is no object, prototype names), the check
 * refuses exactly what the reader refuses, with the reader's own message. Before, each rule was
 * written twice and the readers took what the check refused (`ATTN_KERNEL_CACHE_LIMIT=" 5"` ran
 * with 5, `=1e3` with 1000, `=abc` with 256; `ATTN_PREFILL_MMA=off` left the kernel on;
 * `ATTN_COMPILE_TIMEOUT_MS=3000000000` made a timer that fires at once). The readers read once
 * per process (GPU timing, the finiteness threshold, the host pool's cap) run in a child
 * process each.
 */
import assert from "node:assert/strict";
import { EnvValueError } from "../../core/env.ts";
import { withEnvSync } from "../support/env.ts";
import { checkServeEnv, StartupEnvError } from "../../server/serve_env.ts";
import { kernelCacheLimit } from "../../gpu/kernel.ts";
import { compileTimeoutMs } from "../../gpu/pipelines.ts";
import { tickPaceFromEnv } from "../../gpu/dawn_tick_pace.ts";
import { GPU_POOL_CAP_ENV, poolOf } from "../../gpu/buffer_pool.ts";
import { resolveFlashOptions } from "../../backends/webgpu_flash.ts";
import { DEFAULT_DECODE_TUNING, envDecodeTuning } from "../../backends/webgpu_decode_tuning.ts";
import { envMmaShape } from "../../backends/flash_mma_plan.ts";
import { envFlashTile } from "../../backends/flash_plan.ts";
import { stagedUploads } from "../../gpu/upload_staging.ts";
import type { GpuContext } from "../../core/types.ts";

const VALUES = [
  ...["", " ", "0", "1", "00", "007", "5", " 5", "5 ", "1e3", "0x10", "5.0", ".5", "5.", "+5"],
  ...["-1", "abc", "off", "OFF", "total", "Total", "99999999999999999999", "3000000000"],
  ...["Infinity", "null", "true", "[]", '"x"', "{}", '{"workgroup_size":256}', "constructor"],
  ...["toString", "__proto__", "w8r1k16", "8x8x4x4", " 8x8x4x4", "8x8x4e0x4", "8x8x+4x4"],
  "8x8x4x4.0",
];

/** A hardware adapter's context, as far as the staging choice reads it. */
const SOME_GPU = {
  device: {},
  adapter_info: { vendor: "nvidia", architecture: "hopper", device: "", description: "H100" },
} as unknown as GpuContext;

/** Each variable read at each use, and its reader. */
const READERS: Record<string, () => unknown> = {
  ATTN_KERNEL_CACHE_LIMIT: kernelCacheLimit,
  ATTN_COMPILE_TIMEOUT_MS: compileTimeoutMs,
  ATTN_DAWN_TICK_SPIN_MS: tickPaceFromEnv,
  ATTN_DAWN_TICK_GAP_MS: tickPaceFromEnv,
  // A new device's pool reads its cap.
  [GPU_POOL_CAP_ENV]: () => poolOf({ device: {} } as unknown as GpuContext).maxFreeBytes,
  ATTN_PREFILL_MMA: () => resolveFlashOptions({ tile: null, decode: DEFAULT_DECODE_TUNING }),
  ATTN_PREFILL_SPLIT: () => resolveFlashOptions({ tile: null, decode: DEFAULT_DECODE_TUNING }),
  ATTN_DECODE_TUNING: envDecodeTuning,
  ATTN_PREFILL_MMA_SHAPE: envMmaShape,
  ATTN_FLASH_TILE: envFlashTile,
  // A large upload asks whether to stage.
  ATTN_UPLOAD_STAGING: () => stagedUploads(SOME_GPU),
};

/** What the start-up check says of `value`: null (taken) or its message. */
async function startup(name: string, value: string): Promise<string | null> {
  try {
    await checkServeEnv({ [name]: value });
    return null;
  } catch (e) {
    assert.ok(e instanceof StartupEnvError, `${name}=${value}: ${e}`);
    return e.message;
  }
}

/**
 * What `read` says with `name` set to `value`: null (taken), its EnvValueError's message, or
 * what else it did (another error; a function for a shape).
 */
function reader(name: string, value: string, read: () => unknown): string | null {
  return withEnvSync({ [name]: value }, () => {
    try {
      const v = read();
      return typeof v === "function" ? `took it as a function` : null;
    } catch (e) {
      const mine = e instanceof EnvValueError && e.variable === name && e.value === value;
      return mine ? e.message : `not an EnvValueError of it: ${e}`;
    }
  });
}

Deno.test("serve env: the check refuses what each reader refuses, in the reader's words", async () => {
  const differ: string[] = [];
  for (const [name, read] of Object.entries(READERS)) {
    for (const value of VALUES) {
      const [check, own] = [await startup(name, value), reader(name, value, read)];
      if (check !== own) differ.push(`${name}=${JSON.stringify(value)}: ${check} / ${own}`);
    }
  }
  assert.deepEqual(differ, [], `start-up check / reader:\n${differ.join("\n")}`);
});

/** `expr`'s JSON in a child process whose `name` is `value`, or its error's first line. */
async function childSays(name: string, value: string, mod: string, expr: string) {
  const url = new URL(`../../${mod}`, import.meta.url).href;
  const code = `import * as m from ${JSON.stringify(url)};
    try { console.log(JSON.stringify(${expr})); }
    catch (e) { console.log(e.name + ": " + e.message); }`;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--quiet", code],
    env: { [name]: value },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim();
  assert.ok(text !== "", new TextDecoder().decode(out.stderr));
  return text;
}

Deno.test("serve env: the readers read once per process apply the same rule", async () => {
  const cases: [string, string, string, string[]][] = [
    // Was "sampled" for each of these.
    ["ATTN_GPU_TIMING", "gpu/gpu_plan.ts", "m.gpuTiming()", ["Total", " total", "bogus", "total"]],
    // Was 0 bytes for "" and " " (every batch left to the device), 1000 for "1e3".
    [
      "ATTN_DEVICE_FINITE_BYTES",
      "core/data.ts",
      "m.deviceFiniteCheckBytes()",
      ["", " ", "1e3", "-5", "007"],
    ],
    // Was 1 GiB, with a warning.
    ["ATTN_HOST_POOL_MAX_FREE_BYTES", "gpu/host_pool.ts", "m.hostPool.maxFreeBytes", ["1e3", "-1"]],
  ];
  const differ: string[] = [];
  for (const [name, mod, expr, values] of cases) {
    for (const value of values) {
      const said = await childSays(name, value, mod, expr);
      const refused = await startup(name, value);
      const same = refused === null ? !/Error/.test(said) : said === `EnvValueError: ${refused}`;
      if (!same) differ.push(`${name}=${JSON.stringify(value)}: ${refused} / ${said}`);
    }
  }
  assert.deepEqual(differ, [], `start-up check / reader:\n${differ.join("\n")}`);
});

Deno.test("serve env: a taken value reads as the check took it", async () => {
  const finite = (v: string) =>
    childSays("ATTN_DEVICE_FINITE_BYTES", v, "core/data.ts", "m.deviceFiniteCheckBytes()");
  assert.equal(await finite(""), "65536", "empty is unset (was 0)");
  assert.equal(await finite("007"), "7");
  assert.equal(
    await childSays("ATTN_GPU_TIMING", "total", "gpu/gpu_plan.ts", "m.gpuTiming()"),
    '"total"',
  );
  const opts = { tile: null, decode: DEFAULT_DECODE_TUNING };
  assert.equal(
    reader("ATTN_PREFILL_MMA", "0", () => assert.equal(resolveFlashOptions(opts).mma, false)),
    null,
  );
  assert.equal(
    reader("ATTN_PREFILL_MMA", "", () => assert.equal(resolveFlashOptions(opts).mma, true)),
    null,
  );
});
