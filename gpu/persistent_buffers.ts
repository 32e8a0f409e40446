/**
 * Storage buffers a device keeps across calls, for kernels whose scratch must be in a known
 * state when a dispatch starts: the fused decode reduce's partials and counters, all zero
 * between its dispatches (wgsl/decode_fused.wgsl restores the zeros it consumed). Pooled
 * scratch (gpu/buffer_pool.ts) holds whatever its last user left, so these never come from the
 * pool: one buffer per device and name (copyable: the bench reads and zeroes the residency
 * probe's counters, gpu/decode_residency.ts), created by WebGPU zero-filled, replaced by a larger
 * (again zero) one when a call needs more. A replaced buffer is dropped, not destroyed: a call
 * bound to it may not have been submitted yet.
 * @module
 */
import type { GpuContext } from "../core/types.ts";

const buffers = new WeakMap<GPUDevice, Map<string, GPUBuffer>>();

/** The device's buffer `name`, of at least `bytes` bytes (zero when created). */
export function persistentBuffer(ctx: GpuContext, name: string, bytes: number): GPUBuffer {
  let m = buffers.get(ctx.device);
  if (!m) buffers.set(ctx.device, m = new Map());
  const have = m.get(name);
  const need = Math.max(256, Math.ceil(bytes / 256) * 256);
  if (have && have.size >= need) return have;
  const limit = Math.min(
    ctx.limits.maxStorageBufferBindingSize ?? 2 ** 27,
    ctx.limits.maxBufferSize ?? 2 ** 28,
  );
  // Grow geometrically (few replacements), never past one binding.
  const size = Math.max(need, Math.min(limit - (limit % 256), 2 * (have?.size ?? 0)));
  const buf = ctx.device.createBuffer({
    label: name,
    size,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
  });
  m.set(name, buf);
  return buf;
}
