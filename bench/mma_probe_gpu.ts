/**
 * GPU helpers of the subgroup-matrix ceiling probe (bench/mma_ceiling.ts): compiling a probe's
 * shader and timing its dispatch by timestamp queries.
 * @module
 */

/** Sorted ms of `n` timestamped passes after `warm` untimed ones. */
export async function passTimes(
  dev: GPUDevice,
  pipe: GPUComputePipeline,
  bg: GPUBindGroup,
  grid: [number, number],
  n: number,
  warm: number,
): Promise<number[]> {
  const qs = dev.createQuerySet({ type: "timestamp", count: 2 * n });
  const resolve = dev.createBuffer({
    size: 16 * n,
    usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
  });
  const read = dev.createBuffer({
    size: 16 * n,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const e = dev.createCommandEncoder();
  for (let i = -warm; i < n; i++) {
    const ps = e.beginComputePass(
      i < 0 ? {} : {
        timestampWrites: {
          querySet: qs,
          beginningOfPassWriteIndex: 2 * i,
          endOfPassWriteIndex: 2 * i + 1,
        },
      },
    );
    ps.setPipeline(pipe);
    ps.setBindGroup(0, bg);
    ps.dispatchWorkgroups(grid[0], grid[1]);
    ps.end();
  }
  e.resolveQuerySet(qs, 0, 2 * n, resolve, 0);
  e.copyBufferToBuffer(resolve, 0, read, 0, 16 * n);
  dev.queue.submit([e.finish()]);
  await read.mapAsync(GPUMapMode.READ);
  const t = new BigUint64Array(read.getMappedRange().slice(0));
  read.unmap();
  resolve.destroy();
  read.destroy();
  qs.destroy();
  return Array.from({ length: n }, (_, i) => Number(t[2 * i + 1] - t[2 * i]) / 1e6)
    .sort((x, y) => x - y);
}

/** Compiles `code`, or throws the first compilation error. */
export async function compile(dev: GPUDevice, code: string, layout: GPUBindGroupLayout) {
  const module = dev.createShaderModule({ code });
  const info = await module.getCompilationInfo();
  const err = info.messages.find((m) => m.type === "error");
  if (err) throw new Error(`line ${err.lineNum}: ${err.message}`);
  return await dev.createComputePipelineAsync({
    layout: dev.createPipelineLayout({ bindGroupLayouts: [layout] }),
    compute: { module, entryPoint: "main" },
  });
}
