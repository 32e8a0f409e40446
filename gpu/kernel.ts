/**
 * Kernels as data (after onnxruntime's WebGPU provider): one {@link KernelDef} per kernel lists
 * its uniforms and its bindings and says how to generate its WGSL for a set of compile-time
 * values. From that one entry:
 * - the pipeline key is derived (`name(k=v,...)`, every compile-time value, sorted);
 * - the WGSL header (the `Params` uniform struct, padded to 16 bytes, and every binding
 *   declaration) is emitted, and the uniform bytes are packed, from the same lists;
 * - source is generated only on a cache miss, and compiled once per device;
 * - the bind-group layout is explicit (not "auto"), so a binding a variant leaves unused still
 *   binds.
 * {@link launch}-side code (gpu/launch.ts) binds by the def's binding names.
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import { compilePipeline } from "./pipelines.ts";

/** A compile-time value. */
export type ConstValue = string | number | boolean;
/** The compile-time values of one variant. */
export type KernelConsts = Record<string, ConstValue>;

/** A uniform field's WGSL type. */
export type UniformType = "u32" | "i32" | "f32";

/** One binding: `uniform` is the Params block; storage bindings are read-only or read_write. */
export interface BindingDecl {
  name: string;
  kind: "uniform" | "read" | "read_write";
  /** WGSL type of a storage binding, e.g. `array<u32>` (ignored for `uniform`). */
  type?: string;
}

/** One kernel, as data. */
export interface KernelDef<C extends KernelConsts = KernelConsts> {
  /** Short name, the key's prefix. */
  readonly name: string;
  /** The Params fields, in struct order. */
  readonly uniforms: readonly (readonly [string, UniformType])[];
  /** The bindings, in binding order (binding i = entry i), for a variant. */
  bindings(c: C): readonly BindingDecl[];
  /** The WGSL after the generated header (enables go in `enables`). Called on a miss only. */
  source(c: C): string | Promise<string>;
  /** `enable` directives the variant needs (e.g. `f16`). */
  enables?(c: C): string[];
}

/** A compiled variant. */
export interface CompiledKernel {
  readonly key: string;
  readonly pipeline: GPUComputePipeline;
  readonly layout: GPUBindGroupLayout;
  readonly bindings: readonly BindingDecl[];
  readonly def: KernelDef<never>;
}

/** The pipeline key of a variant: the name and every compile-time value, sorted by name. */
export function kernelKey(name: string, c: KernelConsts): string {
  const parts = Object.keys(c).sort().map((k) => `${k}=${c[k]}`);
  return `${name}(${parts.join(",")})`;
}

/** The WGSL `struct Params` of a uniform list, padded to a multiple of 16 bytes. */
export function paramsStruct(uniforms: readonly (readonly [string, UniformType])[]): string {
  if (uniforms.length === 0) return "";
  const fields = uniforms.map(([n, t]) => `  ${n}: ${t},`);
  for (let i = uniforms.length; i % 4 !== 0; i++) fields.push(`  _pad${i}: u32,`);
  return `struct Params {\n${fields.join("\n")}\n}\n`;
}

/** The binding declarations (group 0); the uniform binding is named by the decl (usually P). */
export function bindingDecls(bindings: readonly BindingDecl[]): string {
  return bindings.map((b, i) =>
    b.kind === "uniform"
      ? `@group(0) @binding(${i}) var<uniform> ${b.name}: Params;`
      : `@group(0) @binding(${i}) var<storage, ${b.kind}> ${b.name}: ${b.type};`
  ).join("\n") + "\n";
}

/**
 * Packs uniform values in the def's field order (4 bytes each, padded to 16).
 * @throws Error naming a missing or unknown field.
 */
export function packUniforms(
  def: Pick<KernelDef<never>, "name" | "uniforms">,
  values: Record<string, number>,
): Uint8Array<ArrayBuffer> {
  const n = Math.max(4, Math.ceil(def.uniforms.length / 4) * 4);
  const buf = new ArrayBuffer(n * 4);
  const dv = new DataView(buf);
  const known = new Set<string>();
  def.uniforms.forEach(([name, type], i) => {
    known.add(name);
    const v = values[name];
    if (v === undefined) throw new Error(`${def.name}: uniform ${name} has no value`);
    if (type === "f32") dv.setFloat32(4 * i, v, true);
    else if (type === "i32") dv.setInt32(4 * i, v, true);
    else dv.setUint32(4 * i, v >>> 0, true);
  });
  for (const k of Object.keys(values)) {
    if (!known.has(k)) throw new Error(`${def.name}: unknown uniform ${k}`);
  }
  return new Uint8Array(buf);
}

function layoutEntry(b: BindingDecl, i: number): GPUBindGroupLayoutEntry {
  const type: GPUBufferBindingType = b.kind === "uniform"
    ? "uniform"
    : b.kind === "read"
    ? "read-only-storage"
    : "storage";
  return { binding: i, visibility: GPUShaderStage.COMPUTE, buffer: { type } };
}

interface Entry {
  promise: Promise<CompiledKernel>;
}

const enableProbes = new WeakMap<GPUDevice, Map<string, Promise<boolean>>>();

/**
 * Whether the device's WGSL compiler takes `enable EXT;`. Dawn requires `enable subgroups;`
 * before subgroup builtins; Deno's naga rejects that directive yet runs the builtins once the
 * feature was granted. Probed once per device and extension.
 */
export function acceptsEnable(ctx: GpuContext, ext: string): Promise<boolean> {
  let m = enableProbes.get(ctx.device);
  if (!m) enableProbes.set(ctx.device, m = new Map());
  let p = m.get(ext);
  if (!p) {
    p = (async () => {
      const dev = ctx.device;
      dev.pushErrorScope("validation");
      const mod = dev.createShaderModule({
        label: `probe enable ${ext}`,
        code: `enable ${ext};\n@compute @workgroup_size(1) fn main() {}\n`,
      });
      let ok = true;
      try {
        const info = await mod.getCompilationInfo();
        if (info.messages.some((x) => x.type === "error")) ok = false;
      } catch { /* no compilation info: the scope decides */ }
      if (await dev.popErrorScope()) ok = false;
      return ok;
    })();
    m.set(ext, p);
  }
  return p;
}
const kernels = new WeakMap<GPUDevice, Map<string, Entry>>();

/**
 * The compiled variant `c` of `def` on `ctx`'s device. The key is looked up first; the source
 * is generated and compiled only on a miss, once even under concurrent calls.
 * @throws ShaderCompileError with the compiler's messages.
 */
export function getKernel<C extends KernelConsts>(
  ctx: GpuContext,
  def: KernelDef<C>,
  c: C,
): Promise<CompiledKernel> {
  let m = kernels.get(ctx.device);
  if (!m) kernels.set(ctx.device, m = new Map());
  const key = kernelKey(def.name, c);
  const hit = m.get(key);
  if (hit) return hit.promise;
  const promise = (async () => {
    const bindings = def.bindings(c);
    const enables: string[] = [];
    for (const e of def.enables?.(c) ?? []) if (await acceptsEnable(ctx, e)) enables.push(e);
    const code = `${enables.map((e) => `enable ${e};`).join("\n")}\n${paramsStruct(def.uniforms)}${
      bindingDecls(bindings)
    }\n${await def.source(c)}`;
    const layout = ctx.device.createBindGroupLayout({
      label: key,
      entries: bindings.map(layoutEntry),
    });
    const pipeline = await compilePipeline(ctx, key, code, layout);
    return { key, pipeline, layout, bindings, def: def as unknown as KernelDef<never> };
  })();
  m.set(key, { promise });
  promise.catch(() => {
    if (m.get(key)?.promise === promise) m.delete(key);
  });
  return promise;
}

/** Keys of the variants compiled (or compiling) on `ctx`'s device, sorted. */
export function compiledKernelKeys(ctx: GpuContext): string[] {
  return [...(kernels.get(ctx.device)?.keys() ?? [])].sort();
}
