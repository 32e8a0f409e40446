/**
 * Reproduces the Dawn stall alone: one dispatch that runs about `ms` on the device, then
 * mapAsync; prints how long the map took, how many `setImmediate` calls Dawn's AsyncRunner made
 * meanwhile, and how long a plain `setTimeout(0)` took right after (the drain).
 * `deno run -A bench/stall/repro.ts ITERS...` (in the trixie chroot, Dawn on lavapipe);
 * `STALL_PACE=1` first installs gpu/dawn_tick_pace.ts (the fix).
 * @module
 */
import { create } from "webgpu";
import { installDawnTickPacing } from "../../gpu/dawn_tick_pace.ts";

const pacing = Deno.env.get("STALL_PACE") === "1" ? installDawnTickPacing() : null;

const gpu = create([]);
const adapter = await gpu.requestAdapter();
if (!adapter) throw new Error("no adapter");
const device = await adapter.requestDevice();
const code = `@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<uniform> n: vec4u;
@compute @workgroup_size(1) fn main() {
  var x = 1u;
  for (var i = 0u; i < n.x; i++) { x = x * 1664525u + 1013904223u; }
  out[0] = x;
}`;
const pipeline = device.createComputePipeline({
  layout: "auto",
  compute: { module: device.createShaderModule({ code }), entryPoint: "main" },
});
const out = device.createBuffer({
  size: 16,
  usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
});
const uni = device.createBuffer({
  size: 16,
  usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
});
const bg = device.createBindGroup({
  layout: pipeline.getBindGroupLayout(0),
  entries: [{ binding: 0, resource: { buffer: out } }, { binding: 1, resource: { buffer: uni } }],
});
const g = globalThis as unknown as { setImmediate: (f: () => void) => unknown };
const realImmediate = g.setImmediate;
let immediates = 0;
g.setImmediate = (f: () => void) => {
  immediates++;
  return realImmediate(f);
};
for (const iters of Deno.args.map(Number)) {
  const rb = device.createBuffer({
    size: 16,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  device.queue.writeBuffer(uni, 0, new Uint32Array([iters, 0, 0, 0]));
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(pipeline);
  pass.setBindGroup(0, bg);
  pass.dispatchWorkgroups(1);
  pass.end();
  enc.copyBufferToBuffer(out, 0, rb, 0, 16);
  immediates = 0;
  const t0 = performance.now();
  device.queue.submit([enc.finish()]);
  await rb.mapAsync(GPUMapMode.READ);
  const t1 = performance.now();
  const n = immediates;
  await new Promise((r) => setTimeout(r, 0));
  const t2 = performance.now();
  rb.unmap();
  rb.destroy();
  console.log(
    `iters ${iters}: map ${(t1 - t0).toFixed(0)} ms, ${n} setImmediate, next timer ${
      (t2 - t1).toFixed(0)
    } ms${pacing ? ` (pacer: ${JSON.stringify(pacing)})` : ""}`,
  );
}
device.destroy();
