// flash_mma.wgsl: FlashAttention-2 style varlen attention over the paged cache (or, when ENC,
// over the call's own K/V) on subgroup matrices (Dawn's chromium_experimental_subgroup_matrix):
// QK^T and PV are f16 x f16 -> f32 multiply-accumulates of MM x MN x MK matrices.
//
// One workgroup = one tile (request, up to R = NSG * MR query rows) x one KV head, as in
// flash_attention.wgsl: a tile's rows are (token, q head) pairs of ONE GQA group (`cnt` tokens
// from `first` times `hcnt` heads from `hfirst`; row r is token first + r / hcnt, head
// hfirst + r % hcnt), so each K/V tile is read once, decoded to f16 into workgroup memory and
// used by every row. Subgroup s owns rows s*MR .. s*MR + MR - 1 (RM row blocks of MM rows):
// its Q fragments and its f32 output accumulators (RM x D/MN result matrices) stay in
// registers for the whole key loop. K/V tiles are double-buffered; per key tile of BK keys:
//   load the next tile's K/V words (block ids read from the table by each loading lane)
//   into registers -> S = Q K^T (this tile's buffer), stored f32 to workgroup memory -> barrier ->
//   online softmax by the subgroup's own lanes (LPR lanes per row, RPL rows per lane), P as
//   f16 over this tile's dead K -> [the next tile's words decoded to f16 into the other
//   buffers] -> workgroupUniformLoad(rescale flag) -> [rescale O] -> O += P V -> [`late`:
//   those stores here instead] -> barrier (RESC_RESET / RESC_APPLY, see lazy rescaling below).
//   That is the in-order loop; the default shapes run it pipelined (`pipe`: a tile's rescale
//   and PV at the top of the next step, gpu/flash_mma_loop.ts). Each loading lane reads its key's
//   block id from the table (v0.9 kept the next two tiles' ids in a workgroup array refreshed
//   every tile: more code, no faster on the H200; bench/NOTES.md v0.10).
// Direct variants (f16 cache, one buffer) load K/V fragments with subgroupMatrixLoad straight
// from the cache (k0/v0 as array<f16>, kv_elem, keys kvstr elements apart): no staging, no
// vt_s; keys past kend get masked scores and p = 0, and the V rows of keys past kv_len (which
// may hold anything, NaN included) come from a zero-padded copy of the request's last tile.
// Matrix-staged variants (mstage: f16 cache, one buffer) move each tile into kt_s/vt_s as
// fragments (subgroupMatrixLoad from the cache, subgroupMatrixStore to the tile; the request's
// last, partial tile element by element, zero past kend) instead of 16-byte words. QSPLIT > 1
// computes S = Q K^T in that many independent accumulator chains, each stored to its own S
// array (s_s at j * R * SSTR); the softmax adds them. (v0.7's single-buffered variants, one K
// and one V tile, computed wrong results on the H200 and right ones on lavapipe: removed, see
// bench/NOTES.md.)
// Lazy rescaling: a row's reference max m only moves when the tile max exceeds m + TAU, so
// p = exp(s - m) <= e^TAU (f16 holds up to 65504: TAU <= 11) and O is rescaled (a round trip
// through workgroup memory, every subgroup, all rows at once) only on such rare tiles
// after a row has accumulated something. TAU = 0 is plain FA2 (rescale on every new max).
// RESC_RESET / RESC_APPLY (gpu/flash_mma_codegen.ts) hold that protocol: by default the
// workgroup's atomic flag s_u[2], cleared at the top of a tile and read by workgroupUniformLoad
// (a barrier, the load, a barrier) before PV; `sgresc` shapes instead decide per subgroup
// (subgroupAny of its lanes' flags, after a plain barrier) and rescale only that subgroup's own
// rows of s_s with no workgroup barrier inside (a subgroup's own hand-offs, as the v0.7 ladder's
// `-nb`: not ordered by WGSL's rules; the float64 checks say whether the device orders them).
// Subgroups whose rows cannot see any key of a tile (causal, window, padding rows) skip its
// matrix work; the workgroup's key range is cut to what its rows can see.
//
// Bindings (group 0; the Params struct and declarations are generated from
// gpu/flash_mma_kernel.ts's FLASH_MMA entry; the Params words are flash_attention.wgsl's, then
// kstr, pstr, sstr: KSTR, PSTR and SSTR again, which the workgroup matrix calls take instead of
// the constants only under the bench probe ATTN_MMA_RUNTIME_STRIDES; bench/NOTES.md v0.16):
//   0 uniform  U                         runtime sizes and options
//   1 storage  q: array<vec4<u32>>       [num_tokens, num_heads, D] in the data dtype (f16 or
//                                        bf16 bits, 8 per vec4)
//   2 storage  mdw: array<u32>           tiles (4 words: req, first, cnt | hcnt << 16, hfirst),
//                                        at U.off_reqs 4 words per request (kv_len,
//                                        bitcast(base - q0), 0, rbase), block table at
//                                        U.off_bt, ALiBi slopes and sinks (f32 bits)
//   3 storage  out: array<u32>           [num_tokens, num_heads, D] data-dtype bits, 2 per word,
//                                        rounded to nearest even (round.wgsl); poisoned before
//   4 storage  lse: array<u32>           [num_heads, num_tokens] f32 bits
//   5..        cache k0..k{N-1}, v0..v{N-1}: array<vec4<u32>> (kvAccessorFns; direct: k0, v0:
//              array<f16>); ENC: k_in, v_in:
//              array<vec4<u32>> [num_tokens, num_kv_heads, D] in the data dtype
// Dispatch: num_tiles * num_kv_heads workgroups of WG = NSG * SG, folded into x/y (U.nwg_x).
// Compile-time: MM, MN, MK (matrix dims), SG (subgroup size), NSG, RM, BK, D, BS, NHD, TAU,
// OC, OSTR and S_LEN (the epilogue's O pass width and stride, s_s's length),
// QSPLIT (chains of S = Q K^T), E16 (K/V elements per 16 bytes), KT_LEN (K tile array
// length), QPASS (Q rows staged per pass), LPR/RPL (softmax lanes per row, rows per lane);
// generated: WRITE_ROWS (the epilogue's normalise-and-write of a lane's rows), TILE
// (wgsl/flash_tile.wgsl, shared with
// flash_attention.wgsl), HELPERS (flash_mma_rows.wgsl), DECODE (kv16, q16: 16-byte words to
// f16), SOURCE (src_k/src_v, or kv_elem for direct and matrix-staged variants),
// STAGE_LOAD/STORE (prologue; STAGE_STORE also the loop's stores of the next tile, see above),
// LOOP_STAGE_LOAD (loop; fragment moves for mstage; empty for direct loads), LIVE (the
// subgroup's tile-liveness test), VT_DECL (the V tiles, none for
// direct loads), TAIL_STAGE (direct loads: the request's last, partial V tile, zero-padded,
// into the unused P buffer), R_DIV, SG_ROWS and LSE_OWNER (dsplit's rows, halves of D and
// the pair's LSE writer), LG and M0
// (softmax units and the initial running max: 1 and MASK, or log2(e) and -1e30 for the fast
// softmax),
// ROUND (round.wgsl and round_pair), SOFTMAX (gpu/flash_mma_softmax.ts), QFRAG_DECL/LOAD, QK,
// PV, O_DECL, O_RESCALE, O_OUTPUT (gpu/flash_mma_codegen.ts, gpu/flash_mma_staging.ts),
// LOOP_HEAD (the key loop's `for` over kstart..kend), V_SPECIAL_FNS, V_CLEAN and V_SPECIALS
// (non-finite values of tiles not every row sees whole: gpu/flash_mma_specials.ts), KT_DECL
// (kt_s's length: two K tiles, and P's buffers after them for `stagger`), and LOOP: the key loop
// built from those pieces in order, pipelined (`pipe`) or staggered (`stagger`:
// gpu/flash_mma_loop.ts; the pipelined forms keep a tile's PV for the next step). A
// bench ablation (gpu/flash_mma_shape.ts MmaAblation) empties one of them or of the loop's
// bookkeeping (timing only: results wrong or unordered by design).
// Enables: f16, chromium_experimental_subgroup_matrix, subgroups (where accepted). Matrix
// calls sit in subgroup-uniform (not workgroup-uniform) branches: `main` turns the
// chromium.subgroup_matrix_uniformity diagnostic off.
// Out of f16 range: finite bf16/f32 K/V and bf16 query values are clamped to +-65504 when
// staged, infinities and NaNs stay infinities and NaNs (a bit test and a select, kv16 / q16);
// fp8 values always fit; the output saturates nowhere (f32 until the final rounding).
// Semantics (core/reference.ts): p = base + j; s = (scale * k_scale) q.k, soft cap, ALiBi
// -slope (p - k); causal k <= p (and p - k < w), non-causal |p - k| < w; sinks in the
// denominator only; lse = m + log(denominator), -inf and output 0 with nothing visible.

const MM: u32 = {{MM}};
const MN: u32 = {{MN}};
const MK: u32 = {{MK}};
const SG: u32 = {{SG}};
const NSG: u32 = {{NSG}};
const WG: u32 = SG * NSG;
const RM: u32 = {{RM}};
const MR: u32 = MM * RM; // rows per subgroup
const R: u32 = MR * NSG{{R_DIV}}; // rows per workgroup
const BK: u32 = {{BK}};
const D: u32 = {{D}};
const BS: u32 = {{BS}};
const NHD: bool = {{NHD}};
const TAU: f32 = {{TAU:f32}};
const LOG2E: f32 = 1.4426950408889634;
const LG: f32 = {{LG:f32}}; // units of m, slopes and sinks: 1 (natural), LOG2E (fast: exp2)
const TAUL: f32 = TAU * LG;
const E16: u32 = {{E16}};
const V4R: u32 = D / E16; // 16-byte words per K/V row
const WPR: u32 = D * 4u / E16; // u32 words per K/V row
const KSTR: u32 = {{KSTR}}; // f16 row stride of the K, V and Q tiles (D + 8: 16-byte aligned, skewed)
const SSTR: u32 = {{SSTR}}; // f32 row stride of S (and of the rescale's O passes): BK + 4
const OC: u32 = {{OC}}; // columns of an epilogue O pass
const OSTR: u32 = {{OSTR}}; // f32 row stride of the epilogue's O passes: OC + 4
const PSTR: u32 = {{PSTR}}; // f16 row stride of P: BK + 8
const KT_LEN: u32 = {{KT_LEN}};
const VT_LEN: u32 = BK * KSTR;
const QPASS: u32 = {{QPASS}};
const LPR: u32 = {{LPR}}; // lanes per row in the softmax step
const RPL: u32 = {{RPL}}; // rows per lane
const KPL: u32 = BK / LPR; // keys (or the rescale's O columns) per lane
const OKPL: u32 = OC / LPR; // output columns per lane in an epilogue pass
const QSPLIT: u32 = {{QSPLIT}}; // chains of S = Q K^T, each its own S array
const MASK: f32 = -3.0e38;
const M0: f32 = {{M0}}; // the running max before any key (fast: above MASK, so exp2(MASK - m) = 0)
const FLAG_ALIBI: u32 = 1u;
const FLAG_SINKS: u32 = 2u;

{{DECODE}}
{{SOURCE}}

var<workgroup> kt_s: array<f16, {{KT_DECL}}>; // K tiles; Q staging before the loop; P after S
{{VT_DECL}}
var<workgroup> s_s: array<f32, {{S_LEN}}>; // S (QSPLIT chains); the O passes (oregions of R * OSTR)
// The workgroup's scalars as one 16-byte array: [0] the first key, [1] the end of its keys,
// [2] whether any row needs an O rescale this tile (atomic: many writers), [3] whether staging
// zeroed a non-finite value (v_finite; the epilogue's V_SPECIALS then repairs). Three separate
// scalars beside the tiles made the constant-stride matrix calls read wrong tiles on the H200
// (bench/NOTES.md v0.16): every workgroup variable here is a multiple of 16 bytes.
var<workgroup> s_u: array<atomic<u32>, 4>;

{{ROUND}}

{{TANH_REL}}
{{HELPERS}}

{{V_SPECIAL_FNS}}

{{WRITE_ROWS}}

@compute @workgroup_size(WG)
@diagnostic(off, chromium.subgroup_matrix_uniformity)
fn main(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(local_invocation_index) t: u32,
  @builtin(subgroup_id) sg: u32,
  @builtin(subgroup_invocation_id) ln: u32,
) {
{{TILE}}
  let p_first = i32(first) + bmq; // the positions of the workgroup's tokens
  let p_last = p_first + i32(cnt) - 1;

  if (t == 0u) {
    let range = key_range(p_first, p_last, kv_len);
    let ks = range.x - range.x % i32(BK); // tiles aligned to BK; keys before the window masked
    atomicStore(&s_u[0], u32(ks));
    atomicStore(&s_u[1], u32(max(range.y, ks)));
    atomicStore(&s_u[3], 0u);
  }

  // This lane's rows (RPL of them) and its part (lq) of their keys in the softmax step.
{{SG_ROWS}}
  let lq = ln % LPR;
  var rpos: array<i32, RPL>;
  var rslope: array<f32, RPL>;
  var rok: array<bool, RPL>;
  var tb: array<u32, RPL>; // output element offset of the row, or ~0
  var lh: array<u32, RPL>; // lse index of the row
  var m: array<f32, RPL>;
  var l: array<f32, RPL>;
  var seen: array<bool, RPL>;
  var alpha: array<f32, RPL>;
  for (var i = 0u; i < RPL; i++) {
    let r = sgr + ln / LPR + i * (SG / LPR);
    let ok = r < nrows;
    let tok = first + r / hcnt;
    let h = kvh * U.group + hfirst + r % hcnt;
    rok[i] = ok;
    rpos[i] = i32(tok) + bmq;
    tb[i] = select(0xffffffffu, (tok * U.num_heads + h) * D, ok);
    lh[i] = h * U.num_tokens + tok;
    rslope[i] = 0.0;
    m[i] = M0;
    l[i] = 0.0;
    if (ok && (U.flags & FLAG_ALIBI) != 0u) {
      rslope[i] = bitcast<f32>(mdw[U.off_alibi + h]) * LG;
    }
    if (ok && (U.flags & FLAG_SINKS) != 0u) {
      m[i] = bitcast<f32>(mdw[U.off_sinks + h]) * LG;
      l[i] = select(0.0, 1.0, lq == 0u); // partial sums: counted once per row
    }
    seen[i] = false;
    alpha[i] = 1.0;
  }
  let live_rows = sgr < nrows;
  let p_lo = i32(first + sgr / hcnt) + bmq;
  let p_hi = i32(first + (min(nrows, sgr + MR) - 1u) / hcnt) + bmq;

  // Q -> f16 rows in kt_s (QPASS rows a pass) -> this subgroup's left fragments.
{{QFRAG_DECL}}
  for (var r0 = 0u; r0 < R; r0 += QPASS) {
    for (var idx = t; idx < QPASS * (D / 8u); idx += WG) {
      let r = r0 + idx / (D / 8u);
      let c = idx % (D / 8u);
      var wq = vec4<u32>(0u);
      if (r < nrows) {
        let tok = first + r / hcnt;
        let h = kvh * U.group + hfirst + r % hcnt;
        wq = q[(tok * U.num_heads + h) * (D / 8u) + c];
      }
      let a = q16(wq, 0u);
      let b = q16(wq, 1u);
      let o = (r - r0) * KSTR + c * 8u;
      kt_s[o] = a.x;
      kt_s[o + 1u] = a.y;
      kt_s[o + 2u] = a.z;
      kt_s[o + 3u] = a.w;
      kt_s[o + 4u] = b.x;
      kt_s[o + 5u] = b.y;
      kt_s[o + 6u] = b.z;
      kt_s[o + 7u] = b.w;
    }
    workgroupBarrier();
    if (sgr >= r0 && sgr < r0 + QPASS) {
      let qb = (sgr - r0) * KSTR;
{{QFRAG_LOAD}}
    }
    workgroupBarrier();
  }
  let kstart = workgroupUniformLoad(&s_u[0]);
  let kend = workgroupUniformLoad(&s_u[1]);
  let kvstr = select(D, U.num_kv_heads * D, NHD); // direct loads: elements between keys
{{O_DECL}}
  // Prologue: the first tile into buffer 0.
  {
    let kn = kstart;
{{STAGE_LOAD}}
    let kbn = 0u;
    let vbn = 0u;
{{STAGE_STORE}}
  }
  workgroupBarrier();
{{LOOP}}

  // Normalise and write: O passes of OC columns through s_s (regions used in turn: with two,
  // no barrier after a pass's writes; see O_OUTPUT in gpu/flash_mma_codegen.ts).
  var inv: array<f32, RPL>;
  for (var i = 0u; i < RPL; i++) {
    var lt = l[i];
    for (var o = 1u; o < LPR; o <<= 1u) {
      lt += subgroupShuffleXor(lt, o);
    }
    inv[i] = select(U.v_scale / lt, 0.0, lt == 0.0); // a NaN lt (NaN in the cache) stays NaN
    if (rok[i] && lq == 0u{{LSE_OWNER}}) {
      lse[lh[i]] = select(bitcast<u32>(m[i] / LG + log(lt)), 0xff800000u, lt == 0.0); // -inf: none
    }
  }
{{O_OUTPUT}}
{{V_SPECIALS}}
}
