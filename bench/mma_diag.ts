/**
 * Where a flash_mma variant goes wrong: every (token, head) row of a small case against the
 * float64 reference, the wrong rows grouped by their place in the tile (row block, row in
 * block), by 16-wide column block and by visible key tiles, and each wrong row compared with
 * what it would be had one key tile's K or V been another tile's (a stale or early buffer).
 *
 * Usage: deno run -A bench/mma_diag.ts [--variant w8r1k16-fl] [--cases 1x16n-h4k1,1x64n-h4k1]
 * @module
 */
import { parseArgs } from "node:util";
import { mmaConstsOf, MmaRefusal, planFlashMma } from "../backends/flash_mma_plan.ts";
import { MMA_VARIANTS, mmaLayout } from "../gpu/flash_mma_shape.ts";
import { acquireMmaDevice } from "../gpu/flash_mma_device.ts";
import { runGpuPlan } from "../gpu/gpu_plan.ts";
import {
  F16,
  parseCase,
  type PrefillData,
  prefillData,
  referenceRow,
  rowError,
} from "./mma_bench_data.ts";

const args = parseArgs({
  args: Deno.args,
  options: {
    variant: { type: "string", default: "w8r1k16-fl" },
    cases: { type: "string", default: "1x16n-h4k1,1x32n-h4k1,1x64n-h4k1,1x128-h4k1,1x256-h32k8" },
  },
});
const BK = 16;

/** A row's reference with key tile `j` swapped: its K (`k`) or V (`v`) taken from tile `src`. */
function refRow(
  p: PrefillData,
  tok: number,
  h: number,
  swap?: { kv: "k" | "v"; j: number; src: number },
) {
  const t0 = tok - (tok % p.c.len);
  return referenceRow(p, tok, h, (t, kv) => {
    const i = t - t0;
    const moved = swap && swap.kv === kv && Math.floor(i / BK) === swap.j;
    return moved ? t0 + swap.src * BK + (i % BK) : t;
  });
}

const acquired = await acquireMmaDevice();
if (!acquired.ctx) {
  console.log(`skipped: ${acquired.reason}`);
  Deno.exit(0);
}
const ctx = acquired.ctx;
const shape = MMA_VARIANTS[args.values.variant!];
const base = { reqs: 1, len: 64, heads: 32, kvHeads: 8, headSize: 128, blockSize: 16 };
for (const name of args.values.cases!.split(",")) {
  const c = parseCase(name, base)!;
  const p = await prefillData(ctx, c);
  const plan = await planFlashMma(ctx, p.batch, ctx.mma, shape);
  const r = await runGpuPlan(plan, p.batch, ctx);
  const ob = r.output.bytes, out = new Uint16Array(ob.buffer, ob.byteOffset, ob.byteLength / 2);
  const lse = r.lse!;
  const { heads: H, kvHeads: Hkv, headSize: D, len } = c, T = p.batch.num_tokens, hcnt = H / Hkv;
  const consts = mmaConstsOf(ctx, p.batch, ctx.mma, shape);
  if (consts instanceof MmaRefusal) throw new Error(consts.detail);
  const rows = mmaLayout(consts, consts).rows, tokPerTile = rows / hcnt, MM = ctx.mma.m;
  let wrong = 0, lseWrong = 0;
  const byRb = new Map<string, number>(), byCol = new Map<number, number>();
  const byTiles = new Map<number, number>(), swaps = new Map<string, number>();
  const samples: string[] = [];
  for (let tok = 0; tok < T; tok++) {
    for (let h = 0; h < H; h++) {
      const want = refRow(p, tok, h), o = (tok * H + h) * D;
      const e = rowError(out, o, want.out), le = Math.abs(lse[h * T + tok] - want.lse);
      if (le > 1e-3) lseWrong++;
      if (e <= 1) continue;
      wrong++;
      const r = ((tok % len) % tokPerTile) * hcnt + (h % hcnt);
      const k = `rb${Math.floor(r / MM)}/r${r % MM}`;
      byRb.set(`rb${Math.floor(r / MM)}`, (byRb.get(`rb${Math.floor(r / MM)}`) ?? 0) + 1);
      byRb.set(`row%MM=${r % MM}`, (byRb.get(`row%MM=${r % MM}`) ?? 0) + 1);
      for (let cb = 0; cb < D / 16; cb++) {
        const sub = rowError(out, o + cb * 16, want.out.slice(cb * 16, cb * 16 + 16));
        if (sub > 1) byCol.set(cb, (byCol.get(cb) ?? 0) + 1);
      }
      const vis = c.causal === false ? len : (tok % len) + 1;
      byTiles.set(Math.ceil(vis / BK), (byTiles.get(Math.ceil(vis / BK)) ?? 0) + 1);
      const nt = Math.ceil(vis / BK);
      let best = "", bestE = e;
      for (const kv of wrong <= 40 ? (["k", "v"] as const) : []) {
        for (let j = 0; j < nt; j++) {
          for (const src of [j - 1, j + 1, 0, nt - 1]) {
            if (src === j || src < 0 || src * BK >= len) continue;
            const alt = refRow(p, tok, h, { kv, j, src });
            const ae = rowError(out, o, alt.out);
            if (ae < bestE) [best, bestE] = [`${kv}${j}<-${src}`, ae];
          }
        }
      }
      swaps.set(best || "none", (swaps.get(best || "none") ?? 0) + 1);
      if (samples.length < 6) {
        const got = Array.from({ length: 4 }, (_, d) => F16[out[o + d]].toFixed(3)).join(" ");
        const exp = Array.from({ length: 4 }, (_, d) => want.out[d].toFixed(3)).join(" ");
        samples.push(
          `  tok ${tok} h ${h} ${k} err ${e.toFixed(1)} lse ${
            le.toExponential(1)
          } got [${got}] want [${exp}] best swap ${best || "none"} (${bestE.toFixed(2)})`,
        );
      }
    }
  }
  const fmt = (m: Map<unknown, number>) => [...m].map(([k, v]) => `${k}:${v}`).join(" ");
  console.log(
    `\n${name} (${args.values.variant}): wrong rows ${wrong}/${T * H}, lse wrong ${lseWrong}`,
  );
  if (wrong) {
    console.log(`  by row: ${fmt(byRb)}`);
    console.log(`  by 16-col block: ${fmt(byCol)}`);
    console.log(`  by visible tiles: ${fmt(byTiles)}`);
    console.log(`  closest swap: ${fmt(swaps)}`);
    console.log(samples.join("\n"));
  }
  p.cache.destroy();
}
