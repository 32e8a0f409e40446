/**
 * The key loops of the v0.7 ladder (bench/mma_ladder2_wgsl.ts): the prologue and loop of each
 * schedule (`3b`, `sb`, `sl`, `2b`, `nb`; see that module's comment) from the probe's WGSL pieces.
 * @module
 */

/** The schedules. */
export type Schedule = "3b" | "sb" | "sl" | "2b" | "nb";

/** What a schedule is built from (WGSL line lists and builders). */
export interface Parts {
  BK: number;
  tile: number;
  steps: number;
  qk: (kb: string) => string[];
  pv: (vb: string) => string[];
  pass: string[];
  bar: string;
  kLoad: string[];
  vLoad: string[];
  kStore: string[];
  vStore: string[];
  block: (kn: string, nb: string, more: string, body: string[]) => string[];
  guard: (cond: string, body: string[]) => string[];
}

/** The prologue and key loop of one schedule (see the module comment). */
export function scheduleBody(sched: Schedule, p: Parts): string[] {
  const { BK, tile, steps, bar } = p;
  if (sched === "sb") {
    // V's words live from their load (after the S barrier) to the top of the next tile.
    const decl = p.vLoad.filter((x) => x.startsWith("var "));
    const vFetch = p.vLoad.filter((x) => !x.startsWith("var "));
    return [
      ...decl,
      ...p.block("0u", "0u", "true", [...p.kLoad, ...p.kStore, ...vFetch]),
      bar,
      `for (var it = 0u; it < ${steps}u; it++) {`,
      ...[
        "let nb = 0u;",
        ...p.vStore, // V of this tile: read by PV two barriers on
        `let kn = (it + 1u) * ${BK}u;`,
        `let more = it + 1u < ${steps}u;`,
        ...p.kLoad,
        ...p.qk("0u"),
        bar,
        ...p.guard("more", p.kStore), // K of the next tile: read two barriers on
        ...vFetch,
        ...p.pass,
        bar,
        ...p.pv("0u"),
        bar,
      ].map((x) => "  " + x),
      "}",
    ];
  }
  if (sched === "sl") {
    // Late loads: each tile's words fetched where they are stored (no registers held).
    return [
      ...p.block("0u", "0u", "true", [...p.kLoad, ...p.kStore, ...p.vLoad, ...p.vStore]),
      bar,
      `for (var it = 0u; it < ${steps}u; it++) {`,
      ...[
        ...p.guard("it > 0u", p.block(`it * ${BK}u`, "0u", "true", [...p.vLoad, ...p.vStore])),
        ...p.qk("0u"),
        bar,
        ...p.block(`(it + 1u) * ${BK}u`, "0u", `it + 1u < ${steps}u`, [
          ...p.kLoad,
          ...p.guard("more", p.kStore),
        ]),
        ...p.pass,
        bar,
        ...p.pv("0u"),
        bar,
      ].map((x) => "  " + x),
      "}",
    ];
  }
  if (sched === "2b") {
    return [
      ...p.block("0u", "0u", "true", [...p.kLoad, ...p.vLoad, ...p.kStore, ...p.vStore]),
      ...p.block(`${BK}u`, "1u", `${steps > 1}`, [
        ...p.kLoad,
        ...p.vLoad,
        ...p.guard("more", [...p.kStore, ...p.vStore]),
      ]),
      bar,
      ...p.qk("0u"),
      bar,
      ...p.pass,
      bar,
      `for (var it = 0u; it < ${steps}u; it++) {`,
      ...[
        `let kn = (it + 2u) * ${BK}u;`,
        "let nb = it % 2u; // tile it + 2 goes where tile it was",
        `let more = it + 2u < ${steps}u;`,
        `let next = it + 1u < ${steps}u;`,
        ...p.kLoad,
        ...p.vLoad,
        ...p.guard("next", p.qk(`((it + 1u) % 2u) * ${tile}u`)),
        ...p.pv(`(it % 2u) * ${tile}u`),
        bar,
        ...p.guard("next", p.pass),
        ...p.guard("more", [...p.kStore, ...p.vStore]),
        bar,
      ].map((x) => "  " + x),
      "}",
    ];
  }
  const sp = sched === "nb" ? [] : [bar]; // nb: no barrier around the subgroup's own S and P
  return [
    ...p.block("0u", "0u", "true", [...p.kLoad, ...p.vLoad, ...p.kStore, ...p.vStore]),
    bar,
    `for (var it = 0u; it < ${steps}u; it++) {`,
    ...[
      `let bb = (it % 2u) * ${tile}u;`,
      `let kn = (it + 1u) * ${BK}u; // the tile staged now`,
      "let nb = (it + 1u) % 2u;",
      `let more = it + 1u < ${steps}u;`,
      ...p.kLoad,
      ...p.vLoad,
      ...p.qk("bb"),
      ...sp,
      ...p.pass,
      ...sp,
      ...p.pv("bb"),
      ...p.guard("more", [...p.kStore, ...p.vStore]),
      bar,
    ].map((x) => "  " + x),
    "}",
  ];
}
