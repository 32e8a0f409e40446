/**
 * The epilogue's output writer of the subgroup-matrix prefill kernel (`wgsl/flash_mma.wgsl`):
 * the WGSL function `write_rows` ({@link writeRowsCode}), which the O passes of
 * gpu/flash_mma_opass.ts call.
 * @module
 */

/**
 * write_rows: this lane's part of its rows of the epilogue O pass at s_s[base..] (columns c0..,
 * rows OSTR apart), normalised by `inv` and written as data-dtype bits: a 4-byte store per 2
 * elements, or with `ovec` one 16-byte store per 8 (`out` is then `array<vec4<u32>>`; a row's
 * element offset and a lane's columns are multiples of 8, so every store is whole and aligned).
 * `sink` (the bench's `write` ablation, wrong results): the words are folded into one value a
 * lane and stored only if it equals a constant, so the rounding stays and the stores go.
 */
export function writeRowsCode(c: { ovec: boolean; sink?: boolean }): string {
  const head = [
    "fn write_rows(sgr: u32, ln: u32, c0: u32, tb: array<u32, RPL>, inv: array<f32, RPL>, base: u32) {",
    ...(c.sink ? ["  var sink = 0u;"] : []),
    "  for (var i = 0u; i < RPL; i++) {",
    "    let b = base + (sgr + ln / LPR + i * (SG / LPR)) * OSTR + (ln % LPR) * OKPL;",
    "    let col = c0 + (ln % LPR) * OKPL;",
  ];
  const pair = (e: string) => `round_pair(s_s[b + ${e}] * inv[i], s_s[b + ${e} + 1u] * inv[i])`;
  const put = (at: string, v: string) => (c.sink ? `sink ^= ${v};` : `out[${at}] = ${v};`);
  const body = c.ovec
    ? [
      "    for (var e = 0u; e < OKPL; e += 8u) {",
      "      if (tb[i] != 0xffffffffu) {",
      c.sink
        ? `        sink ^= ${pair("e")} ^ ${pair("e + 2u")} ^ ${pair("e + 4u")} ^ ${
          pair("e + 6u")
        };`
        : `        out[(tb[i] + col + e) / 8u] = vec4<u32>(${pair("e")}, ${pair("e + 2u")},`,
      ...(c.sink ? [] : [`          ${pair("e + 4u")}, ${pair("e + 6u")});`]),
      "      }",
      "    }",
    ]
    : [
      "    for (var e = 0u; e < OKPL; e += 2u) {",
      "      if (tb[i] != 0xffffffffu && col + e < D) {",
      `        ${put("(tb[i] + col + e) / 2u", pair("e"))}`,
      "      }",
      "    }",
    ];
  const tail = c.sink
    ? [
      "  }",
      "  if (sink == 0x9e3779b9u) {",
      `    out[0] = ${c.ovec ? "vec4<u32>(sink)" : "sink"};`,
      "  }",
      "}",
    ]
    : ["  }", "}"];
  return [...head, ...body, ...tail].join("\n");
}
