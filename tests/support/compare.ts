/**
 * Elementwise closeness with a report: `|actual - expected| <= atol + rtol * |expected|`,
 * like numpy's allclose, naming the worst element (by how far it exceeds its tolerance), its
 * index (flat and, given a shape, per axis) and both values. NaN and infinities are never
 * close to anything unless `equal_nan` is set (then NaN matches NaN; equal infinities always
 * match). A length mismatch is a failure, not an exception.
 * @module
 */
import assert, { AssertionError } from "node:assert/strict";

/** Tolerances and labels for {@link allclose}. */
export interface CloseOptions {
  atol: number;
  rtol: number;
  /** NaN in both at the same index counts as equal (for caches with poisoned slots). */
  equal_nan?: boolean;
  /** Shape of the arrays, to print the worst index per axis. */
  shape?: number[];
  /** What is compared, for the message ("output", "lse", "key_cache"). */
  label?: string;
}

/** The worst element of a comparison. */
export interface WorstElement {
  index: number;
  /** `index` unravelled over `shape`, when one was given. */
  coords: number[] | null;
  actual: number;
  expected: number;
  abs_diff: number;
  /** abs_diff / (atol + rtol*|expected|): above 1 means out of tolerance; Infinity for NaN. */
  ratio: number;
}

/** What {@link allclose} found. */
export interface CloseReport {
  ok: boolean;
  /** Elements out of tolerance. */
  mismatched: number;
  total: number;
  worst: WorstElement | null;
  max_abs_diff: number;
  message: string;
}

/** Unravels a flat index over a row-major shape. */
export function unravel(index: number, shape: number[]): number[] {
  const out = new Array<number>(shape.length);
  let r = index;
  for (let i = shape.length - 1; i >= 0; i--) {
    out[i] = r % shape[i];
    r = Math.floor(r / shape[i]);
  }
  return out;
}

/** Compares two arrays elementwise; never throws. */
export function allclose(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  opts: CloseOptions,
): CloseReport {
  const label = opts.label ?? "values";
  const tol = `atol ${opts.atol}, rtol ${opts.rtol}`;
  if (actual.length !== expected.length) {
    return {
      ok: false,
      mismatched: Math.max(actual.length, expected.length),
      total: expected.length,
      worst: null,
      max_abs_diff: Infinity,
      message: `${label}: length ${actual.length} but expected length ${expected.length}`,
    };
  }
  let mismatched = 0, maxAbs = 0;
  let worst: WorstElement | null = null;
  for (let i = 0; i < expected.length; i++) {
    const a = actual[i], e = expected[i];
    let ratio: number, diff: number;
    if (typeof a !== "number" || typeof e !== "number") {
      ratio = Infinity;
      diff = NaN;
    } else if (Number.isNaN(a) || Number.isNaN(e)) {
      const both = Number.isNaN(a) && Number.isNaN(e);
      ratio = both && opts.equal_nan ? 0 : Infinity;
      diff = both && opts.equal_nan ? 0 : NaN;
    } else if (!Number.isFinite(a) || !Number.isFinite(e)) {
      ratio = a === e ? 0 : Infinity;
      diff = a === e ? 0 : Infinity;
    } else {
      diff = Math.abs(a - e);
      const allowed = opts.atol + opts.rtol * Math.abs(e);
      ratio = allowed > 0 ? diff / allowed : (diff === 0 ? 0 : Infinity);
    }
    if (diff > maxAbs || Number.isNaN(diff)) maxAbs = Number.isNaN(diff) ? Infinity : diff;
    if (ratio > 1) mismatched++;
    if (worst === null || ratio > worst.ratio) {
      worst = { index: i, coords: null, actual: a, expected: e, abs_diff: diff, ratio };
    }
  }
  if (worst && opts.shape) worst.coords = unravel(worst.index, opts.shape);
  const ok = mismatched === 0;
  const where = worst
    ? `[${worst.coords ? worst.coords.join(", ") : worst.index}]${
      worst.coords ? ` (flat ${worst.index})` : ""
    }`
    : "-";
  const message = worst
    ? `${label}: ${ok ? "close" : `${mismatched}/${expected.length} elements out of tolerance`} ` +
      `(${tol}); worst at ${where}: actual ${worst.actual}, expected ${worst.expected}, ` +
      `|diff| ${worst.abs_diff} (${
        Number.isFinite(worst.ratio) ? worst.ratio.toFixed(2) : "inf"
      }x tolerance)`
    : `${label}: empty (${tol})`;
  return { ok, mismatched, total: expected.length, worst, max_abs_diff: maxAbs, message };
}

/** Throws an AssertionError carrying the report's message when the arrays are not close. */
export function assertClose(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  opts: CloseOptions,
): CloseReport {
  const r = allclose(actual, expected, opts);
  if (!r.ok) throw new AssertionError({ message: r.message });
  return r;
}

/** Index of the first element that is NaN, infinite or not a number at all; -1 if none. */
export function firstNonFinite(a: ArrayLike<number>): number {
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    if (typeof x !== "number" || !Number.isFinite(x)) return i;
  }
  return -1;
}

/** Asserts `a` and `b` hold the same bytes, naming the first that differs. */
export function assertSameBytes(a: Uint8Array, b: Uint8Array, label: string): void {
  assert.equal(a.byteLength, b.byteLength, `${label}: length`);
  const i = a.findIndex((x, j) => x !== b[j]);
  assert.equal(i, -1, `${label}: byte ${i} is ${a[i]}, expected ${b[i]}`);
}
