/**
 * Ceiling probe of Dawn's subgroup matrices (`chromium-experimental-subgroup-matrix`): what
 * f16 x f16 -> f32 multiply-accumulate loops reach on this device in several arrangements
 * (bench/mma_ceiling_wgsl.ts names them): accumulators per subgroup (1x1 .. 4x4 fragments),
 * fragments from storage vs staged in workgroup memory (f16 stores or matrix stores; double or
 * triple buffered), k-step unrolling, A held in registers as attention holds Q (`flash`), and no
 * loads at all (`reg`). Device time by timestamp-query (median of `--iters` passes after ~0.5 s
 * of warm-up); every arrangement's output is poisoned first and 48 sampled elements are checked
 * against a float64 product of the same f16 inputs (|diff| <= 1e-3 sum|a b| + 1e-3), so a fast
 * but wrong arrangement says WRONG.
 *
 * The ladder (`ladder-qk`, `-s`, `-pv`, `-sm`, `-pg`: bench/mma_ladder_wgsl.ts) grows the QK^T
 * loop into attention step by step; its outputs are checked the same way against its own float64
 * reference (TFLOP/s count QK^T, + PV from `ladder-pv` on). The v0.7 ladder
 * (`ladder-{sm|pg}-k{BK}-w{NSG}[-r1][-sb|-sl|-2b|-nb]`: bench/mma_ladder2_wgsl.ts) reshapes L4 / L5:
 * longer key tiles, fewer subgroups, the softmax over every lane, other barrier schedules.
 *
 * One arrangement's run, check and timing is bench/mma_ceiling_probe.ts.
 *
 * Usage: deno run -A bench/mma_ceiling.ts [--small] [--iters N] [--only name,name] [--json]
 *   [--flash-rows N] [--flash-keys N]
 * @module
 */
import { parseArgs } from "node:util";
import { acquireMmaDevice } from "../gpu/flash_mma_device.ts";
import {
  type Ceiling,
  ceilingLayout,
  ceilingProblem,
  type CeilingSize,
  parseCeiling,
} from "./mma_ceiling_wgsl.ts";
import { ladderBytes, parseLadder } from "./mma_ladder_wgsl.ts";
import { isLadder2, ladder2Bytes, ladder2Problem, parseLadder2 } from "./mma_ladder2_wgsl.ts";
import { probe } from "./mma_ceiling_probe.ts";

/** The arrangements run without --only (bench/NOTES.md, "v0.6 tensor-core variants"). */
export const CEILING_DEFAULTS = [
  "reg-st-1x1-w4x1",
  "reg-st-2x2-w4x1",
  "reg-st-2x4-w4x1",
  "reg-st-4x4-w4x1",
  "gemm-st-1x1-w2x2",
  "gemm-st-2x2-w2x2",
  "gemm-st-2x4-w2x2",
  "gemm-st-4x4-w2x2",
  "gemm-st-2x4-w2x2-k2",
  "gemm-st-2x2-w2x2-bn",
  "gemm-wg-2x2-w2x2",
  "gemm-wg-2x4-w2x2",
  "gemm-wg-4x4-w2x2",
  "gemm-wg-2x4-w2x2-k2",
  "gemm-wg-2x4-w2x2-b3",
  "gemm-wg-2x4-w2x2-bn",
  "gemm-wx-2x4-w2x2",
  "gemm-wx-4x4-w2x2",
  "gemm-wx-2x4-w2x2-k2",
  "flash-st-1x1-w8x1",
  "flash-st-1x2-w8x1",
  "flash-st-1x4-w8x1",
  "flash-st-2x2-w4x1",
  "flash-st-2x4-w4x1",
  "flash-wg-1x1-w8x1",
  "flash-wg-1x2-w8x1",
  "flash-wg-1x4-w8x1",
  "flash-wg-2x2-w4x1",
  "flash-wg-2x4-w4x1",
  "flash-wg-1x4-w4x2",
  "flash-wg-1x2-w8x1-b3",
  "flash-wx-1x4-w8x1",
  "flash-wx-2x2-w4x1",
];

const args = parseArgs({
  args: Deno.args,
  options: {
    small: { type: "boolean", default: false },
    iters: { type: "string", default: "20" },
    only: { type: "string", default: "" },
    json: { type: "boolean", default: false },
    "flash-rows": { type: "string", default: "" },
    "flash-keys": { type: "string", default: "" },
  },
});

/** Problem sizes per loop: GPUs, and software adapters (`--small`). */
const SIZES: Record<"gpu" | "small", Record<Ceiling["loop"], CeilingSize>> = {
  gpu: {
    gemm: { m: 4096, n: 4096, k: 4096 },
    flash: { m: 32768, n: 4096, k: 128 }, // rows, keys, head: one GQA group's K is 1 MB
    reg: { m: 8192, n: 2048, k: 0 }, // subgroups, iterations
  },
  small: {
    gemm: { m: 64, n: 64, k: 64 },
    flash: { m: 64, n: 128, k: 32 }, // 128 keys: the v0.7 ladder's k64 still loops
    reg: { m: 8, n: 16, k: 0 },
  },
};

// `--flash-rows` / `--flash-keys` resize the flash loops' problem (both size classes): with rows a
// multiple of 128, e.g. 132, 264 and 396 workgroups of 128 rows at equal keys, the time says how
// many workgroups an SM keeps resident (flat while they all fit at once).
for (const [flag, key] of [["flash-rows", "m"], ["flash-keys", "n"]] as const) {
  const v = args.values[flag];
  if (!v) continue;
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 1) throw new Error(`--${flag} must be a positive integer`);
  for (const size of Object.values(SIZES)) size.flash[key] = n;
}

const acquired = await acquireMmaDevice();
if (!acquired.ctx) {
  console.log(`mma ceiling probe skipped: ${acquired.reason}`);
  Deno.exit(0);
}
const ctx = acquired.ctx, info = ctx.adapter_info;
const limit = ctx.limits.maxComputeWorkgroupStorageSize;
const small = args.values.small || info.vendor === "mesa" || /llvmpipe/.test(info.description);
console.log(
  `adapter: ${info.vendor} ${info.description || info.device}; subgroup ${ctx.mma.sg}; ` +
    `matrices ${ctx.mma.m}x${ctx.mma.n}x${ctx.mma.k} f16->f32; workgroup memory ${limit} B; ` +
    `sizes ${small ? "small" : "gpu"}: ${JSON.stringify(SIZES[small ? "small" : "gpu"])}`,
);
console.log(
  "arrangement".padEnd(24) + " acc  wgmem  compile ms  median ms    min ms   TFLOP/s  check",
);
const iters = Math.max(1, Number(args.values.iters));
const names = args.values.only ? args.values.only.split(",") : CEILING_DEFAULTS;
const results: Record<string, unknown>[] = [];
for (const name of names) {
  const v = parseLadder(name) ?? parseLadder2(name, ctx.mma) ?? parseCeiling(name);
  if (!v) throw new Error(`unknown arrangement ${name} (bench/mma_ceiling_wgsl.ts's grammar)`);
  const s = SIZES[small ? "small" : "gpu"][v.loop], lay = ceilingLayout(v, ctx.mma, s);
  const bytes = isLadder2(v)
    ? ladder2Bytes(v, ctx.mma, s)
    : (v.step ?? 0) > 1
    ? ladderBytes(v, ctx.mma, s)
    : lay.bytes;
  const problem = ceilingProblem(v, ctx.mma, s) ??
    (isLadder2(v) ? ladder2Problem(v, ctx.mma) : null) ??
    (bytes > limit ? `needs ${bytes} B of workgroup memory` : null);
  if (problem) {
    console.log(`${name.padEnd(24)} skipped: ${problem}`);
    continue;
  }
  try {
    const r = await probe(ctx, v, s, iters);
    console.log(
      name.padEnd(24) + String(v.tm * v.tn).padStart(4) + String(bytes).padStart(7) +
        r.compileMs.toFixed(0).padStart(12) + r.med.toFixed(3).padStart(11) +
        r.min.toFixed(3).padStart(10) + (" " + r.tflops.toPrecision(4)).padStart(10) +
        `  ${r.ok ? "ok" : "WRONG"} (${r.worst.toFixed(3)})`,
    );
    results.push({ ...v, wgmem: bytes, ...r });
  } catch (err) {
    console.log(`${name.padEnd(24)} failed: ${err instanceof Error ? err.message : err}`);
  }
}
if (args.values.json) console.log(JSON.stringify(results));
Deno.exit(0);
