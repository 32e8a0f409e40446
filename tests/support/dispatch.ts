/**
 * Runs a raw compute pipeline once over one fresh storage buffer and reads it back: for tests
 * that check a runtime or a WGSL snippet below the launch path (gpu/launch.ts), on a device of
 * their own. No side effects on import.
 * @module
 */

/**
 * Dispatches `pipeline` (`workgroups` workgroups) with a fresh zeroed storage buffer of
 * `bytes` at binding 0 of group 0, and returns that buffer's bytes; both buffers are destroyed.
 */
export async function dispatchIntoBuffer(
  dev: GPUDevice,
  pipeline: GPUComputePipeline,
  bytes: number,
  workgroups = 1,
): Promise<ArrayBuffer> {
  const out = dev.createBuffer({
    size: bytes,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
  });
  const read = dev.createBuffer({
    size: bytes,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  try {
    const enc = dev.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(
      0,
      dev.createBindGroup({
        layout: pipeline.getBindGroupLayout(0),
        entries: [{ binding: 0, resource: { buffer: out } }],
      }),
    );
    pass.dispatchWorkgroups(workgroups);
    pass.end();
    enc.copyBufferToBuffer(out, 0, read, 0, bytes);
    dev.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    const got = read.getMappedRange().slice(0);
    read.unmap();
    return got;
  } finally {
    out.destroy();
    read.destroy();
  }
}
