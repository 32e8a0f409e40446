/**
 * Non-finite values in the tensor-core prefill kernel's P V (wgsl/flash_mma.wgsl). A key a row
 * cannot see gets p = 0, and the matrix multiply-accumulate makes 0 x Inf (or 0 x NaN) NaN, so a
 * non-finite value in the cache (an f16 cache's overflow of finite f32 or bf16 data, or bytes
 * imported as they are) made NaN every row of the workgroup that shares the tile without seeing
 * that key: the earlier tokens beside the causal diagonal, the later ones past a window's start.
 *
 * Tiles not every row sees whole (flash_mma_rows.wgsl `tile_whole`) get their staged values'
 * infinities and NaNs made 0 (`v_finite`; {@link valueCleanCode}) and the workgroup notes it
 * (s_u[3]). Only then, after the output is written, each row's visible keys of those tiles are
 * read again ({@link valueSpecialsCode}): where one held a special, the output element is what
 * float64 gives, NaN for a NaN or infinities of both signs, else that infinity. Tiles every row
 * sees whole multiply their specials as they are, which float64 agrees with. Left as it was: a
 * visible key whose p is 0 in f16 (a score gap past about 17) times an infinite value is NaN in
 * P V where float64 has the infinity.
 * @module
 */
import type { MmaConsts } from "./flash_mma_shape.ts";

/** The 16-bit patterns of the output dtype's classes (round.wgsl writes the rest). */
const BITS = {
  float16: { exp: 0x7c00, man: 0x3ff, pinf: 0x7c00, ninf: 0xfc00, nan: 0x7e00 },
  bfloat16: { exp: 0x7f80, man: 0x7f, pinf: 0x7f80, ninf: 0xff80, nan: 0x7fc0 },
} as const;

const hex = (n: number) => `0x${n.toString(16)}u`;

/**
 * `fn v_pair(key, h, c2, kv_len, rbase) -> vec2<f16>`: elements c2, c2 + 1 of key `key`'s value
 * row as the kernel stages them (kv16 of the 16-byte word; f16 bits for direct and
 * matrix-staged variants); `fn tile_cleaned(kt, kv_len, p0, p1)`: whether tile kt's values went
 * through `v_finite` (V_CLEAN's tiles; for direct loads every tile V_COPIED copies); and
 * `fn out_merge(old, cls) -> u32`: a word of two 16-bit output elements after the classes `cls`
 * (value_class bits, one per element) join their own.
 */
export function valueSpecialFns(c: MmaConsts): string {
  const b = BITS[c.dtype];
  const pair = c.direct || c.mstage
    ? `  let at = kv_elem(key, h, kv_len, rbase) + c2;
  return vec2<f16>(v0[at], v0[at + 1u]);`
    : `  let x = kv16(src_v(key, h, c2 / E16, rbase), (c2 % E16) / 4u);
  return select(x.xy, x.zw, (c2 % 4u) == 2u);`;
  const cleaned = c.direct
    ? "kt + BK > kv_len || !tile_whole(kt, p0, p1)"
    : "!tile_whole(kt, p0, p1)";
  return `fn v_pair(key: u32, h: u32, c2: u32, kv_len: u32, rbase: u32) -> vec2<f16> {
${pair}
}

fn tile_cleaned(kt: u32, kv_len: u32, p0: i32, p1: i32) -> bool {
  return ${cleaned};
}

fn out_special(old: u32, cls: u32) -> u32 {
  var c = cls;
  if ((old & ${hex(b.exp)}) == ${hex(b.exp)}) {
    c |= select(select(1u, 2u, (old & 0x8000u) != 0u), 4u, (old & ${hex(b.man)}) != 0u);
  }
  if ((c & 4u) != 0u || (c & 3u) == 3u) {
    return ${hex(b.nan)};
  }
  return select(${hex(b.pinf)}, ${hex(b.ninf)}, c == 2u);
}

fn out_merge(old: u32, cls: vec2<u32>) -> u32 {
  var lo = old & 0xffffu;
  var hi = old >> 16u;
  if (cls.x != 0u) {
    lo = out_special(lo, cls.x);
  }
  if (cls.y != 0u) {
    hi = out_special(hi, cls.y);
  }
  return lo | (hi << 16u);
}
`;
}

/**
 * V_CLEAN, at the top of the key loop: a tile not every row sees whole gets its staged values'
 * infinities and NaNs made 0 (`v_finite`, noting it for the repair) before its PV reads them
 * (the barrier after S orders it). Its own pass over the tile in workgroup memory, in a
 * workgroup-uniform branch, so the staging of every other tile stays as it was (zeroing inside
 * the staging's stores cost 3% at 8 x 4096 on the H100). Direct loads copy such a tile instead
 * (`V_COPIED` in gpu/flash_mma_codegen.ts), whose copy does the same.
 */
export function valueCleanCode(c: MmaConsts): string {
  if (c.direct) return "";
  return `    if (tile_cleaned(kt, kv_len, p_first, p_last)) {
      for (var i = t; i < BK * (D / 4u); i += WG) {
        let o = vb + (i / (D / 4u)) * KSTR + (i % (D / 4u)) * 4u;
        let x = v_finite(vec4<f16>(vt_s[o], vt_s[o + 1u], vt_s[o + 2u], vt_s[o + 3u]));
        vt_s[o] = x.x;
        vt_s[o + 1u] = x.y;
        vt_s[o + 2u] = x.z;
        vt_s[o + 3u] = x.w;
      }
    }`;
}

/**
 * The epilogue's repair (main, after the output is written): when a tile's values were zeroed,
 * each invocation takes 8 columns of a row (one 16-byte output word under `ovec`, four 4-byte
 * ones else: no two invocations write one vector), scans the row's visible keys in the cleaned
 * tiles only (a special of another tile reached the output through the multiply, and
 * out_special merges the element's own class: about cnt + 2 BK keys a row, not its context) and
 * rewrites the elements whose values held one. Runs only then (a workgroup-uniform flag).
 */
export function valueSpecialsCode(c: MmaConsts): string {
  const write = c.ovec
    ? `        let wi = ((tok * U.num_heads + h) * D + c8) / 8u;
        let old = out[wi];
        out[wi] = vec4<u32>(out_merge(old.x, cls[0]), out_merge(old.y, cls[1]),
                            out_merge(old.z, cls[2]), out_merge(old.w, cls[3]));`
    : `        let wi = ((tok * U.num_heads + h) * D + c8) / 2u;
        for (var j = 0u; j < 4u; j++) {
          if (any(cls[j] != vec2<u32>(0u))) {
            out[wi + j] = out_merge(out[wi + j], cls[j]);
          }
        }`;
  return `  if (workgroupUniformLoad(&s_u[3]) != 0u) {
    storageBarrier(); // the output words below were written by other lanes
    for (var e = t; e < nrows * (D / 8u); e += WG) {
      let r = e / (D / 8u);
      let c8 = (e % (D / 8u)) * 8u;
      let tok = first + r / hcnt;
      let pos = i32(tok) + bmq;
      let keys = key_range(pos, pos, kv_len);
      let lo = keys.x;
      let hi = keys.y;
      var cls: array<vec2<u32>, 4>;
      for (var kt = kstart; kt < kend; kt += BK) {
        if (!tile_cleaned(kt, kv_len, p_first, p_last)) {
          continue;
        }
        for (var k = max(lo, i32(kt)); k < min(hi, i32(kt + BK)); k++) {
          for (var j = 0u; j < 4u; j++) {
            cls[j] |= value_class(v_pair(u32(k), kvh, c8 + 2u * j, kv_len, rbase));
          }
        }
      }
      if (any((cls[0] | cls[1] | cls[2] | cls[3]) != vec2<u32>(0u))) {
        let h = kvh * U.group + hfirst + r % hcnt;
${write}
      }
    }
  }`;
}
