// cache_write.wgsl: vLLM's reshape_and_cache. New K/V rows (in the data dtype) go to their
// slot_mapping slots of the paged cache in its storage dtype; slot -1 (any negative) writes
// nothing. The Params struct and the bindings are generated from gpu/cache_write.ts's kernel
// entry (CACHE_WRITE):
//   0 uniform  P                      num_rows, num_kv_heads, block_size, nwg_x, k_scale,
//                                     v_scale, block_words, blocks_per_chunk
//   1 storage  key_new: array<u32>    [num_rows, num_kv_heads, HEAD] data-dtype words
//   2 storage  value_new: array<u32>  same shape
//   3 storage  slots: array<i32>      [num_rows]
//   (4 storage flags: array<u32, 4>   the call's finiteness flags, when gated)
//   4.. k0..k{N-1}, then v0..v{N-1}  (read_write array<u32>, accessors from kvAccessorFns)
// Dispatch: ceil(2 * num_rows * num_kv_heads * WPR / WG) workgroups of WG, folded into x/y;
// invocation g writes one whole u32 word (EPW elements) of one row of K (g < half) or V,
// so no two invocations share a word and no atomics are needed.
// Compile-time: WG, HEAD (head size), GATE (gated: return unless every flag is clear), EPW
// (elements per word), NHD (layout), SRC (the data dtype's `fn src_bits(is_v: bool, i: u32) ->
// u32`: element i's f32 bits), PACK (the storage dtype's `fn pack_word(x: vec4<u32>, scale:
// f32) -> u32` over EPW f32 bit patterns), KV (chunk accessors using P.block_words /
// P.blocks_per_chunk).
// Rounding is done on the f32 bits in integer arithmetic, round-to-nearest-even, so it
// matches core/dtype.ts exactly (fp8 saturates to +-448 / +-57344, NaN -> 0x7f).

const WG: u32 = {{WG}};
const HEAD: u32 = {{HEAD}};
const EPW: u32 = {{EPW}};
const WPR: u32 = HEAD / EPW; // words per row of one head
const NHD: bool = {{NHD}};

{{KV}}
{{ROUND}}
{{SRC}}
{{PACK}}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  {{GATE}}
  let g = (wg.x + wg.y * P.nwg_x) * WG + lid;
  let per_tensor = P.num_rows * P.num_kv_heads * WPR;
  if (g >= 2u * per_tensor) {
    return;
  }
  let is_v = g >= per_tensor;
  let r = select(g, g - per_tensor, is_v);
  let w = r % WPR;
  let rh = r / WPR;
  let h = rh % P.num_kv_heads;
  let tok = rh / P.num_kv_heads;
  let slot = slots[tok];
  if (slot < 0) {
    return;
  }
  let block = u32(slot) / P.block_size;
  let off = u32(slot) % P.block_size;
  let src = (tok * P.num_kv_heads + h) * HEAD + w * EPW;
  var x = vec4<u32>(0u);
  for (var e = 0u; e < EPW; e++) {
    x[e] = src_bits(is_v, src + e);
  }
  let word = pack_word(x, select(P.k_scale, P.v_scale, is_v));
  var dst: u32;
  if (NHD) {
    dst = (off * P.num_kv_heads + h) * WPR + w;
  } else {
    dst = (h * P.block_size + off) * WPR + w;
  }
  if (is_v) {
    store_v(block, dst, word);
  } else {
    store_k(block, dst, word);
  }
}
