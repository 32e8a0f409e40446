/**
 * `deno run -A bench/cvt_probe.ts [--runtime deno|dawn]`: what decoding f16 words costs beside
 * f32 FMAs on this adapter. bench/fma.wgsl's frame (8 vec4 FMA chains an invocation) with each
 * pair of chains also decoding one u32 of two f16 values (taken from a chain's bits, so nothing
 * is hoisted) that both chains then multiply by: one decoded word per 8 FMAs, the ratio of the
 * split-KV kernels' key and value sums (wgsl/decode_split.wgsl: a decoded vec4 feeds 4 heads).
 * Decoders: `unpack2x16float`; the same by integer shifts into f32 bits and one multiply by
 * 2^112 (finite values only: no Inf/NaN fix-up, subnormals become f32 subnormals); and
 * `bitcast<vec2<f16>>` then `vec2<f32>` (shader-f16). Prints each variant's FMA rate against
 * the plain loop's: what one decoded word costs in FMA slots.
 * @module
 */
import { parseArgs } from "node:util";
import { benchDevice } from "./bench_device.ts";
import { fmaBench, type FmaVariant } from "./fma.ts";

const pair = (c: number, decode: (w: string) => string) =>
  c % 2 === 1 ? "" : [
    "    {",
    `      let w = bitcast<u32>(x${c + 1}.w);`,
    `      let h = ${decode("w")};`,
    "      let hv = vec4<f32>(h, h);",
    `      x${c} = fma(x${c}, hv, b);`,
    `      x${c + 1} = fma(x${c + 1}, hv, b);`,
    "    }",
  ].join("\n");

const SHIFTS = (w: string) =>
  `vec2<f32>(bitcast<f32>(((${w} & 0x7fffu) << 13u) | ((${w} & 0x8000u) << 16u)), ` +
  `bitcast<f32>(((${w} >> 3u) & 0x0fffe000u) | (${w} & 0x80000000u))) * 5.192296858534828e33`;

const VARIANTS: FmaVariant[] = [
  { name: "unpack2x16float", step: (c) => pair(c, (w) => `unpack2x16float(${w})`) },
  { name: "shifts", step: (c) => pair(c, SHIFTS) },
  {
    name: "f16 bitcast",
    step: (c) => pair(c, (w) => `vec2<f32>(bitcast<vec2<f16>>(${w}))`),
    f16: true,
  },
];

if (import.meta.main) {
  const args = parseArgs({ args: Deno.args, options: { runtime: { type: "string" } } });
  const { gpu, device } = await benchDevice(args.values.runtime ?? "deno");
  const plain = await fmaBench(gpu, 20, 5);
  console.log(`plain FMA: ${plain.tflops.toFixed(1)} TFLOP/s (${plain.ms.toFixed(2)} ms)`);
  for (const v of VARIANTS) {
    if (v.f16 && !gpu.features.has("shader-f16")) continue;
    try {
      const r = await fmaBench(gpu, 20, 5, v);
      const slots = (plain.tflops / r.tflops - 1) * 8;
      console.log(
        `${v.name}: ${r.tflops.toFixed(1)} TFLOP/s of FMAs = ${
          (r.tflops / plain.tflops).toFixed(3)
        }x plain; a decoded word costs ${slots.toFixed(2)} FMA slots`,
      );
    } catch (e) {
      console.log(`${v.name}: failed: ${e instanceof Error ? e.message : e}`);
    }
  }
  device.close();
}
