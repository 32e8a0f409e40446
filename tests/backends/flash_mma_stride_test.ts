/**
 * The tensor-core kernel's workgroup memory and matrix strides. On the H200 (NVIDIA driver
 * 580.159, Dawn's robustness off) constant strides read wrong tiles while the kernel declared
 * three scalar workgroup variables beside its tiles (bench/NOTES.md v0.11-v0.13); with the
 * scalars in one 16-byte array they are right in every variant and faster (v0.16). The GPU suite
 * sees that only there, so this checks the generated source of every variant and configuration:
 * no scalar workgroup variable, every workgroup matrix call with a compile-time stride (the
 * cache's `kvstr` for direct loads), the Params words the plan writes equal to those constants,
 * and the bench probe `ATTN_MMA_RUNTIME_STRIDES` rewriting only what it names.
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
  type MmaTarget,
} from "../../gpu/flash_mma_shape.ts";
import { H200_F16_TARGET } from "../support/mma_case.ts";
import { withEnv } from "../support/env.ts";

/** Each `subgroupMatrixLoad<...>(...)` / `subgroupMatrixStore<...>(...)` call's arguments. */
function matrixCalls(src: string): { call: string; args: string[] }[] {
  const out: { call: string; args: string[] }[] = [];
  const re = /subgroupMatrix(Load|Store)</g;
  for (let m = re.exec(src); m; m = re.exec(src)) {
    let i = m.index + m[0].length, depth = 1;
    for (; depth > 0; i++) depth += src[i] === "<" ? 1 : src[i] === ">" ? -1 : 0;
    assert.equal(src[i], "(", `a call at ${m.index}`);
    const args: string[] = [];
    let start = ++i;
    for (depth = 1; depth > 0; i++) {
      const ch = src[i];
      if (ch === "(") depth++;
      else if (ch === ")" && --depth === 0) args.push(src.slice(start, i).trim());
      else if (ch === "," && depth === 1) {
        args.push(src.slice(start, i).trim());
        start = i + 1;
      }
    }
    out.push({ call: src.slice(m.index, i), args });
  }
  return out;
}

const LAVAPIPE: Partial<MmaTarget> = { m: 8, n: 8, k: 8, sg: 8, d: 64 };
const targets: [string, MmaTarget][] = [
  ["H200 f16", H200_F16_TARGET],
  ["H200 bf16 HND window sinks", {
    ...H200_F16_TARGET,
    kv: "bfloat16",
    dtype: "bfloat16",
    nhd: false,
    window: true,
    sinks: true,
  }],
  ["H200 fp8 non-causal", { ...H200_F16_TARGET, kv: "fp8_e4m3", causal: false }],
  ["H200 encoder", { ...H200_F16_TARGET, enc: true, causal: false }],
  ["lavapipe f16", { ...H200_F16_TARGET, ...LAVAPIPE }],
];

Deno.test("flash_mma: every matrix call of every variant takes a compile-time stride", async () => {
  let checked = 0;
  for (const [label, t] of targets) {
    for (const [name, shape] of Object.entries(MMA_VARIANTS)) {
      if (mmaShapeProblem(t, shape, 1 << 20) !== null) continue;
      const c = { ...t, ...fullShape(shape) } as MmaConsts;
      const calls = matrixCalls(await flashMmaSource(c));
      assert.ok(calls.length > 0, `${label} ${name}: no matrix calls found`);
      for (const { call, args } of calls) {
        const stride = args[args.length - 1];
        assert.match(stride, /^(KSTR|PSTR|SSTR|OSTR|kvstr)$/, `${label} ${name}: ${call}`);
        checked++;
      }
    }
  }
  assert.ok(checked > 500, `only ${checked} calls checked`);
});

Deno.test("flash_mma: the stride Params are the kernel's compile-time strides", async () => {
  const names = FLASH_MMA.uniforms.map(([n]) => n);
  for (const u of ["kstr", "pstr", "sstr"]) assert.ok(names.includes(u), u);
  for (const [label, t] of targets) {
    const shape = MMA_VARIANTS["w8r1k16-fl"];
    const lay = mmaLayout(t, shape);
    const src = await flashMmaSource({ ...t, ...fullShape(shape) } as MmaConsts);
    const konst = (n: string) => Number(new RegExp(`const ${n}: u32 = (\\d+)u?;`).exec(src)?.[1]);
    assert.deepEqual(
      [konst("KSTR"), konst("PSTR"), konst("SSTR")],
      [lay.kstr, lay.pstr, lay.sstr],
      label,
    );
    assert.deepEqual([lay.kstr, lay.pstr, lay.sstr], [t.d + 8, 24, 20], label);
  }
});

Deno.test("flash_mma: ATTN_MMA_RUNTIME_STRIDES (bench probe) gives only the named kinds Params strides", async () => {
  const c = { ...H200_F16_TARGET, ...fullShape(MMA_VARIANTS["w8r1k16-fl"]) } as MmaConsts;
  const strides = (v: string | undefined) =>
    withEnv(
      { ATTN_MMA_RUNTIME_STRIDES: v },
      async () => matrixCalls(await flashMmaSource(c)).map(({ args }) => args[args.length - 1]),
    );
  const base = await strides(undefined);
  const sOnly = await strides("s");
  const all = await strides("all");
  assert.equal(sOnly.length, base.length);
  const changed = sOnly.filter((x, i) => x !== base[i]);
  assert.ok(changed.length > 0 && changed.every((x) => x === "U.sstr"), `s: ${changed}`);
  assert.ok(base.some((x, i) => x === "SSTR" && sOnly[i] === "SSTR"), "O's strides changed");
  assert.deepEqual(
    [...new Set(all)].sort(),
    ["U.kstr", "U.pstr", "U.sstr"],
    "all: every workgroup call from Params",
  );
});

Deno.test("flash_mma: no variant declares a scalar workgroup variable", async () => {
  const scalar = /var<workgroup> \w+: (u32|i32|f32|f16|atomic<u32>|atomic<i32>);/;
  let checked = 0;
  for (const [label, t] of targets) {
    for (const [name, shape] of Object.entries(MMA_VARIANTS)) {
      if (mmaShapeProblem(t, shape, 1 << 20) !== null) continue;
      const c = { ...t, ...fullShape(shape) } as MmaConsts;
      const src = await flashMmaSource(c);
      assert.doesNotMatch(src, scalar, `${label} ${name}`);
      const code = src.split("\n").filter((l) => !l.trim().startsWith("//")).join("\n");
      // Each word: kstart and kend stored once and loaded once; the rescale flag at least reset.
      for (const i of [0, 1]) {
        assert.equal(code.split(`atomicStore(&s_u[${i}]`).length, 2, `${label} ${name}: ${i}`);
        assert.equal(code.split(`workgroupUniformLoad(&s_u[${i}])`).length, 2);
      }
      assert.ok(code.includes("&s_u[2]") || c.sgresc, `${label} ${name}: the rescale flag`);
      checked++;
    }
  }
  assert.ok(checked > 50, `only ${checked} sources checked`);
});
