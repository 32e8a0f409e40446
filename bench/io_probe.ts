/**
 * `deno run -A bench/io_probe.ts [--runtime deno|dawn|auto]`: where a call's host<->GPU bytes
 * spend their time on this runtime, by size (256 KiB to 128 MiB): `writeBuffer` (until it
 * returns, and until the queue is done), a readback's `mapAsync`, `getMappedRange` and the copy
 * out of the mapped range into fresh memory (`slice`) and into memory already touched
 * (`set_warm`: no page faults).
 * Medians of 5. The numbers say whether uploads or readbacks are bound by the driver's
 * transfers or by reading mapped (possibly uncached) memory from JS.
 * @module
 */
import { parseArgs } from "node:util";
import { benchDevice } from "./bench_device.ts";
import { deviceSummary } from "../gpu/runtime_report.ts";

const median = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const f = (x: number) => (x >= 100 ? x.toFixed(0) : x.toPrecision(3));

const a = parseArgs({ args: Deno.args, options: { runtime: { type: "string" } } }).values;
const { device: mgr, gpu } = await benchDevice(a.runtime);
console.log(`runtime: ${deviceSummary(mgr.report())}`);
const dev = gpu.device;
const sizes = [256 << 10, 4 << 20, 64 << 20, 128 << 20]
  .filter((n) => n <= gpu.limits.maxBufferSize);
for (const n of sizes) {
  const src = new Uint8Array(n).fill(7);
  const store = dev.createBuffer({
    size: n,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
  });
  const rb = dev.createBuffer({
    size: n,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const t: Record<string, number[]> = {
    write: [],
    write_done: [],
    copy_map: [],
    get_range: [],
    slice: [],
    set_warm: [],
  };
  const warmDst = new Uint8Array(n).fill(1);
  for (let i = 0; i < 6; i++) {
    const t0 = performance.now();
    dev.queue.writeBuffer(store, 0, src);
    const t1 = performance.now();
    await dev.queue.onSubmittedWorkDone();
    const t2 = performance.now();
    const enc = dev.createCommandEncoder();
    enc.copyBufferToBuffer(store, 0, rb, 0, n);
    dev.queue.submit([enc.finish()]);
    await rb.mapAsync(GPUMapMode.READ);
    const t3 = performance.now();
    const range = rb.getMappedRange();
    const t4 = performance.now();
    const copy = range.slice(0);
    const t5 = performance.now();
    warmDst.set(new Uint8Array(range));
    const t6 = performance.now();
    rb.unmap();
    if (copy.byteLength !== n || warmDst[n - 1] !== 7) console.log("?");
    if (i === 0) continue; // warm-up
    t.write.push(t1 - t0);
    t.write_done.push(t2 - t0);
    t.copy_map.push(t3 - t2);
    t.get_range.push(t4 - t3);
    t.slice.push(t5 - t4);
    t.set_warm.push(t6 - t5);
  }
  const mb = n / 2 ** 20;
  console.log(
    `${mb} MiB: ` +
      Object.entries(t).map(([k, v]) => {
        const ms = median(v);
        return `${k} ${f(ms)} ms (${f(n / ms / 1e6)} GB/s)`;
      }).join(", "),
  );
  store.destroy();
  rb.destroy();
}
await mgr.close?.();
Deno.exit(0);
