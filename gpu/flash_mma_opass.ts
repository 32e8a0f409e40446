/**
 * The O passes of the subgroup-matrix prefill kernel (`wgsl/flash_mma.wgsl`): its O accumulators
 * through workgroup memory `s_s`, for the lazy rescale in the key loop (O_RESCALE, and under
 * `stagger` O_RESCALE_MINE) and for the epilogue's normalised output (O_OUTPUT, written by
 * gpu/flash_mma_write_rows.ts `write_rows`; O_SINK, the stores alone) ({@link oPassCode}).
 * @module
 */
import { type MmaConsts, strideArg } from "./flash_mma_shape.ts";
import type { MatrixFrame } from "./flash_mma_frame.ts";

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** The O passes' lines: the rescale's, the staggered half's, the epilogue's and its sink's. */
export function oPassCode(
  c: MmaConsts,
  fr: MatrixFrame,
): { rescale: string[]; mine: string[]; output: string[]; sink: string[] } {
  const { m, n, d, bk, ds, dqp, srow, RM, DN, Res } = fr;
  // O passes: columns [c0, c0 + w) through s_s, rows `str` floats apart from `base`: the
  // rescale's (w = bk, SSTR) and the epilogue's (w = ocols, OSTR, region base).
  const passesOf = (w: number, str: string, base: (p: number) => string) =>
    range(Math.ceil(d / ds / w)).map((p) => {
      const c0 = p * w;
      const frags = RM.flatMap((r) =>
        DN.filter((c) => c * n >= c0 && c * n < c0 + w).map((c) => ({
          name: `o_${r}_${c}`,
          at: `${base(p)}(${srow} + ${r * m}u) * ${str} + ${c * n - c0}u`,
        }))
      );
      return { c0, frags };
    });
  const passes = passesOf(bk, "SSTR", () => "");
  const regions = c.oregions;
  const region = (p: number) => (p % regions ? `${p % regions}u * R * OSTR` : ""); // pass p's
  const outPasses = passesOf(c.ocols, "OSTR", (p) => (region(p) ? `${region(p)} + ` : ""));
  // The epilogue's stride: SSTR's run-time word only where OSTR is SSTR (the stride probe).
  const oStride = c.ocols === bk ? strideArg("o", "sstr") : "OSTR";
  const store = (fs: { name: string; at: string }[], stride = strideArg("o", "sstr")) =>
    fs.map((f) => `subgroupMatrixStore<row_major>(&s_s, ${f.at}, ${f.name}, ${stride});`);
  const rescale: string[] = [], output: string[] = [], sink: string[] = [];
  const loadBack = (f: { name: string; at: string }) =>
    `${f.name} = subgroupMatrixLoad<${Res}, row_major>(&s_s, ${f.at}, ${strideArg("o", "sstr")});`;
  // sgresc: the subgroup's own rows only, no workgroup barrier (see RESC_APPLY).
  const bar = c.sgresc ? [] : ["workgroupBarrier();"];
  passes.forEach(({ frags }) => {
    rescale.push(...store(frags), ...bar, `scale_rows(${srow}, ln, alpha);`);
    rescale.push(...bar);
    rescale.push(...frags.map(loadBack));
    rescale.push(...bar);
  });
  // stagger: only the subgroups of the half that asked (`mine`), the second half's rows `rsh`
  // past its S rows (which still hold a tile's scores then).
  const mine: string[] = [];
  const guard = (xs: string[]) => ["if (mine) {", ...xs.map((x) => "  " + x), "}"];
  if (c.stagger) {
    passesOf(bk, "SSTR", () => "rsh * SSTR + ").forEach(({ frags }) => {
      mine.push(...guard(store(frags)), "workgroupBarrier();");
      mine.push(...guard([`scale_rows(${srow} + rsh, ln, alpha);`]), "workgroupBarrier();");
      mine.push(...guard(frags.map(loadBack)), "workgroupBarrier();");
    });
  }
  // With one region a pass's writes must finish before the next pass's stores (a barrier);
  // with two, pass p stores where pass p - 2 was read, before pass p - 1's barrier.
  outPasses.forEach(({ c0, frags }, i) => {
    output.push(
      ...store(frags, oStride),
      "workgroupBarrier();",
      `write_rows(${srow}, ln, ${dqp}${c0}u, tb, inv, ${region(i) || "0u"});`,
    );
    if (regions === 1 && i < outPasses.length - 1) output.push("workgroupBarrier();");
    sink.push(...store(frags, oStride));
  });
  return { rescale, mine, output, sink };
}
