/**
 * WGSL dialect differences between the runtimes, smoothed over in the device layer.
 *
 * Subgroup builtins: the WGSL spec (and Dawn's Tint) require `enable subgroups;` before a
 * module uses them, while Deno's naga rejects that directive ("the `subgroups`
 * enable-extension is not yet supported"), so the kernels never write it (gpu/wgsl.ts).
 * {@link enableSubgroups} adds it to a module that calls a subgroup builtin, on line 1
 * ahead of the original text so compiler line numbers stay the same; {@link requireEnables}
 * installs that on a device's `createShaderModule` (Dawn's devices, when `subgroups` is
 * granted).
 * @module
 */

/** A call of a subgroup or quad builtin, or a subgroup builtin value. */
const USES_SUBGROUPS =
  /\b(subgroup[A-Z]\w*|quad(Broadcast|Swap[A-Z]\w*))\s*\(|\bsubgroup_(invocation_id|size)\b/;
/** An `enable` directive naming `subgroups`. */
const ENABLES_SUBGROUPS = /\benable\s+[^;]*\bsubgroups\b[^;]*;/;

/** `code` with `enable subgroups;` in front when it uses subgroups and does not enable them. */
export function enableSubgroups(code: string): string {
  if (!USES_SUBGROUPS.test(code) || ENABLES_SUBGROUPS.test(code)) return code;
  return `enable subgroups; ${code}`;
}

const INSTALLED = Symbol.for("attn.requireEnables");

/**
 * Makes `device.createShaderModule` add `enable subgroups;` where a module needs it (when the
 * device has `subgroups`). Idempotent.
 */
export function requireEnables(device: GPUDevice): void {
  const d = device as GPUDevice & { [INSTALLED]?: true };
  if (d[INSTALLED] || !device.features.has("subgroups")) return;
  const create = device.createShaderModule;
  Object.defineProperty(device, "createShaderModule", {
    configurable: true,
    value: function (this: GPUDevice, desc: GPUShaderModuleDescriptor): GPUShaderModule {
      return create.call(this, { ...desc, code: enableSubgroups(desc.code) });
    },
  });
  d[INSTALLED] = true;
}
