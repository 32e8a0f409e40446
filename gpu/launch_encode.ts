/**
 * What a launch (gpu/launch.ts) records into its command encoder: the bind-group entries of a
 * dispatch, the uploads (by `writeBuffer`, or through mapped staging buffers), the compute
 * passes with their timestamp writes, and the device times read from those timestamps.
 * @module
 */
import type { BindGroupCache } from "./bind_groups.ts";
import type { KernelCall, LaunchSpec } from "./launch_types.ts";

/** The bind-group entries of a call, in the kernel's binding order. */
export function entries(call: KernelCall): { binding: number; resource: GPUBufferBinding }[] {
  return call.kernel.bindings.map((b, i) => {
    const r = call.bind[b.name];
    if (!r) throw new Error(`${call.kernel.key}: binding ${b.name} has no buffer`);
    return { binding: i, resource: "size" in r && "usage" in r ? { buffer: r } : r };
  });
}

/** A large upload written into a mapped staging buffer, copied by the call's encoder. */
interface Staged {
  from: GPUBuffer;
  to: GPUBuffer;
  offset: number;
  bytes: number;
}

/**
 * Writes the uploads: those `staged` says (in order, with the mapped buffers `froms`) into
 * their staging buffer, which is unmapped for the encoder's copy; the rest by `writeBuffer`.
 */
export function writeUploads(
  dev: GPUDevice,
  uploads: LaunchSpec["uploads"],
  staged: (u: LaunchSpec["uploads"][number]) => boolean,
  froms: GPUBuffer[],
): Staged[] {
  const out: Staged[] = [];
  for (const u of uploads) {
    const n = u.data.byteLength;
    if (n === 0) continue;
    if (staged(u)) {
      const from = froms[out.length];
      new Uint8Array(from.getMappedRange(0, n)).set(u.data);
      from.unmap();
      out.push({ from, to: u.buffer, offset: u.offset ?? 0, bytes: n });
    } else dev.queue.writeBuffer(u.buffer, u.offset ?? 0, u.data as Uint8Array<ArrayBuffer>);
  }
  return out;
}

/** Records `calls` in `passes` compute passes (one each, or one for all), timed into `qs`. */
export function recordCalls(
  enc: GPUCommandEncoder,
  calls: KernelCall[],
  passes: number,
  qs: GPUQuerySet | null,
  groups: BindGroupCache,
  label: string,
): void {
  const dispatch = (pass: GPUComputePassEncoder, c: KernelCall) => {
    pass.setPipeline(c.kernel.pipeline);
    pass.setBindGroup(0, c.group ?? groups.get(c.kernel.layout, entries(c), c.name));
    if (c.indirect) pass.dispatchWorkgroupsIndirect(c.indirect.buffer, c.indirect.offset);
    else if (c.grid[0] * c.grid[1] > 0) pass.dispatchWorkgroups(c.grid[0], c.grid[1]);
  };
  const begin = (i: number, name: string) =>
    enc.beginComputePass({
      label: name,
      ...(qs
        ? {
          timestampWrites: {
            querySet: qs,
            beginningOfPassWriteIndex: 2 * i,
            endOfPassWriteIndex: 2 * i + 1,
          },
        }
        : {}),
    });
  if (passes === 1 && calls.length > 1) {
    const pass = begin(0, label);
    for (const c of calls) dispatch(pass, c);
    pass.end();
    return;
  }
  calls.forEach((c, i) => {
    const pass = begin(i, c.name);
    dispatch(pass, c);
    pass.end();
  });
}

/** Device milliseconds from the resolved timestamps: per call when each had a pass, and `gpu`. */
export function deviceTimes(
  t: BigUint64Array,
  calls: KernelCall[],
  passes: number,
): Record<string, number> {
  const gpu: Record<string, number> = {};
  if (passes === calls.length) {
    calls.forEach((c, i) => {
      if (t[2 * i] > 0n && t[2 * i + 1] >= t[2 * i]) {
        gpu[c.name] = (gpu[c.name] ?? 0) + Number(t[2 * i + 1] - t[2 * i]) / 1e6;
      }
    });
  }
  const last = 2 * passes - 1;
  if (t[0] > 0n && t[last] >= t[0]) gpu.gpu = Number(t[last] - t[0]) / 1e6;
  return gpu;
}
