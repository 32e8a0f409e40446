/**
 * The portable prefill kernel (wgsl/flash_attention.wgsl) as a kernel entry: a FlashAttention-2
 * style varlen kernel over the paged cache, or over the call's own K/V for encoder types,
 * query read and output written in the data dtype, register-tiled (gpu/flash_codegen.ts) for
 * FMA throughput. Runs on any adapter (core WGSL, f32 arithmetic).
 * @module
 */
import type { DType, StorageDType } from "../core/types.ts";
import type { KernelDef } from "./kernel.ts";
import {
  decodeHelpers,
  elementsPerWord,
  kvAccessorFns,
  kvBindingDecls,
  loadWgsl,
  specialize,
  TANH_REL_FN,
} from "./wgsl.ts";
import { dataLoads, dataStores } from "./wgsl_data.ts";
import { generateFlash } from "./flash_codegen.ts";

/** Compile-time values of one variant. */
export interface FlashConsts {
  [k: string]: string | number | boolean;
  /** K/V element type: the cache's storage dtype, or the data dtype for encoder types. */
  kv: StorageDType;
  dtype: DType;
  /** K/V from the call (encoder types) instead of the cache. */
  enc: boolean;
  d: number;
  bs: number;
  nhd: boolean;
  nchunk: number;
  /** The register tile: threads along keys / rows, rows and keys per thread. */
  tx: number;
  ty: number;
  rm: number;
  rn: number;
  /** Soft cap and ALiBi compiled in. */
  cap: boolean;
  alibi: boolean;
  /** Unrolled score and PV loops (see gpu/flash_codegen.ts). */
  unroll: boolean;
}

const ENC_SOURCE = `fn kv_row(key: u32, h: u32, rbase: u32) -> vec2<u32> {
  return vec2<u32>(0u, ((rbase + key) * U.num_kv_heads + h) * V4R);
}
fn src_k(br: vec2<u32>, c: u32) -> vec4<u32> {
  return k_in[br.y + c];
}
fn src_v(br: vec2<u32>, c: u32) -> vec4<u32> {
  return v_in[br.y + c];
}
`;

const CACHE_SOURCE = `fn kv_row(key: u32, h: u32, rbase: u32) -> vec2<u32> {
  let block = mdw[U.off_bt + rbase + key / BS];
  let off = key % BS;
  if (NHD) {
    return vec2<u32>(block, (off * U.num_kv_heads + h) * WPR);
  }
  return vec2<u32>(block, (h * BS + off) * WPR);
}
fn src_k(br: vec2<u32>, c: u32) -> vec4<u32> {
  return load_k4(br.x, br.y + 4u * c);
}
fn src_v(br: vec2<u32>, c: u32) -> vec4<u32> {
  return load_v4(br.x, br.y + 4u * c);
}
`;

/** The portable flash kernel, as data. */
export const FLASH_ATTENTION: KernelDef<FlashConsts> = {
  name: "flash",
  uniforms: [
    ["num_tiles", "u32"],
    ["num_heads", "u32"],
    ["num_kv_heads", "u32"],
    ["group", "u32"],
    ["num_tokens", "u32"],
    ["nwg_x", "u32"],
    ["causal", "u32"],
    ["window", "u32"],
    ["softcap", "f32"],
    ["scale_qk", "f32"],
    ["v_scale", "f32"],
    ["flags", "u32"],
    ["off_reqs", "u32"],
    ["off_bt", "u32"],
    ["off_alibi", "u32"],
    ["off_sinks", "u32"],
    ["block_words", "u32"],
    ["blocks_per_chunk", "u32"],
  ],
  bindings: (c) => [
    { name: "U", kind: "uniform" },
    { name: "q", kind: "read", type: dataLoads("q", c.dtype, 4).type },
    { name: "mdw", kind: "read", type: "array<u32>" },
    { name: "out", kind: "read_write", type: dataStores("out", c.dtype).type },
    { name: "lse", kind: "read_write", type: "array<f32>" },
    ...(c.enc
      ? [
        { name: "k_in", kind: "read" as const, type: "array<vec4<u32>>" },
        { name: "v_in", kind: "read" as const, type: "array<vec4<u32>>" },
      ]
      : kvBindingDecls(c.nchunk, "read", true)),
  ],
  async source(c) {
    const epw = elementsPerWord(c.kv);
    const round = c.dtype === "float32" ? "" : await loadWgsl("round.wgsl");
    const v4r = (c.d * 4) / epw / 16;
    return specialize(await loadWgsl("flash_attention.wgsl"), {
      TANH_REL: TANH_REL_FN,
      TILE: await loadWgsl("flash_tile.wgsl"),
      TX: c.tx,
      TY: c.ty,
      RM: c.rm,
      RN: c.rn,
      D: c.d,
      BS: c.bs,
      NHD: c.nhd,
      V4R: v4r,
      EPW: epw,
      ...generateFlash({
        tx: c.tx,
        ty: c.ty,
        rm: c.rm,
        rn: c.rn,
        d4: c.d / 4,
        v4r,
        epw,
        wg: c.tx * c.ty,
        cap: c.cap,
        alibi: c.alibi,
        unroll: c.unroll,
      }),
      DECODE: decodeHelpers(c.kv),
      SOURCE: c.enc ? ENC_SOURCE : kvAccessorFns({
        nchunk: c.nchunk,
        blocksPerChunk: "U.blocks_per_chunk",
        blockWords: "U.block_words",
        vec4: true,
      }) + CACHE_SOURCE,
      QLOAD: dataLoads("q", c.dtype, 4).code,
      OUT: `${round}\n${dataStores("out", c.dtype).code}`,
    });
  },
};
