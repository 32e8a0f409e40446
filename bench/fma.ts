/**
 * The compute yardstick of the benchmark: bench/fma.wgsl (32 independent f32 FMA chains per
 * invocation) over enough workgroups to fill the adapter, grown until one dispatch runs for
 * at least `targetMs`, then timed over `reps` dispatches in one submit (timestamp-query when
 * granted, else the wall clock). Reports TFLOP/s counting an FMA as two FLOPs: the f32 FMA
 * ceiling of WGSL on this adapter and runtime, measured in the same run as the kernels.
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import { getComputePipeline } from "../gpu/pipelines.ts";
import { specialize } from "../gpu/wgsl.ts";

/** What the FMA kernel measured. */
export interface FmaResult {
  workgroups: number;
  wg: number;
  iters: number;
  reps: number;
  ms: number;
  timed_by: "timestamp-query" | "wall-clock";
  tflops: number;
}

const UNROLL = 8;
const CHAINS = 8;

/**
 * Another loop body for the same frame (bench/cvt_probe.ts): `step(c)` is the code of chain c
 * in one unrolled step, one vec4 FMA of `x{c}` among whatever else it adds.
 */
export interface FmaVariant {
  name: string;
  step: (c: number) => string;
  /** `enable f16;` first (needs shader-f16). */
  f16?: boolean;
}

/** Runs the FMA ceiling kernel (see the module doc). */
export async function fmaBench(
  gpu: GpuContext,
  targetMs: number,
  reps: number,
  variant?: FmaVariant,
): Promise<FmaResult> {
  const dev = gpu.device;
  const wg = 256;
  const step = variant?.step ?? ((c: number) => `    x${c} = fma(x${c}, a, b);`);
  const body = Array.from(
    { length: UNROLL },
    () => Array.from({ length: CHAINS }, (_, c) => step(c)).join("\n"),
  ).join("\n");
  const code = (variant?.f16 ? "enable f16;\n" : "") +
    specialize(await Deno.readTextFile(new URL("./fma.wgsl", import.meta.url)), {
      WG: wg,
      BODY: body,
    });
  const pipeline = await getComputePipeline(gpu, `bench_fma:wg${wg}:${variant?.name ?? ""}`, code);
  const maxWg = gpu.limits.maxComputeWorkgroupsPerDimension ?? 65535;
  const workgroups = Math.min(maxWg, 4096);
  const dst = dev.createBuffer({ size: workgroups * wg * 16, usage: GPUBufferUsage.STORAGE });
  const uni = dev.createBuffer({
    size: 16,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  const bind = dev.createBindGroup({
    layout: pipeline.getBindGroupLayout(0),
    entries: [{ binding: 0, resource: { buffer: dst } }, { binding: 1, resource: { buffer: uni } }],
  });
  const ts = gpu.features.has("timestamp-query");
  const run = async (iters: number, n: number, nwg: number): Promise<number> => {
    dev.queue.writeBuffer(uni, 0, new Float32Array([0, 0.999, 1e-4, 0]));
    dev.queue.writeBuffer(uni, 0, new Uint32Array([iters]));
    const qs = ts ? dev.createQuerySet({ type: "timestamp", count: 2 }) : null;
    const enc = dev.createCommandEncoder();
    for (let i = 0; i < n; i++) {
      const tw: GPUComputePassTimestampWrites | undefined = qs && (i === 0 || i === n - 1)
        ? {
          querySet: qs,
          ...(i === 0 ? { beginningOfPassWriteIndex: 0 } : {}),
          ...(i === n - 1 ? { endOfPassWriteIndex: 1 } : {}),
        }
        : undefined;
      const pass = enc.beginComputePass(tw ? { timestampWrites: tw } : {});
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, bind);
      pass.dispatchWorkgroups(nwg);
      pass.end();
    }
    let rb: GPUBuffer | null = null;
    if (qs) {
      const res = dev.createBuffer({
        size: 16,
        usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
      });
      rb = dev.createBuffer({ size: 16, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      enc.resolveQuerySet(qs, 0, 2, res, 0);
      enc.copyBufferToBuffer(res, 0, rb, 0, 16);
    }
    const t0 = performance.now();
    dev.queue.submit([enc.finish()]);
    await dev.queue.onSubmittedWorkDone();
    const wall = performance.now() - t0;
    if (!rb) return wall;
    await rb.mapAsync(GPUMapMode.READ);
    const t = new BigUint64Array(rb.getMappedRange().slice(0));
    rb.destroy();
    qs!.destroy();
    const ns = Number(t[1] - t[0]);
    return ns > 0 ? ns / 1e6 : wall;
  };
  // Grow the work per dispatch until one dispatch lasts targetMs (workgroups first, then
  // iterations), so launch overheads do not count.
  // All workgroups from the start (64 of them left most of an H200 idle and its clocks low:
  // 10 TFLOP/s measured against 65), one untimed run first (compilation, clock ramp).
  let iters = 16;
  const nwg = workgroups;
  await run(iters, 1, nwg);
  let ms = await run(iters, 1, nwg);
  for (let k = 0; k < 24 && ms < targetMs; k++) {
    iters = Math.ceil(iters * Math.min(8, Math.max(2, targetMs / Math.max(ms, 1e-3))));
    ms = await run(iters, 1, nwg);
  }
  ms = await run(iters, reps, nwg);
  dst.destroy();
  uni.destroy();
  const flops = 2 * 4 * CHAINS * UNROLL * iters * nwg * wg * reps;
  return {
    workgroups: nwg,
    wg,
    iters,
    reps,
    ms,
    timed_by: ts ? "timestamp-query" : "wall-clock",
    tflops: flops / ms / 1e9,
  };
}
