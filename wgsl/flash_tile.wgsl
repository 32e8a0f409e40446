// flash_tile.wgsl: the opening statements of a prefill tile kernel's `main` (flash_attention.wgsl,
// flash_mma.wgsl), pasted there at {{TILE}}: the workgroup's (tile, kv head) from its id (past
// the last: return), the tile's request, first token, token count, q heads (hcnt from hfirst
// within the GQA group) and rows, and the request's words: kv_len, bmq (position of token `tok`
// is tok + bmq), rbase (block-table row, or first key row for encoder types). Uses `wg`, `U`,
// `mdw`; no bindings, no placeholders; statements only (not a module on its own).
  let wid = wg.x + wg.y * U.nwg_x;
  if (wid >= U.num_tiles * U.num_kv_heads) {
    return;
  }
  let tile = wid / U.num_kv_heads;
  let kvh = wid % U.num_kv_heads;
  let req = mdw[tile * 4u];
  let first = mdw[tile * 4u + 1u];
  let cnt = mdw[tile * 4u + 2u] & 0xffffu;
  let hcnt = max(1u, mdw[tile * 4u + 2u] >> 16u);
  let hfirst = mdw[tile * 4u + 3u];
  let rb = U.off_reqs + req * 4u;
  let kv_len = mdw[rb];
  let bmq = bitcast<i32>(mdw[rb + 1u]);
  let rbase = mdw[rb + 3u];
  let nrows = cnt * hcnt;
  let w = i32(U.window);
