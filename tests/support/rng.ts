/**
 * A small fast seeded PRNG (sfc32) for tests, with uniform, integer and normal draws, and a
 * way to derive per-case seeds from one run seed (so a printed seed reproduces a run).
 * @module
 */

/** A small fast seeded PRNG (sfc32) with uniform and normal draws. */
export class Rng {
  #a: number;
  #b: number;
  #c: number;
  #d: number;
  #spare: number | null = null;
  constructor(seed: number) {
    this.#a = 0x9e3779b9;
    this.#b = 0x243f6a88;
    this.#c = 0xb7e15162;
    this.#d = seed >>> 0;
    for (let i = 0; i < 16; i++) this.u32();
  }
  /** Uniform 32-bit unsigned integer. */
  u32(): number {
    const t = (((this.#a + this.#b) | 0) + this.#d) | 0;
    this.#d = (this.#d + 1) | 0;
    this.#a = this.#b ^ (this.#b >>> 9);
    this.#b = (this.#c + (this.#c << 3)) | 0;
    this.#c = (this.#c << 21) | (this.#c >>> 11);
    this.#c = (this.#c + t) | 0;
    return t >>> 0;
  }
  /** Uniform in [0, 1). */
  next(): number {
    return this.u32() / 4294967296;
  }
  /** Uniform in [lo, hi). */
  uniform(lo: number, hi: number): number {
    return lo + (hi - lo) * this.next();
  }
  /** Integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }
  /** Standard normal (Box-Muller). */
  normal(): number {
    if (this.#spare !== null) {
      const s = this.#spare;
      this.#spare = null;
      return s;
    }
    let u = 0;
    while (u === 0) u = this.next();
    const v = this.next();
    const r = Math.sqrt(-2 * Math.log(u));
    this.#spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }
  /**
   * Writes `count` normal draws times `scale` into `out` from `start` (a fast path for big
   * caches: the generator state lives in locals, Box-Muller pairs are both used).
   */
  fillNormal(out: Float32Array, start: number, count: number, scale = 1): void {
    let a = this.#a, b = this.#b, c = this.#c, d = this.#d;
    const next = () => {
      const t = (((a + b) | 0) + d) | 0;
      d = (d + 1) | 0;
      a = b ^ (b >>> 9);
      b = (c + (c << 3)) | 0;
      c = (c << 21) | (c >>> 11);
      c = (c + t) | 0;
      return ((t >>> 0) + 0.5) / 4294967296; // (0, 1)
    };
    const end = start + count;
    for (let i = start; i < end; i += 2) {
      const r = Math.sqrt(-2 * Math.log(next())) * scale;
      const th = 2 * Math.PI * next();
      out[i] = r * Math.cos(th);
      if (i + 1 < end) out[i + 1] = r * Math.sin(th);
    }
    this.#a = a;
    this.#b = b;
    this.#c = c;
    this.#d = d;
  }
  /** Fisher-Yates shuffle in place. */
  shuffle<T>(a: T[]): T[] {
    for (let i = a.length - 1; i > 0; i--) {
      const j = this.int(i + 1);
      [a[i], a[j]] = [a[j], a[i]];
    }
    return a;
  }
}

/** Derives a sub-seed (e.g. per case) from a run seed and a label. */
export function deriveSeed(seed: number, label: string): number {
  let h = (seed ^ 0x811c9dc5) >>> 0;
  for (let i = 0; i < label.length; i++) h = Math.imul(h ^ label.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** A fresh random seed (printed by the caller on failure). */
export function freshSeed(): number {
  return (Math.random() * 2 ** 32) >>> 0;
}
