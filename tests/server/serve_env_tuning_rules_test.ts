/**
 * The start-up check refuses an `ATTN_DECODE_TUNING` number that breaks its rule
 * (backends/webgpu_decode_tuning.ts DECODE_TUNING_RULES) and an `ATTN_FLASH_TILE` no device can
 * run, as the readers do: before, `{"keys_per_iter":3}` started a server whose decode answers
 * were wrong, `{"max_lanes":0}` one whose calls failed with 500 `internal_error`, and
 * `{"workgroup_size":4096}` one whose calls failed with 500 `shader_compile_failed` (lavapipe).
 * The process exits 2 with one line naming the variable, its value, the field and the rule.
 */
import assert from "node:assert/strict";
import { checkServeEnv, StartupEnvError } from "../../server/serve_env.ts";
import { runServerToExit } from "./process.ts";

const TUNING = "ATTN_DECODE_TUNING must be a JSON object of DecodeTuning fields " +
  "(backends/webgpu_decode_tuning.ts), got ";

const CASES: [string, string, string][] = [
  [
    "ATTN_DECODE_TUNING",
    '{"keys_per_iter":3}',
    `${TUNING}"{\\"keys_per_iter\\":3}": keys_per_iter = 3 breaks its rule: a power of two ` +
    "from 1 to 16, or 0 for automatic",
  ],
  [
    "ATTN_DECODE_TUNING",
    '{"max_lanes":0}',
    `${TUNING}"{\\"max_lanes\\":0}": max_lanes = 0 breaks its rule: a power of two from 1 to 128`,
  ],
  [
    "ATTN_DECODE_TUNING",
    '{"workgroup_size":4096}',
    `${TUNING}"{\\"workgroup_size\\":4096}": workgroup_size = 4096 breaks its rule: an integer ` +
    "from 1 to 1024, or 0 for automatic",
  ],
  [
    "ATTN_DECODE_TUNING",
    '{"stage_kv_bytes":1e12}',
    `${TUNING}"{\\"stage_kv_bytes\\":1e12}": stage_kv_bytes = 1000000000000 breaks its rule: ` +
    "an integer from 0 to 2^31 - 1",
  ],
  [
    "ATTN_FLASH_TILE",
    "64x32x1x1",
    'ATTN_FLASH_TILE must be a tile TXxTYxRMxRN (e.g. 8x8x4x4), got "64x32x1x1": flash tile ' +
    '"64x32x1x1": TX must be 4, 8, 16 or 32',
  ],
  [
    "ATTN_FLASH_TILE",
    "32x64x1x1",
    'ATTN_FLASH_TILE must be a tile TXxTYxRMxRN (e.g. 8x8x4x4), got "32x64x1x1": flash tile ' +
    '"32x64x1x1": TX x TY = 2048 invocations, over the 1024 any WebGPU device grants a workgroup',
  ],
];

Deno.test("serve env: a decode tuning number out of its rule is refused at start-up", async () => {
  for (const [name, value, message] of CASES) {
    await assert.rejects(
      () => checkServeEnv({ [name]: value }),
      (e) => e instanceof StartupEnvError && e.message === message,
      `${name}=${value}`,
    );
  }
  // Values at the rules' edges start.
  await checkServeEnv({ ATTN_DECODE_TUNING: '{"keys_per_iter":16,"workgroup_size":1024}' });
  await checkServeEnv({ ATTN_FLASH_TILE: "32x32x1x1" });
});

Deno.test("main: a decode tuning number out of its rule is one line, exit 2", async () => {
  for (const [name, value, message] of CASES.slice(0, 2)) {
    const r = await runServerToExit(["--no-gpu", "--port", "0"], { [name]: value }, 15_000);
    assert.equal(r.code, 2, `${name}=${value}: ${r.stderr}`);
    assert.deepEqual(r.stderr.split("\n").filter((l) => l !== ""), [message]);
  }
});
