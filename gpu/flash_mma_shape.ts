/**
 * The compile-time shape of the subgroup-matrix prefill kernel (wgsl/flash_mma.wgsl): what a
 * batch and a device fix ({@link MmaTarget}), the kernel shape ({@link MmaShape}), the shapes
 * tried in order ({@link MMA_SHAPES}), and the workgroup-memory layout they imply
 * ({@link mmaLayout}), with the reason a shape cannot be compiled ({@link mmaShapeProblem}).
 * @module
 */
import type { StorageDType } from "../core/types.ts";

/** A kernel shape. Rows per workgroup = nsg * rm * m. */
export interface MmaShape {
  /** Subgroups per workgroup. */
  nsg: number;
  /** Row blocks (of m rows) per subgroup. */
  rm: number;
  /** Keys per K/V tile. */
  bk: number;
  /** Lazy-rescale threshold (natural log units, 0..11); 0 rescales on every new max. */
  tau: number;
}

/** What the batch and the device fix: data and K/V dtypes, layout, matrix dims, subgroup size. */
export interface MmaTarget {
  /** K/V element type: the cache's storage dtype, or the data dtype for encoder types. */
  kv: StorageDType;
  /** Query / output dtype. */
  dtype: "float16" | "bfloat16";
  /** K/V from the call (encoder types) instead of the cache. */
  enc: boolean;
  d: number;
  bs: number;
  nhd: boolean;
  /** Buffers per cache tensor (0 for encoder types). */
  nchunk: number;
  /** f16 x f16 -> f32 subgroup-matrix dims (M x K times K x N). */
  m: number;
  n: number;
  k: number;
  /** The device's subgroup size. */
  sg: number;
}

/** Every compile-time value of one variant (the pipeline key names them all). */
export interface MmaConsts extends MmaTarget, MmaShape {
  [k: string]: string | number | boolean;
}

/** Derived compile-time sizes of one variant. */
export interface MmaLayout {
  rows: number;
  wg: number;
  ktLen: number;
  qpass: number;
  lpr: number;
  rpl: number;
  nbt: number;
  e16: number;
  /** Workgroup memory in bytes. */
  shared_bytes: number;
}
const BYTES: Record<StorageDType, number> = {
  float32: 4,
  float16: 2,
  bfloat16: 2,
  fp8_e4m3: 1,
  fp8_e5m2: 1,
};

/** Why `shape` cannot be compiled for `t` (within `maxShared` bytes), or null. */
export function mmaShapeProblem(
  t: MmaTarget,
  shape: MmaShape,
  maxShared = Infinity,
): string | null {
  const { m, n, k, d, sg } = t;
  const mr = m * shape.rm;
  if (d % n || d % k || d % 16) return `head_size ${d} is not a multiple of ${Math.max(n, k, 16)}`;
  if (shape.bk % n || shape.bk % k) return `bk ${shape.bk} is not a multiple of ${n} and ${k}`;
  if (sg % mr && mr % sg) return `subgroup size ${sg} and ${mr} rows per subgroup do not nest`;
  if (shape.bk / Math.max(1, sg / mr) < 2) return `bk ${shape.bk} leaves a lane under 2 keys`;
  if (!(shape.tau >= 0 && shape.tau <= 11)) return `tau ${shape.tau} is outside 0..11`;
  const bytes = mmaLayout(t, shape).shared_bytes;
  if (bytes > maxShared) return `needs ${bytes} B of workgroup memory (limit ${maxShared})`;
  return null;
}

/** Shapes in order of preference: the first that fits the device is the default. */
export const MMA_SHAPES: readonly MmaShape[] = [
  { nsg: 8, rm: 1, bk: 16, tau: 8 },
  { nsg: 4, rm: 1, bk: 16, tau: 8 },
  { nsg: 4, rm: 1, bk: 32, tau: 8 },
  { nsg: 2, rm: 1, bk: 16, tau: 8 },
  { nsg: 2, rm: 1, bk: 8, tau: 8 },
  { nsg: 1, rm: 1, bk: 8, tau: 8 },
];

/** The first of {@link MMA_SHAPES} that compiles for `t` within `maxShared` bytes. */
export function chooseMmaShape(t: MmaTarget, maxShared: number): MmaShape | null {
  return MMA_SHAPES.find((s) => mmaShapeProblem(t, s, maxShared) === null) ?? null;
}

/** Sizes of the kernel's arrays (see wgsl/flash_mma.wgsl). */
export function mmaLayout(t: MmaTarget, shape: MmaShape): MmaLayout {
  const { d, sg } = t, mr = t.m * shape.rm;
  const rows = mr * shape.nsg, kstr = d + 8, sstr = shape.bk + 4, pstr = shape.bk + 8;
  const ktLen = Math.max(shape.bk * kstr, rows * pstr, mr * kstr);
  const qpass = Math.min(rows, Math.floor(ktLen / kstr / mr) * mr);
  const nbt = t.enc ? 0 : Math.floor((shape.bk - 1) / t.bs) + 2;
  const e16 = 16 / BYTES[t.kv];
  const shared_bytes = 2 * (2 * ktLen + 2 * shape.bk * kstr) + 4 * rows * sstr +
    4 * (2 * nbt + 1) + 12;
  return {
    rows,
    wg: sg * shape.nsg,
    ktLen,
    qpass,
    lpr: Math.max(1, sg / mr),
    rpl: Math.max(1, mr / sg),
    nbt,
    e16,
    shared_bytes,
  };
}
