/**
 * The bandwidth yardstick of the benchmark: bench/copy.wgsl (a vec4<u32> copy) over the
 * largest buffer the binding limit allows, timed by timestamp-query when granted and by the
 * wall clock.
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import { getComputePipeline } from "../gpu/pipelines.ts";
import { specialize } from "../gpu/wgsl.ts";

/** What the copy kernel measured. */
export interface CopyResult {
  bytes: number;
  dispatches: number;
  wall_ms: number;
  gpu_ms: number | null;
  gbps_wall: number;
  gbps_gpu: number | null;
  /** Best sync batch (GB/s, timestamps when granted): the yardstick, least hurt by a busy host. */
  gbps_best: number;
  /** The yardstick used for ratios: gbps_best. */
  gbps: number;
}

/** The copy kernel: `iters` dispatches, `perSync` between syncs. */
export async function copyBench(
  gpu: GpuContext,
  maxBytes: number,
  iters: number,
  perSync: number,
): Promise<CopyResult> {
  const dev = gpu.device;
  const limit = Math.min(
    gpu.limits.maxStorageBufferBindingSize ?? 0,
    gpu.limits.maxBufferSize ?? 0,
    maxBytes,
  );
  const bytes = Math.floor(limit / 4096) * 4096;
  const wg = 256;
  const code = specialize(await Deno.readTextFile(new URL("./copy.wgsl", import.meta.url)), {
    WG: wg,
  });
  const pipeline = await getComputePipeline(gpu, `bench_copy:wg${wg}`, code);
  const src = dev.createBuffer({
    size: bytes,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
  });
  const dst = dev.createBuffer({
    size: bytes,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
  });
  const n = bytes / 16;
  const nwg = Math.min(gpu.limits.maxComputeWorkgroupsPerDimension ?? 65535, Math.ceil(n / wg));
  const uni = dev.createBuffer({
    size: 16,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  dev.queue.writeBuffer(uni, 0, new Uint32Array([n, nwg * wg, 0, 0]));
  const bind = dev.createBindGroup({
    layout: pipeline.getBindGroupLayout(0),
    entries: [
      { binding: 0, resource: { buffer: src } },
      { binding: 1, resource: { buffer: dst } },
      {
        binding: 2,
        resource: { buffer: uni },
      },
    ],
  });
  const ts = gpu.features.has("timestamp-query");
  const syncs = Math.ceil(iters / perSync);
  const qs = ts ? dev.createQuerySet({ type: "timestamp", count: 2 * syncs }) : null;
  const run = async (count: number, q: number | null) => {
    const enc = dev.createCommandEncoder();
    for (let i = 0; i < count; i++) {
      const tw: GPUComputePassTimestampWrites | undefined =
        qs && q !== null && (i === 0 || i === count - 1)
          ? {
            querySet: qs,
            ...(i === 0 ? { beginningOfPassWriteIndex: 2 * q } : {}),
            ...(i === count - 1 ? { endOfPassWriteIndex: 2 * q + 1 } : {}),
          }
          : undefined;
      const pass = enc.beginComputePass(tw ? { timestampWrites: tw } : {});
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, bind);
      pass.dispatchWorkgroups(nwg);
      pass.end();
    }
    dev.queue.submit([enc.finish()]);
    await dev.queue.onSubmittedWorkDone();
  };
  await run(2, null); // warm-up
  let done = 0;
  const counts: number[] = [], walls: number[] = [];
  const t0 = performance.now();
  for (let s = 0; s < syncs; s++) {
    const c = Math.min(perSync, iters - done);
    const ts0 = performance.now();
    await run(c, s);
    walls.push(performance.now() - ts0);
    counts.push(c);
    done += c;
  }
  const wall_ms = performance.now() - t0;
  let gpu_ms: number | null = null;
  const batchRates = walls.map((w, i) => 2 * bytes * counts[i] / w / 1e6);
  if (qs) {
    const res = dev.createBuffer({
      size: 16 * syncs,
      usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
    });
    const rb = dev.createBuffer({
      size: 16 * syncs,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
    const enc = dev.createCommandEncoder();
    enc.resolveQuerySet(qs, 0, 2 * syncs, res, 0);
    enc.copyBufferToBuffer(res, 0, rb, 0, 16 * syncs);
    dev.queue.submit([enc.finish()]);
    await rb.mapAsync(GPUMapMode.READ);
    const t = new BigUint64Array(rb.getMappedRange().slice(0));
    rb.unmap();
    let ns = 0;
    const perBatch: number[] = [];
    for (let s = 0; s < syncs; s++) {
      const d = Number(t[2 * s + 1] - t[2 * s]);
      ns += d;
      perBatch.push(d > 0 ? 2 * bytes * counts[s] / (d / 1e6) / 1e6 : 0);
    }
    gpu_ms = ns > 0 ? ns / 1e6 : null; // zeros: timestamps not really supported
    if (gpu_ms !== null) batchRates.splice(0, batchRates.length, ...perBatch);
    res.destroy();
    rb.destroy();
    qs.destroy();
  }
  for (const b of [src, dst, uni]) b.destroy();
  const moved = 2 * bytes * iters;
  const gbps_wall = moved / wall_ms / 1e6;
  const gbps_gpu = gpu_ms ? moved / gpu_ms / 1e6 : null;
  return {
    bytes,
    dispatches: iters,
    wall_ms,
    gpu_ms,
    gbps_wall,
    gbps_gpu,
    gbps_best: Math.max(...batchRates),
    gbps: Math.max(...batchRates),
  };
}
