/**
 * The tensor-core prefill kernel (wgsl/flash_mma.wgsl) as a kernel entry: FlashAttention-2
 * style varlen attention whose QK^T and PV run on f16 subgroup matrices with f32 accumulation
 * (Dawn's `chromium-experimental-subgroup-matrix`), over the paged cache or the call's own K/V.
 * The portable FLASH_ATTENTION entry's Params words (and three more: the tiles' strides, for the
 * run-time stride probe), tile table and binding names, so a plan binds it the same way; f16 and
 * bf16 data only (f32 data keeps the exact f32 path).
 * @module
 */
import { FLASH_ATTENTION } from "./flash_kernel.ts";
import type { AdapterInfoReport, GpuContext } from "../core/types.ts";
import { flashMmaSource } from "./flash_mma_codegen.ts";
import type { MmaConsts } from "./flash_mma_shape.ts";
import type { KernelDef } from "./kernel.ts";
import { kvBindingDecls } from "./wgsl.ts";

/** The WebGPU feature the kernel needs (with `shader-f16` and `subgroups`). */
export const MMA_FEATURE = "chromium-experimental-subgroup-matrix";

/**
 * The tensor-core prefill kernel, as data. Its Params are the portable kernel's and the
 * workgroup tiles' row strides (gpu/flash_mma_layout.ts `MmaLayout`; equal to the kernel's
 * KSTR, PSTR and SSTR): every `subgroupMatrixLoad` / `Store` on workgroup memory takes its
 * stride from them. With a constant stride there (and Dawn's robustness off, which otherwise
 * makes the stride a `select`), NVIDIA's driver 580.159 on the H200 computed wrong results
 * (zeros) for every staged shape; with run-time strides they are right (bench/NOTES.md v0.11).
 */
export const FLASH_MMA: KernelDef<MmaConsts> = {
  name: "flash_mma",
  uniforms: [...FLASH_ATTENTION.uniforms, ["kstr", "u32"], ["pstr", "u32"], ["sstr", "u32"]],
  bindings: (c) => [
    { name: "U", kind: "uniform" },
    { name: "q", kind: "read", type: "array<vec4<u32>>" },
    { name: "mdw", kind: "read", type: "array<u32>" },
    // ovec: the epilogue stores 8 output elements at once (16 bytes: D is a multiple of 16).
    { name: "out", kind: "read_write", type: c.ovec ? "array<vec4<u32>>" : "array<u32>" },
    { name: "lse", kind: "read_write", type: "array<u32>" },
    ...(c.enc
      ? [
        { name: "k_in", kind: "read" as const, type: "array<vec4<u32>>" },
        { name: "v_in", kind: "read" as const, type: "array<vec4<u32>>" },
      ]
      : kvBindingDecls(c.nchunk, "read", true).map((d) =>
        c.direct || c.mstage ? { ...d, type: "array<f16>" } : d
      )), // direct, mstage: f16 elements for subgroupMatrixLoad
  ],
  enables: () => ["f16", "subgroups", "chromium_experimental_subgroup_matrix"],
  source: flashMmaSource,
};

/** A device's f16 -> f32 subgroup-matrix dims (M x K times K x N) and its subgroup size. */
export interface MmaSupport {
  m: number;
  n: number;
  k: number;
  sg: number;
}

/**
 * What `ctx`'s device offers the kernel (gpu/device.ts requests the feature and reports Dawn's
 * configurations in `adapter_info`), or why it offers none, checked in this order: the feature
 * not granted, no f16 -> f32 configuration, no single subgroup size.
 */
export function mmaSupportOrWhy(ctx: GpuContext): MmaSupport | string {
  const info = ctx.adapter_info as AdapterInfoReport;
  if (!ctx.features.has(MMA_FEATURE)) return `feature ${MMA_FEATURE} not granted`;
  const c = info.subgroup_matrix_configs?.find((x) =>
    x.component_type === "f16" && x.result_component_type === "f32"
  );
  if (!c) return "no f16 -> f32 subgroup-matrix configuration";
  const sg = info.subgroup_min_size;
  if (!sg || sg !== info.subgroup_max_size) {
    return `subgroup size not fixed (min ${sg ?? "unknown"}, max ${
      info.subgroup_max_size ?? "unknown"
    })`;
  }
  return { m: c.m, n: c.n, k: c.k, sg };
}

/** What `ctx`'s device offers the kernel, or null ({@link mmaSupportOrWhy} says why). */
export function mmaSupportOf(ctx: GpuContext): MmaSupport | null {
  const s = mmaSupportOrWhy(ctx);
  return typeof s === "string" ? null : s;
}
