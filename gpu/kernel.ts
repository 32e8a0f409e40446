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
import { envInt, type EnvSetting, readSetting } from "../core/env.ts";
import { compilePipeline } from "./pipelines.ts";
import { inErrorScopes } from "./error_scopes.ts";

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

/** Each def's uniform fields: index and type by name (built once per def). */
const fieldMaps = new WeakMap<object, Map<string, [number, UniformType]>>();
function fieldsOf(def: Pick<KernelDef<never>, "uniforms">): Map<string, [number, UniformType]> {
  let m = fieldMaps.get(def);
  if (!m) {
    fieldMaps.set(def, m = new Map(def.uniforms.map(([n, t], i) => [n, [i, t]])));
  }
  return m;
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
  const u = new Uint32Array(n), f = new Float32Array(u.buffer), fields = fieldsOf(def);
  let given = 0;
  for (const k in values) {
    const field = fields.get(k);
    if (!field) throw new Error(`${def.name}: unknown uniform ${k}`);
    const v = values[k];
    if (v === undefined) continue;
    given++;
    if (field[1] === "f32") f[field[0]] = v;
    else u[field[0]] = field[1] === "i32" ? v | 0 : v >>> 0;
  }
  if (given !== def.uniforms.length) {
    const missing = def.uniforms.find(([name]) => values[name] === undefined)!;
    throw new Error(`${def.name}: uniform ${missing[0]} has no value`);
  }
  return new Uint8Array(u.buffer);
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
  /** The kernel, once compiled. */
  done?: CompiledKernel;
  /** The lookup clock when last found (least recently used first out). */
  used: number;
}

/**
 * `ATTN_KERNEL_CACHE_LIMIT`: an integer >= 1, default 256 (see {@link kernelCacheLimit}).
 */
export const KERNEL_CACHE_LIMIT_SETTING: EnvSetting<number> = {
  name: "ATTN_KERNEL_CACHE_LIMIT",
  unset: 256,
  parse: (text) => envInt("ATTN_KERNEL_CACHE_LIMIT", text, 1),
};

/**
 * Most compiled variants kept per device (`ATTN_KERNEL_CACHE_LIMIT`, default 256). Each holds
 * the driver's compiled code: ~2.4 MB a pipeline on lavapipe, where a soak over every cache
 * setting grew the server to 1.8 GB of them. Past the limit the least recently used compiled one
 * is dropped (a plan that holds it keeps it; a later call compiles it again). Read at each new
 * variant: a bad value fails that {@link getKernel} with an EnvValueError naming it (the server
 * refuses it at start-up, server/serve_env.ts).
 */
export function kernelCacheLimit(): number {
  return readSetting(KERNEL_CACHE_LIMIT_SETTING);
}

let clock = 0;

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
      const { value: mod, errors } = inErrorScopes(
        dev,
        ["validation"],
        () =>
          dev.createShaderModule({
            label: `probe enable ${ext}`,
            code: `enable ${ext};\n@compute @workgroup_size(1) fn main() {}\n`,
          }),
      );
      let ok = true;
      try {
        const info = await mod.getCompilationInfo();
        if (info.messages.some((x) => x.type === "error")) ok = false;
      } catch { /* no compilation info: the scope decides */ }
      if ((await errors)[0]) ok = false;
      return ok;
    })();
    m.set(ext, p);
  }
  return p;
}
const kernels = new WeakMap<GPUDevice, Map<string, Entry>>();
/**
 * The same entries by a key that is cheaper to build: the def's name and every value in the
 * order the call site wrote them (`k=v,`; a different order only misses here, then finds the
 * canonical key). A decode step plans every call: sorting the values per lookup cost
 * microseconds.
 */
const byOrder = new WeakMap<GPUDevice, Map<string, Entry>>();

function orderKey(name: string, c: KernelConsts): string {
  let k = name;
  for (const f in c) k += `,${f}=${c[f]}`;
  return k;
}

/**
 * The whole WGSL of variant `c` of `def`: `enables`, the Params struct, the binding
 * declarations and the kernel's source (what {@link getKernel} compiles).
 */
export async function kernelWgsl<C extends KernelConsts>(
  def: KernelDef<C>,
  c: C,
  enables: readonly string[],
): Promise<string> {
  const head = enables.map((e) => `enable ${e};`).join("\n");
  return `${head}\n${paramsStruct(def.uniforms)}${bindingDecls(def.bindings(c))}\n${await def
    .source(c)}`;
}

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
  return entryOf(ctx, def, c).promise;
}

/** The compiled variant when it was compiled already (no await), else null. */
export function compiledKernel<C extends KernelConsts>(
  ctx: GpuContext,
  def: KernelDef<C>,
  c: C,
): CompiledKernel | null {
  return entryOf(ctx, def, c).done ?? null;
}

function entryOf<C extends KernelConsts>(ctx: GpuContext, def: KernelDef<C>, c: C): Entry {
  let fast = byOrder.get(ctx.device);
  if (!fast) byOrder.set(ctx.device, fast = new Map());
  const quick = orderKey(def.name, c);
  const known = fast.get(quick);
  if (known) {
    known.used = ++clock;
    return known;
  }
  let m = kernels.get(ctx.device);
  if (!m) kernels.set(ctx.device, m = new Map());
  const key = kernelKey(def.name, c);
  const hit = m.get(key);
  if (hit) {
    hit.used = ++clock;
    fast.set(quick, hit);
    return hit;
  }
  evictBeyond(m, fast, kernelCacheLimit() - 1);
  const promise = (async () => {
    const bindings = def.bindings(c);
    const enables: string[] = [];
    for (const e of def.enables?.(c) ?? []) if (await acceptsEnable(ctx, e)) enables.push(e);
    const code = await kernelWgsl(def, c, enables);
    const layout = ctx.device.createBindGroupLayout({
      label: key,
      entries: bindings.map(layoutEntry),
    });
    const pipeline = await compilePipeline(ctx, key, code, layout);
    return { key, pipeline, layout, bindings, def: def as unknown as KernelDef<never> };
  })();
  const entry: Entry = { promise, used: ++clock };
  m.set(key, entry);
  fast.set(quick, entry);
  promise.then((k) => {
    entry.done = k;
  }, () => {
    if (m.get(key) === entry) m.delete(key);
    for (const [q, e] of fast) if (e === entry) fast.delete(q);
  });
  return entry;
}

/** Drops the least recently used compiled entries until at most `keep` remain (compiling ones stay). */
function evictBeyond(m: Map<string, Entry>, fast: Map<string, Entry>, keep: number): void {
  if (m.size <= keep) return;
  const done = [...m].filter(([, e]) => e.done).sort((a, b) => a[1].used - b[1].used);
  for (const [key, e] of done.slice(0, m.size - keep)) {
    m.delete(key);
    for (const [q, f] of fast) if (f === e) fast.delete(q);
  }
}

/** Keys of the variants compiled (or compiling) on `ctx`'s device, sorted. */
export function compiledKernelKeys(ctx: GpuContext): string[] {
  return [...(kernels.get(ctx.device)?.keys() ?? [])].sort();
}
