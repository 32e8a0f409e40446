/**
 * The tensor-core kernel's epilogue (gpu/flash_mma_codegen.ts O_OUTPUT): O leaves the
 * accumulators in passes through `s_s`, normalised and rounded by the lanes (write_rows). The
 * default writes `bk` columns a pass in one region, a barrier before and after each pass's
 * writes; `oregions` 2 alternates two regions, so a pass's stores land where the pass before
 * last was read, already ordered by the last pass's barrier, and the barrier after the writes
 * goes; `ocols` widens a pass; `ovec` stores a lane's 8 elements of a row at once. The source is
 * checked here (the kernel itself runs only under Dawn on a GPU: bench/NOTES.md v0.18 timed and
 * checked `-p` and `-w` against float64 there; `-v` was not run on a GPU yet).
 */
import assert from "node:assert/strict";
import { flashMmaSource } from "../../gpu/flash_mma_codegen.ts";
import { FLASH_MMA } from "../../gpu/flash_mma_kernel.ts";
import {
  fullShape,
  MMA_VARIANTS,
  type MmaConsts,
  mmaLayout,
  mmaShapeProblem,
} from "../../gpu/flash_mma_shape.ts";
import { H200_F16_TARGET } from "../support/mma_case.ts";

/** The generated source's epilogue: from the normalising loop to the end of `main`. */
async function epilogueOf(name: string): Promise<{ src: string; full: string }> {
  const c = { ...H200_F16_TARGET, ...fullShape(MMA_VARIANTS[name]) } as MmaConsts;
  const full = await flashMmaSource(c);
  const at = full.indexOf("// Normalise and write");
  assert.ok(at > 0, `${name}: no epilogue comment`);
  return { src: full.slice(at), full };
}

const count = (s: string, what: RegExp) => (s.match(what) ?? []).length;

Deno.test("flash_mma epilogue: passes, regions and barriers of -fl, -flp and -flw", async () => {
  const d = H200_F16_TARGET.d; // 128 columns, 16-column S tiles
  const cases: [string, number, number, string[]][] = [
    // name, passes, barriers, the write_rows bases in order
    ["w8r1k16-fl", d / 16, 2 * (d / 16) - 1, Array(d / 16).fill("0u")],
    [
      "w8r1k16-flp",
      d / 16,
      d / 16,
      Array.from({ length: d / 16 }, (_, i) => i % 2 ? "1u * R * OSTR" : "0u"),
    ],
    ["w8r1k16-flw", d / 32, 2 * (d / 32) - 1, Array(d / 32).fill("0u")],
  ];
  for (const [name, passes, barriers, bases] of cases) {
    const { src } = await epilogueOf(name);
    const writes = [...src.matchAll(/write_rows\(sgr, ln, (\d+)u, tb, inv, ([^)]*)\);/g)];
    assert.equal(writes.length, passes, `${name}: passes`);
    assert.deepEqual(writes.map((w) => Number(w[1])), writes.map((_, i) => i * (d / passes)), name);
    assert.deepEqual(writes.map((w) => w[2]), bases, `${name}: regions`);
    assert.equal(count(src, /workgroupBarrier\(\);/g), barriers, `${name}: barriers`);
    // Every pass's stores go to the region its writes read.
    const stores = [
      ...src.matchAll(/subgroupMatrixStore<row_major>\(&s_s, ([^,]*), o_0_\d+, (\w+)\)/g),
    ];
    assert.equal(stores.length, d / 16, `${name}: one store per O fragment`);
    stores.forEach((st, f) => {
      const pass = Math.floor((f * 16) / (d / passes));
      const region = bases[pass] === "0u" ? "" : `${bases[pass]} + `;
      assert.ok(st[1].startsWith(`${region}(sgr + 0u) * OSTR`), `${name} fragment ${f}: ${st[1]}`);
    });
  }
});

Deno.test("flash_mma epilogue: s_s holds the regions, and what does not compile says why", async () => {
  const t = H200_F16_TARGET;
  for (const name of ["w8r1k16-fl", "w8r1k16-flp", "w8r1k16-flw"]) {
    const shape = MMA_VARIANTS[name], lay = mmaLayout(t, shape);
    const regions = shape.oregions ?? 1, cols = shape.ocols || shape.bk;
    assert.equal(lay.ostr, cols + 4, name);
    assert.ok(lay.sLen >= regions * lay.rows * lay.ostr, `${name}: ${lay.sLen} floats`);
    assert.ok(lay.sLen >= lay.rows * lay.sstr, `${name}: S fits too`);
    assert.ok(lay.shared_bytes <= 49152, `${name}: ${lay.shared_bytes} B`);
    const { full } = await epilogueOf(name);
    assert.match(full, new RegExp(`var<workgroup> s_s: array<f32, ${lay.sLen}u>;`), name);
  }
  const fl = MMA_VARIANTS["w8r1k16-fl"];
  assert.match(String(mmaShapeProblem(t, { ...fl, ocols: 24 })), /ocols 24 does not split/);
  assert.match(String(mmaShapeProblem(t, { ...fl, oregions: 3 })), /oregions 3 is not 1 or 2/);
  const fld = MMA_VARIANTS["w8r1k16-fld"];
  assert.match(String(mmaShapeProblem(t, { ...fld, oregions: 2 })), /need dsplit 1/);
  // Two regions of 32 columns do not fit 48 KB beside the tiles.
  assert.match(
    String(mmaShapeProblem(t, { ...fl, ocols: 32, oregions: 2 }, 49152)),
    /workgroup memory/,
  );
});

Deno.test("flash_mma epilogue: -flv writes 8 elements a store into a vec4 view of out", async () => {
  const d = H200_F16_TARGET.d;
  const fl = await epilogueOf("w8r1k16-fl"), flv = await epilogueOf("w8r1k16-flv");
  const outType = (name: string) => {
    const c = { ...H200_F16_TARGET, ...fullShape(MMA_VARIANTS[name]) } as MmaConsts;
    return FLASH_MMA.bindings(c).find((b) => b.name === "out")?.type;
  };
  assert.equal(outType("w8r1k16-fl"), "array<u32>");
  assert.equal(outType("w8r1k16-flv"), "array<vec4<u32>>");
  // The store inside write_rows: 4-byte words by pairs, or 16-byte words by eights.
  assert.match(fl.full, /for \(var e = 0u; e < OKPL; e \+= 2u\)/);
  assert.match(fl.full, /out\[\(tb\[i\] \+ col \+ e\) \/ 2u\] = round_pair\(/);
  assert.match(flv.full, /for \(var e = 0u; e < OKPL; e \+= 8u\)/);
  assert.match(flv.full, /out\[\(tb\[i\] \+ col \+ e\) \/ 8u\] = vec4<u32>\(round_pair\(/);
  assert.equal(count(flv.full, /round_pair\(s_s\[b \+ e/g), 4, "four pairs a store");
  // Everything but write_rows and the repair's output words (gpu/flash_mma_specials.ts: whole
  // 16-byte words under ovec) is the same kernel.
  const strip = (s: string) =>
    s.replace(/fn write_rows[\s\S]*?\n}\n/, "").replace(/ {8}let wi = [\s\S]*?\n {6}}\n/, "");
  assert.match(flv.full, /out\[wi\] = vec4<u32>\(out_merge\(old\.x, cls\[0\]\)/);
  assert.match(fl.full, /out\[wi \+ j\] = out_merge\(out\[wi \+ j\], cls\[j\]\);/);
  assert.equal(strip(flv.full), strip(fl.full));
  // 8 columns a lane are needed: 16-column passes over 2 lanes a row give them; 8-key S tiles
  // on a 64-lane subgroup would not.
  const lay = mmaLayout(H200_F16_TARGET, MMA_VARIANTS["w8r1k16-flv"]);
  assert.equal((d / (d / 16)) / lay.lpr, 8);
  const narrow = { ...H200_F16_TARGET, sg: 64 };
  assert.match(
    String(mmaShapeProblem(narrow, MMA_VARIANTS["w8r1k16-flv"])),
    /ovec needs 8 output columns a lane/,
  );
});

Deno.test("flash_mma epilogue: -flr rounds f16 pairs by pack2x16float in range, else as before", async () => {
  const fl = await epilogueOf("w8r1k16-fl"), flr = await epilogueOf("w8r1k16-flr");
  const roundPair = (s: string) => s.match(/fn round_pair\([\s\S]*?\n}\n/)?.[0] ?? "";
  assert.doesNotMatch(roundPair(fl.full), /pack2x16float/);
  assert.match(
    roundPair(flr.full),
    /< 0x477fe000u\) \{\n\s*return pack2x16float\(vec2<f32>\(a, b\)\);/,
  );
  assert.match(roundPair(flr.full), /return f16_bits\(bitcast<u32>\(a\)\) \| \(f16_bits/);
  // Only round_pair differs; a bf16 output keeps the integer rounding.
  const strip = (s: string) => s.replace(/fn round_pair[\s\S]*?\n}\n/, "");
  assert.equal(strip(flr.full), strip(fl.full));
  const bf = { ...H200_F16_TARGET, dtype: "bfloat16" as const };
  const src = (name: string) =>
    flashMmaSource({ ...bf, ...fullShape(MMA_VARIANTS[name]) } as MmaConsts);
  assert.equal(await src("w8r1k16-flr"), await src("w8r1k16-fl"));
});
