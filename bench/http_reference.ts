/**
 * The HTTP bench's checker: its own float64 attention over the data of bench/http_workload.ts,
 * row by row (one query token and head against every key it may see), so a sample of an
 * answer's rows can be checked without decoding whole caches. It shares no code with the
 * server's backends (tests/bench/ cross-checks it against tests/support/naive.ts).
 *
 * Tolerance: the project's f16 one, |got - want| <= 1e-2 + 1e-2 * |want|, on the f16 output
 * against the unrounded float64 value.
 * @module
 */
import { f16BitsToF32 } from "../core/dtype.ts";
import { contextKv, type HttpShape, stepData } from "./http_workload.ts";

/** float16 bits → value, for all 65536 patterns. */
export const F16: Float32Array = Float32Array.from({ length: 65536 }, (_, i) => f16BitsToF32(i));

/** The f16 tolerance the checks use. */
export const TOLERANCE = { atol: 1e-2, rtol: 1e-2 } as const;

/** Where a row's keys come from: a request's context K/V, then its decode steps' K/V. */
interface KeySource {
  ctxK: Uint16Array;
  ctxV: Uint16Array;
  /** Per decode step, that step's [reqs, Hkv, D] K and V (the request's row is r). */
  stepK: Uint16Array[];
  stepV: Uint16Array[];
}

/**
 * Float64 attention of one query row (f16 bits at q[qAt .. qAt + D]) over positions
 * 0..seen-1 of request r, kv head g.
 */
export function attendRow(
  s: HttpShape,
  src: KeySource,
  r: number,
  g: number,
  q: Uint16Array,
  qAt: number,
  seen: number,
): Float64Array {
  const D = s.head_size, Hkv = s.num_kv_heads;
  const qv = new Float64Array(D);
  for (let d = 0; d < D; d++) qv[d] = F16[q[qAt + d]] / Math.sqrt(D);
  // Position p's row: context rows strided by Hkv * D, then one array per decode step.
  const inCtx = Math.min(seen, s.ctx), stepAt = (r * Hkv + g) * D;
  const scores = new Float64Array(seen);
  for (let p = 0; p < seen; p++) {
    const k = p < inCtx ? src.ctxK : src.stepK[p - s.ctx];
    const o = p < inCtx ? (p * Hkv + g) * D : stepAt;
    let dot = 0;
    for (let d = 0; d < D; d++) dot += qv[d] * F16[k[o + d]];
    scores[p] = dot;
  }
  let m = -Infinity;
  for (let p = 0; p < seen; p++) m = Math.max(m, scores[p]);
  const out = new Float64Array(D);
  let denom = 0;
  for (let p = 0; p < seen; p++) {
    const w = Math.exp(scores[p] - m);
    denom += w;
    const v = p < inCtx ? src.ctxV : src.stepV[p - s.ctx];
    const o = p < inCtx ? (p * Hkv + g) * D : stepAt;
    for (let d = 0; d < D; d++) out[d] += w * F16[v[o + d]];
  }
  for (let d = 0; d < D; d++) out[d] /= denom;
  return out;
}

/** The first element of `got` (f16 bits) out of tolerance against `want`, or null. */
export function firstMismatch(
  got: Uint16Array,
  gotAt: number,
  want: Float64Array,
): { d: number; got: number; want: number } | null {
  for (let d = 0; d < want.length; d++) {
    const g = F16[got[gotAt + d]], w = want[d];
    if (!(Math.abs(g - w) <= TOLERANCE.atol + TOLERANCE.rtol * Math.abs(w))) {
      return { d, got: g, want: w };
    }
  }
  return null;
}

/** The data of a run, regenerated from its seed, as the checker needs it. */
export class Reference {
  readonly shape: HttpShape;
  readonly seed: number;
  /** Per request, [ctx, Hkv, D] f16 bits of its prefill keys and values. */
  readonly ctxK: Uint16Array[] = [];
  readonly ctxV: Uint16Array[] = [];
  #steps = new Map<number, { k: Uint16Array[]; v: Uint16Array[] }>();

  constructor(shape: HttpShape, seed: number) {
    this.shape = shape;
    this.seed = seed;
    for (let r = 0; r < shape.reqs; r++) {
      const { k, v } = contextKv(shape, seed, r);
      this.ctxK.push(k);
      this.ctxV.push(v);
    }
  }

  /** The K/V source of request r as seen by cache `cache` (decode steps it has regenerated). */
  source(r: number, cache: number | null): KeySource {
    const st = cache === null ? undefined : this.#steps.get(cache);
    return { ctxK: this.ctxK[r], ctxV: this.ctxV[r], stepK: st?.k ?? [], stepV: st?.v ?? [] };
  }

  /**
   * Regenerates cache `cache`'s decode steps up to `step` (in order, each once) and returns
   * that step's queries.
   */
  decodeStep(cache: number, step: number): Uint16Array {
    let st = this.#steps.get(cache);
    if (!st) this.#steps.set(cache, st = { k: [], v: [] });
    while (st.k.length < step) {
      const d = stepData(this.shape, this.seed, cache, st.k.length);
      st.k.push(d.k);
      st.v.push(d.v);
    }
    const d = stepData(this.shape, this.seed, cache, step);
    if (st.k.length === step) {
      st.k.push(d.k);
      st.v.push(d.v);
    }
    return d.q;
  }

  /** Frees a cache's regenerated steps. */
  forget(cache: number): void {
    this.#steps.delete(cache);
  }
}
