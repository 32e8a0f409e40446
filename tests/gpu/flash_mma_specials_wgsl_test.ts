/**
 * The WGSL pieces of the tensor-core kernel's handling of non-finite values (gpu/
 * flash_mma_specials.ts) that need no subgroup matrices, run as they are written on the suite's
 * device (lavapipe on CI): `tile_whole` (wgsl/flash_mma_rows.wgsl), which picks the tiles whose
 * values are cleaned and rescanned, against a brute force over the masking rules of
 * docs/api.md (causal: k <= p and p - k < w; otherwise |p - k| < w) for every tile start,
 * window and position range below; and `out_merge` (a word of two output elements after the
 * classes of the values a row saw), f16 and bf16, against float64's sums. A tile classed whole
 * while some position cannot see one of its keys would leave that row NaN (0 x Inf in P V); a
 * tile classed not whole costs only a rescan.
 * @module
 */
import assert from "node:assert/strict";
import { valueSpecialFns } from "../../gpu/flash_mma_specials.ts";
import { loadWgsl } from "../../gpu/wgsl.ts";
import type { MmaConsts } from "../../gpu/flash_mma_shape.ts";
import { dispatchIntoBuffer } from "../support/dispatch.ts";
import { GPU, GPU_TEST } from "./helpers.ts";

/** `fn name` of `src`, up to its closing brace at column 0. */
function fnText(src: string, name: string): string {
  const at = src.indexOf(`fn ${name}(`);
  assert.ok(at >= 0, `fn ${name} is in the source`);
  return src.slice(at, src.indexOf("\n}", at) + 2);
}

/** Runs `body` (a WGSL module with `fn main` at workgroup size 64 writing `o`) over `n` words. */
async function run(body: string, n: number, groups: number): Promise<Uint32Array> {
  const dev = GPU!.device;
  const module = dev.createShaderModule({
    code: `@group(0) @binding(0) var<storage, read_write> o: array<u32>;\n${body}`,
  });
  const errors = (await module.getCompilationInfo()).messages.filter((m) => m.type === "error");
  assert.equal(errors.length, 0, errors.map((m) => m.message).join("\n"));
  const pipeline = await dev.createComputePipelineAsync({
    layout: "auto",
    compute: { module, entryPoint: "main" },
  });
  return new Uint32Array(await dispatchIntoBuffer(dev, pipeline, n * 4, groups));
}

const BK = 16, KT = 8, P0 = 40, SPAN = 20; // tile starts 0, 16, .., 112; first positions 0..39

/** Whether position `p` sees key `k` (docs/api.md's masking rules; w 0: no window). */
function sees(p: number, k: number, causal: boolean, w: number): boolean {
  const d = p - k;
  return causal ? d >= 0 && (w === 0 || d < w) : w === 0 || Math.abs(d) < w;
}

/** Whether every key of [kt, kt + BK) is visible to every position of [p0, p1]. */
function wholeByRule(kt: number, p0: number, p1: number, causal: boolean, w: number): boolean {
  for (let p = p0; p <= p1; p++) {
    for (let k = kt; k < kt + BK; k++) if (!sees(p, k, causal, w)) return false;
  }
  return true;
}

/**
 * A module of `fns` and a `main` running `body` for invocations i < n, with the kernel's masking
 * uniforms (`U.window`, `U.causal`) as constants.
 */
const maskingModule = (causal: boolean, w: number, fns: string, n: number, body: string) =>
  `struct Params { window: u32, causal: u32 }
const U = Params(${w}u, ${causal ? 1 : 0}u);
const BK: u32 = ${BK}u;
${fns}
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.x;
  if (i >= ${n}u) {
    return;
  }
${body}
}`;

Deno.test({
  name: "flash_mma specials: tile_whole agrees with the masking rules, as WGSL runs it",
  ...GPU_TEST,
  async fn() {
    const tileWhole = fnText(await loadWgsl("flash_mma_rows.wgsl"), "tile_whole");
    const n = KT * P0 * SPAN;
    for (const causal of [true, false]) {
      for (const w of [0, 1, 3, 16, 17, 40]) {
        const got = await run(
          maskingModule(
            causal,
            w,
            tileWhole,
            n,
            `  let kt = (i / ${P0 * SPAN}u) * BK;
  let p0 = i32((i / ${SPAN}u) % ${P0}u);
  let p1 = p0 + i32(i % ${SPAN}u);
  o[i] = select(0u, 1u, tile_whole(kt, p0, p1));`,
          ),
          n,
          Math.ceil(n / 64),
        );
        let whole = 0;
        for (let i = 0; i < n; i++) {
          const kt = Math.floor(i / (P0 * SPAN)) * BK;
          const p0 = Math.floor(i / SPAN) % P0, p1 = p0 + (i % SPAN);
          const want = wholeByRule(kt, p0, p1, causal, w);
          whole += want ? 1 : 0;
          assert.equal(got[i], want ? 1 : 0, `causal ${causal}, w ${w}, kt ${kt}, p ${p0}..${p1}`);
        }
        // Both kinds, where a tile can be whole at all (a window narrower than a tile never is).
        if (causal || w > 0) assert.ok(whole < n, `some tiles not whole (w ${w})`);
        if (w === 0 || w >= BK) assert.ok(whole > 0, `some tiles whole (w ${w})`);
      }
    }
  },
});

Deno.test({
  name: "flash_mma specials: key_range is the keys some position sees, as WGSL runs it",
  ...GPU_TEST,
  async fn() {
    // key_range bounds a workgroup's key loop (its positions p0..p1) and the repair's rescan of
    // one row (p0 = p1): against the rules, clamped to kv_len.
    const keyRange = fnText(await loadWgsl("flash_mma_rows.wgsl"), "key_range");
    const KV = 50, n = P0 * SPAN;
    for (const causal of [true, false]) {
      for (const w of [0, 1, 3, 17]) {
        const got = await run(
          maskingModule(
            causal,
            w,
            keyRange,
            n,
            `  let p0 = i32(i / ${SPAN}u);
  let r = key_range(p0, p0 + i32(i % ${SPAN}u), ${KV}u);
  o[2u * i] = bitcast<u32>(r.x);
  o[2u * i + 1u] = bitcast<u32>(r.y);`,
          ),
          2 * n,
          Math.ceil(n / 64),
        );
        const lohi = new Int32Array(got.buffer);
        for (let i = 0; i < n; i++) {
          const p0 = Math.floor(i / SPAN), p1 = p0 + (i % SPAN);
          const seen: number[] = [];
          for (let k = 0; k < KV; k++) {
            let any = false;
            for (let p = p0; p <= p1; p++) any ||= sees(p, k, causal, w);
            if (any) seen.push(k);
          }
          const [lo, hi] = [lohi[2 * i], lohi[2 * i + 1]];
          const label = `causal ${causal}, w ${w}, p ${p0}..${p1}: [${lo}, ${hi})`;
          if (seen.length === 0) assert.ok(hi <= lo || lo >= KV, label);
          else assert.deepEqual([lo, hi], [seen[0], seen[seen.length - 1] + 1], label);
        }
      }
    }
  },
});

/** f16 and bf16 bits of +Inf, -Inf, a quiet NaN, and two finite values. */
const BITS = {
  float16: { pinf: 0x7c00, ninf: 0xfc00, nan: 0x7e00, one: 0x3c00, neg: 0xc000 },
  bfloat16: { pinf: 0x7f80, ninf: 0xff80, nan: 0x7fc0, one: 0x3f80, neg: 0xc000 },
} as const;

/** value_class's codes: 1 +Inf, 2 -Inf, 4 NaN. */
const CLASS_SUM: Record<number, number> = { 1: Infinity, 2: -Infinity, 4: NaN };

Deno.test({
  name: "flash_mma specials: out_merge gives what float64's sums give, f16 and bf16",
  ...GPU_TEST,
  async fn() {
    for (const dtype of ["float16", "bfloat16"] as const) {
      const b = BITS[dtype];
      const olds = [b.one, b.neg, b.pinf, b.ninf, b.nan];
      const oldValue = [1, -2, Infinity, -Infinity, NaN];
      const classes = [1, 2, 3, 4, 5, 6, 7];
      const fns = valueSpecialFns({ dtype, direct: false, mstage: false } as MmaConsts);
      const cases = olds.flatMap((o) => classes.map((c): [number, number] => [o, c]));
      // Each case in the low half, the high half a finite 1 with no class (left as it is).
      const got = await run(
        `${fnText(fns, "out_special")}\n${fnText(fns, "out_merge")}
const OLD = array<u32, ${cases.length}>(${cases.map(([o]) => `${o}u`).join(", ")});
const CLS = array<u32, ${cases.length}>(${cases.map(([, c]) => `${c}u`).join(", ")});
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.x;
  if (i < ${cases.length}u) {
    o[i] = out_merge(OLD[i] | (${b.one}u << 16u), vec2<u32>(CLS[i], 0u));
  }
}`,
        cases.length,
        1,
      );
      cases.forEach(([old, cls], i) => {
        // The row's sum: its own value plus the specials it saw, in float64.
        let want = oldValue[(olds as readonly number[]).indexOf(old)];
        for (const bit of [1, 2, 4]) if (cls & bit) want += CLASS_SUM[bit];
        const bits = Number.isNaN(want)
          ? b.nan
          : want === Infinity
          ? b.pinf
          : want === -Infinity
          ? b.ninf
          : old;
        const label = `${dtype}: old 0x${old.toString(16)}, classes ${cls}`;
        assert.equal(got[i] & 0xffff, bits, label);
        assert.equal(got[i] >>> 16, b.one, `${label}: the other half kept`);
      });
    }
  },
});
