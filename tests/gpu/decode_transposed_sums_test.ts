/**
 * gpu/decode_codegen.ts transposedSums, run on the host: the generated WGSL statements are
 * interpreted over simulated lanes (subgroupShuffleXor reads the partner lane's variable), and
 * every lane must end with the sum over its key group of every value, for N values below, at
 * and above the lane count, gathered by recursive doubling or by indexed shuffles. Also counts
 * the shuffles (the point of the transposed reduction).
 */
import assert from "node:assert/strict";
import { transposedSums } from "../../gpu/decode_scatter.ts";
import { freshSeed } from "../support/rng.ts";

type Env = Record<string, number | boolean>;

/**
 * WGSL expression to JS: select -> sel, subgroupShuffleXor(x, m) -> shx(env => x, m),
 * subgroupShuffle(x, id) -> shi(env => x, id) (x read in the other lane's variables).
 */
function toJs(w: string): string {
  for (const [key, fn] of [["subgroupShuffleXor(", "shx"], ["subgroupShuffle(", "shi"]]) {
    let i = w.indexOf(key);
    while (i >= 0) {
      let depth = 1, j = i + key.length;
      for (; depth > 0; j++) depth += w[j] === "(" ? 1 : w[j] === ")" ? -1 : 0;
      const inner = w.slice(i + key.length, j - 1), comma = inner.lastIndexOf(",");
      const arg = inner.slice(0, comma), other = inner.slice(comma + 1);
      w = `${w.slice(0, i)}${fn}((e) => { with (e) { return ${arg}; } }, ${other})${w.slice(j)}`;
      i = w.indexOf(key);
    }
  }
  return w.replace(/(\d+)u\b/g, "$1").replace(/select\(/g, "sel(");
}

/** Runs `code` on `lanes` lanes whose variables start as `init(lane)`; returns their envs. */
function simulate(code: string[], lanes: number, init: (l: number) => Record<string, number>) {
  const envs = Array.from({ length: lanes }, (_, l) => {
    const e: Env = { ...init(l) };
    for (let m = 1; m < lanes; m *= 2) e[`hb${m}`] = (l & m) !== 0;
    e.sgb = 0; // one key group: its first lane is lane 0
    return e;
  });
  for (const line of code) {
    const m = line.trim().match(/^(?:let )?(\w+) = (.*);$/);
    assert.ok(m, line);
    const js = toJs(m[2]);
    // Sloppy-mode functions (new Function) may use `with`: expressions read a lane's variables.
    const at = (env: Env) =>
      new Function("env", "sel", "shx", "shi", `with (env) { return ${js}; }`)(
        env,
        (a: number, b: number, c: boolean) => (c ? b : a),
        (f: (e: Env) => number, mask: number) => f(envs[envs.indexOf(env) ^ mask]),
        (f: (e: Env) => number, id: number) => f(envs[id]),
      );
    const vals = envs.map(at);
    envs.forEach((env, l) => (env[m[1]] = vals[l]));
  }
  return envs;
}

for (const [n, lpk] of [[16, 16], [16, 8], [4, 8], [1, 4], [32, 8], [8, 2], [2, 16]]) {
  for (const indexed of [false, true]) {
    Deno.test(`transposedSums: ${n} values over ${lpk} lanes${indexed ? ", indexed" : ""}`, () => {
      let seed = freshSeed();
      const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) % 1000) - 500;
      const names = Array.from({ length: n }, (_, i) => `s${i}`);
      const start = Array.from({ length: lpk }, () => names.map(() => rnd()));
      const code = transposedSums(names, lpk, indexed);
      const envs = simulate(
        code,
        lpk,
        (l) => Object.fromEntries(names.map((v, i) => [v, start[l][i]])),
      );
      names.forEach((v, i) => {
        const want = start.reduce((a, row) => a + row[i], 0);
        envs.forEach((env, l) => assert.equal(env[v], want, `${v} in lane ${l} (seed ${seed})`));
      });
      const text = code.join("\n");
      const xors = text.split("subgroupShuffleXor").length - 1;
      const all = text.split("subgroupShuffle").length - 1;
      const c = Math.max(1, n / lpk), r = Math.log2(Math.max(1, lpk / n));
      // Halving: N - c shuffles plus c r butterfly steps; gather: N - c (doubling) or N (indexed).
      assert.equal(xors, (n - c) + c * r + (indexed ? 0 : n - c), "xor shuffles");
      assert.equal(all - xors, indexed ? n : 0, "indexed shuffles");
      if (n >= 4 && lpk >= 4 && !indexed) {
        assert.ok(all < n * Math.log2(lpk), "fewer than a butterfly per value");
      }
    });
  }
}
