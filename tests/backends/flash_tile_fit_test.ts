/**
 * A named prefill tile (`ATTN_FLASH_TILE`, WEBGPU_FLASH's `tile` option) that parses but cannot
 * run a head size on the device: it was replaced by the automatic tile without a word; now the
 * config says why and which tile runs (`FlashConfig.replaced`) and one warning line says it on
 * stderr, once per head size and device limits. A tile no device can run (more than 1024
 * invocations a workgroup) is refused where the variable is read, at start-up.
 */
import assert from "node:assert/strict";
import {
  FLASH_TILE_SETTING,
  flashConfig,
  flashTileName,
  parseFlashTile,
} from "../../backends/flash_plan.ts";
import { makeWebGpuFlash } from "../../backends/webgpu_flash.ts";
import { DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import { EnvValueError } from "../../core/env.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { smallSpec } from "../support/batches.ts";
import { checkBackend } from "../support/backend_check.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

/** What `f` writes with console.error, and its result. */
async function stderrOf<T>(f: () => T | Promise<T>): Promise<[T, string[]]> {
  const lines: string[] = [];
  const was = console.error;
  console.error = (...a: unknown[]) => lines.push(a.map(String).join(" "));
  try {
    return [await f(), lines];
  } finally {
    console.error = was;
  }
}

const L32 = { maxComputeWorkgroupStorageSize: 32768, maxComputeInvocationsPerWorkgroup: 256 };

Deno.test("flash tile: a named tile that does not fit says why and what runs, once", async () => {
  const why = "flash tile 8x8x4x4 (ATTN_FLASH_TILE) does not fit head size 128 on this device " +
    "(39424 B of workgroup memory > 32768): tile 4x8x4x4 runs instead";
  const [cfg, lines] = await stderrOf(() => [
    flashConfig(128, L32, [8, 8, 4, 4]),
    flashConfig(128, L32, [8, 8, 4, 4]),
  ]);
  for (const c of cfg) {
    assert.equal(c?.tx, 4, "the automatic tile runs");
    assert.equal(c?.replaced, why);
  }
  assert.deepEqual(lines, [`warning: ${why}`], "one line for both plans");
  // Another head size the tile does not fit is another line.
  const [c80, more] = await stderrOf(() => flashConfig(80, L32, [8, 8, 4, 4, false]));
  assert.match(c80?.replaced ?? "", /^flash tile 8x8x4x4l \(ATTN_FLASH_TILE\) .* head size 80 /);
  assert.match(more.join("\n"), /^warning: .*TX 8 does not divide the 20 vec4 columns/);
});

Deno.test("flash tile: a tile that fits, or none named, replaces nothing and says nothing", async () => {
  const [cfgs, lines] = await stderrOf(() => [
    flashConfig(128, L32, [8, 4, 4, 4]),
    flashConfig(128, L32, null),
    flashConfig(128, L32),
  ]);
  assert.deepEqual(cfgs.map((c) => c?.replaced), [undefined, undefined, undefined]);
  assert.equal(cfgs[0]?.wg, 32);
  assert.deepEqual(lines, []);
});

Deno.test("flash tile: none fits at all: null, and the line says so", async () => {
  const [c, lines] = await stderrOf(() => flashConfig(24, L32, [4, 4, 1, 1]));
  assert.equal(c, null);
  assert.equal(
    lines[0],
    "warning: flash tile 4x4x1x1 (ATTN_FLASH_TILE) does not fit head size 24 on this device " +
      "(head size 24 is not a multiple of 16): no tile fits",
  );
});

Deno.test("flash tile: names as written", () => {
  for (const t of ["8x8x4x4", "4x16x2x4u", "32x2x1x1l"]) {
    assert.equal(flashTileName(parseFlashTile(t)), t);
  }
});

Deno.test("flash tile: more than 1024 invocations is refused where it is read", () => {
  assert.deepEqual(parseFlashTile("32x32x1x1"), [32, 32, 1, 1]);
  assert.throws(
    () => parseFlashTile("32x64x1x1"),
    /^Error: flash tile "32x64x1x1": TX x TY = 2048 invocations, over the 1024 any WebGPU device/,
  );
  assert.throws(
    () => FLASH_TILE_SETTING.parse("16x128x4x4u"),
    (e) =>
      e instanceof EnvValueError && e.variable === "ATTN_FLASH_TILE" &&
      e.message ===
        'ATTN_FLASH_TILE must be a tile TXxTYxRMxRN (e.g. 8x8x4x4), got "16x128x4x4u": ' +
          'flash tile "16x128x4x4u": TX x TY = 2048 invocations, over the 1024 any WebGPU ' +
          "device grants a workgroup",
  );
});

Deno.test(
  "flash tile: a named tile unfit for the batch's head size runs the automatic one, right, " +
    "with the line",
  { ignore: NO_GPU },
  async () => {
    // TX 32 divides no head-64 row (16 vec4 columns) on any device.
    const b = makeWebGpuFlash({
      tile: [32, 4, 1, 1],
      decode: { ...DEFAULT_DECODE_TUNING },
      mma: false,
      prefill_split: false,
    }) as AttentionBackend;
    const spec = smallSpec({
      dtype: "float32",
      head_size: 64,
      requests: [{ query_len: 9, seq_len: 30 }, { query_len: 1, seq_len: 12 }],
    });
    const [, lines] = await stderrOf(() => checkBackend(b, GPU!, spec));
    const mine = lines.filter((l) => l.startsWith("warning: flash tile"));
    assert.equal(mine.length, 1, lines.join("\n"));
    assert.match(
      mine[0],
      /^warning: flash tile 32x4x1x1 \(ATTN_FLASH_TILE\) does not fit head size 64 on this device \(TX 32 does not divide the 16 vec4 columns of head size 64\): tile \d+x\d+x\d+x\d+ runs instead$/,
    );
  },
);
