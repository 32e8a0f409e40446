/**
 * One thread of bench/device_threads_probe.ts: loads its own WebGPU runtime (Dawn in this
 * isolate, or Deno's), takes its own device and runs decode-call-shaped work for the time asked,
 * one call at a time: upload `in_bytes`, a compute pass that reads them and writes `out_bytes`,
 * a copy into a map buffer, `mapAsync` and a read of the first word (checked: each call writes
 * its own call number). Posts `{ ready }` once its device works and one call came back, runs
 * on the probe's `go` (so every thread is timed over the same stretch) and posts
 * `{ calls, ms, p50_ms }`; or `{ error }`. The runtime object (and so Dawn's `GPU`) stays referenced from module scope
 * for the worker's life: a collected `GPU` under a live device aborted the process (NOTES v0.10).
 * @module
 */
import { loadRuntime } from "../gpu/runtime.ts";
import type { RuntimeName } from "../gpu/runtime_options.ts";
import { DEFAULT_DAWN_FLAGS } from "../gpu/runtime_options.ts";
import { requestFullDevice } from "../gpu/runtime_device.ts";
import { wakeDawnPoll } from "../gpu/dawn_tick_pace.ts";
import { useStderrLock } from "../gpu/runtime_stderr.ts";

/** What the probe asks of one thread. */
export interface ThreadJob {
  runtime: RuntimeName;
  /** The process's stderr-capture lock (gpu/runtime_stderr.ts): Dawn's adapter requests. */
  stderr_lock: SharedArrayBuffer;
  in_bytes: number;
  out_bytes: number;
  ms: number;
}

interface Scope {
  postMessage(m: unknown): void;
  onmessage: ((e: MessageEvent) => void) | null;
}
const scope = globalThis as unknown as Scope;
const keep: unknown[] = [];

const SHADER = `
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@group(0) @binding(2) var<uniform> call: vec4<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let n = arrayLength(&dst);
  for (var i = g.x; i < n; i += 64u * 256u) {
    dst[i] = src[i % arrayLength(&src)] ^ vec4<u32>(0u);
  }
  if (g.x == 0u) {
    dst[0] = vec4<u32>(call.x, 0u, 0u, 0u);
  }
}`;

async function device(job: ThreadJob): Promise<GPUDevice> {
  useStderrLock(job.stderr_lock);
  const rt = await loadRuntime(job.runtime, DEFAULT_DAWN_FLAGS);
  keep.push(rt);
  if (rt.unavailable) throw new Error(`${job.runtime}: ${rt.unavailable}`);
  const r = await rt.requestAdapter({ powerPreference: "high-performance" });
  if (!r.adapter) throw new Error(`${job.runtime}: ${r.reason ?? "no adapter"}`);
  const dev = await requestFullDevice(r.adapter, "device-threads-probe");
  if (typeof dev === "string") throw new Error(dev);
  rt.prepareDevice?.(dev);
  keep.push(r.adapter, dev);
  return dev;
}

/** Sets up the work and makes one checked call; returns the timed loop. */
async function prepare(
  job: ThreadJob,
): Promise<() => Promise<{ calls: number; ms: number; p50_ms: number }>> {
  const dev = await device(job);
  const S = GPUBufferUsage.STORAGE;
  const src = dev.createBuffer({ size: job.in_bytes, usage: S | GPUBufferUsage.COPY_DST });
  const dst = dev.createBuffer({ size: job.out_bytes, usage: S | GPUBufferUsage.COPY_SRC });
  const uni = dev.createBuffer({
    size: 16,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  const map = dev.createBuffer({
    size: job.out_bytes,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const pipe = dev.createComputePipeline({
    layout: "auto",
    compute: { module: dev.createShaderModule({ code: SHADER }), entryPoint: "main" },
  });
  const bind = dev.createBindGroup({
    layout: pipe.getBindGroupLayout(0),
    entries: [src, dst, uni].map((buffer, binding) => ({ binding, resource: { buffer } })),
  });
  const body = new Uint8Array(job.in_bytes).fill(7);
  const call = async (n: number) => {
    dev.queue.writeBuffer(src, 0, body);
    dev.queue.writeBuffer(uni, 0, new Uint32Array([n, 0, 0, 0]));
    const enc = dev.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipe);
    pass.setBindGroup(0, bind);
    pass.dispatchWorkgroups(256);
    pass.end();
    enc.copyBufferToBuffer(dst, 0, map, 0, job.out_bytes);
    dev.queue.submit([enc.finish()]);
    wakeDawnPoll();
    await map.mapAsync(GPUMapMode.READ);
    const got = new Uint32Array(map.getMappedRange(0, 16))[0];
    map.unmap();
    if (got !== n) throw new Error(`call ${n} read back ${got}`);
  };
  await call(0);
  return async () => {
    const times: number[] = [];
    const t0 = performance.now();
    while (performance.now() - t0 < job.ms) {
      const t = performance.now();
      await call(times.length + 1);
      times.push(performance.now() - t);
    }
    const ms = performance.now() - t0;
    times.sort((a, b) => a - b);
    dev.destroy();
    return { calls: times.length, ms, p50_ms: times[times.length >> 1] ?? NaN };
  };
}

let timed: (() => Promise<unknown>) | null = null;
scope.onmessage = async (e: MessageEvent) => {
  try {
    if (e.data === "go") {
      scope.postMessage(await timed!());
    } else {
      timed = await prepare(e.data as ThreadJob);
      scope.postMessage({ ready: true });
    }
  } catch (err) {
    scope.postMessage({ error: err instanceof Error ? err.message : String(err) });
  }
};
