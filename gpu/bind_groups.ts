/**
 * Bind groups cached by what they bind (a per-device cache, used by gpu/launch.ts). A bind
 * group is immutable: the same layout over the same buffer ranges is the same group, so a call
 * whose buffers are the ones an earlier call used (pooled buffers come back in steady state,
 * a cache's chunks and a plan's table are stable) reuses that call's group instead of creating
 * one (about 26 us per group on Dawn over lavapipe). The key names every entry's buffer by an
 * id given on first sight, with its offset and size. A destroyed buffer is never bound again
 * (the pool hands out only live buffers), so groups naming it are never asked for; they go
 * with the least recently used ones once a layout holds more than {@link BIND_GROUP_LIMIT}.
 * @module
 */

/** Most groups kept per bind-group layout (least recently used dropped first). */
export const BIND_GROUP_LIMIT = 64;

/** Counters of one device's cache (tests and the profile). */
export interface BindGroupStats {
  created: number;
  reused: number;
}

const ids = new WeakMap<GPUBuffer, number>();
let nextId = 1;

function idOf(b: GPUBuffer): number {
  let id = ids.get(b);
  if (id === undefined) ids.set(b, id = nextId++);
  return id;
}

/** The bind groups of one device. */
export class BindGroupCache {
  readonly device: GPUDevice;
  #byLayout = new WeakMap<GPUBindGroupLayout, Map<string, GPUBindGroup>>();
  #created = 0;
  #reused = 0;

  constructor(device: GPUDevice) {
    this.device = device;
  }

  /** The group of `layout` over `entries` (buffer bindings), created on the first request. */
  get(
    layout: GPUBindGroupLayout,
    entries: { binding: number; resource: GPUBufferBinding }[],
    label: string,
  ): GPUBindGroup {
    let m = this.#byLayout.get(layout);
    if (!m) this.#byLayout.set(layout, m = new Map());
    let key = "";
    for (const e of entries) {
      const r = e.resource;
      key += `${e.binding}:${idOf(r.buffer)}:${r.offset ?? 0}:${r.size ?? -1};`;
    }
    const hit = m.get(key);
    if (hit) {
      this.#reused++;
      m.delete(key); // most recently used goes last
      m.set(key, hit);
      return hit;
    }
    const g = this.device.createBindGroup({ label, layout, entries });
    this.#created++;
    m.set(key, g);
    if (m.size > BIND_GROUP_LIMIT) m.delete(m.keys().next().value!);
    return g;
  }

  stats(): BindGroupStats {
    return { created: this.#created, reused: this.#reused };
  }
}

const caches = new WeakMap<GPUDevice, BindGroupCache>();

/** The bind-group cache of `device`. */
export function bindGroupsOf(device: GPUDevice): BindGroupCache {
  let c = caches.get(device);
  if (!c) caches.set(device, c = new BindGroupCache(device));
  return c;
}
