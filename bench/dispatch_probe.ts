/**
 * The host cost of recording and submitting compute work, per WebGPU call, on the chosen runtime:
 * what a forward call's `encode_record` is made of (issue 7; bench/NOTES.md v0.9). Each case
 * records `--dispatches` dispatches of a one-workgroup kernel into one compute pass, finishes,
 * submits; the host time of each WebGPU method is summed over `--iters` encoders (after a
 * warm-up round of each case) and printed in microseconds per call. Cases:
 * - `direct`: dispatchWorkgroups on a bind group of small buffers;
 * - `big`: the same with a large storage buffer (`--big-mib`, a KV cache's size) in the group;
 * - `indirect`: dispatchWorkgroupsIndirect (the gated cache write's form);
 * - `samepipe`: setPipeline / setBindGroup once for all dispatches (what a fused call list
 *   would pay).
 *
 * Run: `deno run -A bench/dispatch_probe.ts [--runtime dawn|deno] [--iters N] [--dispatches N]
 * [--big-mib N]`.
 * @module
 */
import { parseArgs } from "node:util";
import { benchDevice } from "./bench_device.ts";

const args = parseArgs({
  args: Deno.args,
  options: {
    runtime: { type: "string" },
    iters: { type: "string", default: "400" },
    dispatches: { type: "string", default: "6" },
    "big-mib": { type: "string", default: "256" },
  },
});
const iters = Number(args.values.iters), nd = Number(args.values.dispatches);
const bigBytes = Number(args.values["big-mib"]) * 2 ** 20;
const { gpu } = await benchDevice(args.values.runtime);
const dev = gpu.device;
const S = GPUBufferUsage.STORAGE, C = GPUBufferUsage.COPY_DST;
const code = `
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@group(0) @binding(2) var<storage, read> c: array<u32>;
@compute @workgroup_size(32) fn main(@builtin(local_invocation_index) i: u32) {
  if (i == 0u) { b[0] = a[0] + c[0] + 1u; }
}`;
const pipe = await dev.createComputePipelineAsync({
  layout: "auto",
  compute: { module: dev.createShaderModule({ code }), entryPoint: "main" },
});
const small = (n: number) => dev.createBuffer({ size: n, usage: S | C });
const big = dev.createBuffer({ size: bigBytes, usage: S | C });
const ind = dev.createBuffer({ size: 16, usage: GPUBufferUsage.INDIRECT | C });
dev.queue.writeBuffer(ind, 0, new Uint32Array([1, 1, 1, 0]));
const group = (third: GPUBuffer) =>
  dev.createBindGroup({
    layout: pipe.getBindGroupLayout(0),
    entries: [small(256), small(256), third].map((buffer, binding) => ({
      binding,
      resource: { buffer },
    })),
  });
const groups = { small: group(small(256)), big: group(big) };

type Method =
  | "encoder"
  | "begin"
  | "setPipeline"
  | "setBindGroup"
  | "dispatch"
  | "end"
  | "finish"
  | "submit";
function runCase(kind: "direct" | "big" | "indirect" | "samepipe"): Record<Method, number> {
  const t: Record<Method, number> = {
    encoder: 0,
    begin: 0,
    setPipeline: 0,
    setBindGroup: 0,
    dispatch: 0,
    end: 0,
    finish: 0,
    submit: 0,
  };
  const g = kind === "big" ? groups.big : groups.small;
  let now = performance.now();
  const lap = (m: Method) => {
    const x = performance.now();
    t[m] += x - now;
    now = x;
  };
  for (let i = 0; i < iters; i++) {
    now = performance.now();
    const enc = dev.createCommandEncoder();
    lap("encoder");
    const pass = enc.beginComputePass();
    lap("begin");
    for (let d = 0; d < nd; d++) {
      if (d === 0 || kind !== "samepipe") {
        pass.setPipeline(pipe);
        lap("setPipeline");
        pass.setBindGroup(0, g);
        lap("setBindGroup");
      }
      if (kind === "indirect") pass.dispatchWorkgroupsIndirect(ind, 0);
      else pass.dispatchWorkgroups(1);
      lap("dispatch");
    }
    pass.end();
    lap("end");
    const cmd = enc.finish();
    lap("finish");
    dev.queue.submit([cmd]);
    lap("submit");
  }
  return t;
}

const line = (name: string, t: Record<Method, number>) => {
  const per = (m: Method, n: number) => (1000 * t[m] / n).toFixed(1).padStart(7);
  const calls = iters * nd, total = Object.values(t).reduce((a, b) => a + b, 0);
  console.log(
    `${name.padEnd(9)} ${per("encoder", iters)} ${per("begin", iters)} ${
      per("setPipeline", name === "samepipe" ? iters : calls)
    } ${per("setBindGroup", name === "samepipe" ? iters : calls)} ${per("dispatch", calls)} ${
      per("end", iters)
    } ${per("finish", iters)} ${per("submit", iters)} ${
      (1000 * total / iters).toFixed(1).padStart(8)
    }`,
  );
};
console.log(
  `${gpu.adapter_info.vendor} ${
    gpu.adapter_info.description ?? ""
  }; ${nd} dispatches an encoder, ` +
    `${iters} encoders; us per call (setPipeline/setBindGroup per dispatch ` +
    "but for samepipe; total per encoder)",
);
console.log("case      encoder   begin setPipe setBind  dispat     end  finish  submit    total");
for (let round = 0; round < 2; round++) {
  for (const kind of ["direct", "big", "indirect", "samepipe"] as const) {
    const t = runCase(kind);
    await dev.queue.onSubmittedWorkDone();
    if (round === 1) line(kind, t);
  }
}
