/**
 * The subgroup-matrix prefill kernel's bench-only ablations (gpu/flash_mma_shape.ts `MmaShape`
 * `ablate`): the stages a shape may leave out to time the rest ({@link MmaAblation}) and the
 * set of stages a shape's `ablate` names ({@link ablatedStages}). Results are wrong by design;
 * no backend plans one.
 * @module
 */
import type { MmaShape } from "./flash_mma_shape.ts";

/** What a bench-only ablation leaves out (results wrong by design; never planned by a backend). */
export type MmaAblation =
  | "softmax"
  | "stage"
  | "qk"
  | "pv"
  | "rescale" // the O rescale, its flag and the uniform load's barriers (timing only)
  | "live" // the causal / window tile-liveness test: every subgroup runs every tile
  | "loop" // rescale and live together: the loop's bookkeeping the v0.7 ladder lacks
  | "count" // the key loop's trip count a compile-time constant (ATTN_MMA_ABLATE_TILES, default
  // 264: the `1x4224n-h4k1` bench case's tiles; other shapes read wrong keys): what the
  // run-time count costs (the ladder's -xd: 16%)
  | "qpass" // Q's fragments loaded once, unconditionally, as `let`s (wrong data): what the
  // passes' conditional assignments to the fragment `var`s cost in the loop
  | "epilogue" // the O passes' barriers and output writes after the loop (the fixed
  // per-workgroup cost); O is still stored to workgroup memory, so PV stays live
  | "round" // the output's rounding: round_pair keeps the top halves of the f32 bits
  | "write" // the output's stores: the epilogue's words folded into one a lane, not stored
  | "specials" // the non-finite values of tiles not every row sees whole (gpu/
  // flash_mma_specials.ts): staged as they are, no repair (right for finite caches)
  | "bare"; // loop, softmax and epilogue together: QK, staging and PV in the kernel's frame

/**
 * The stages a shape's `ablate` leaves out (`+`-joined names; `loop` and `bare` stand for
 * several); empty for a real shape.
 */
export function ablatedStages(shape: MmaShape): Set<string> {
  const groups: Record<string, string[]> = {
    loop: ["rescale", "live"],
    bare: ["rescale", "live", "softmax", "epilogue"],
  };
  const names = shape.ablate ? shape.ablate.split("+") : [];
  return new Set(names.flatMap((a) => groups[a] ?? [a]));
}
