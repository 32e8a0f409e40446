/**
 * Runs a raw compute pipeline once over one fresh storage buffer and reads it back: for tests
 * that check a runtime or a WGSL snippet below the launch path (gpu/launch.ts), on a device of
 * their own. No side effects on import.
 * @module
 */

/** The word a buffer holds before the dispatch: an element the kernel never writes reads it. */
export const DISPATCH_POISON = 0xffffffff;

/**
 * Dispatches `pipeline` (`workgroups` workgroups) with a fresh storage buffer of `bytes` (a
 * multiple of 4) at binding 0 of group 0, every word {@link DISPATCH_POISON} before the
 * dispatch (a NaN as f32 and as f16, not a zero a test might expect), and returns that
 * buffer's bytes; both buffers are destroyed.
 */
export async function dispatchIntoBuffer(
  dev: GPUDevice,
  pipeline: GPUComputePipeline,
  bytes: number,
  workgroups = 1,
): Promise<ArrayBuffer> {
  const out = dev.createBuffer({
    size: bytes,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
  });
  const read = dev.createBuffer({
    size: bytes,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  try {
    dev.queue.writeBuffer(out, 0, new Uint32Array(bytes / 4).fill(DISPATCH_POISON));
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
