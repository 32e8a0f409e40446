/**
 * The finiteness scan of data tensors (core/data.ts `firstNonFinite`), which reads 32-bit
 * words and tests both halves of a half-precision word at once: it must find exactly the
 * first NaN or infinity a per-element test finds, wherever it sits (the first and last
 * element, either half of a word, a block boundary, an odd tail), in every dtype, at any
 * byte offset, and must take every finite pattern (the largest finite values, subnormals,
 * negative zero, every sign) as finite. `elementAt` decodes the element it names.
 */
import assert from "node:assert/strict";
import {
  checksFiniteOnDevice,
  dataArray,
  deviceFiniteCheckBytes,
  elementAt,
  firstNonFinite,
  fromFloats,
} from "../../core/data.ts";
import { roundTo } from "../../core/dtype.ts";
import type { DataArray, DType } from "../../core/types.ts";
import { Rng } from "../support/rng.ts";

const DTYPES: DType[] = ["float32", "float16", "bfloat16"];
const size = (d: DType) => (d === "float32" ? 4 : 2);

/** The first non-finite element by decoding each one (the scan's oracle). */
function naive(a: DataArray): number {
  for (let i = 0; i < a.length; i++) if (!Number.isFinite(elementAt(a, i))) return i;
  return -1;
}

/** `n` random finite bit patterns of `d` (every exponent but the all-ones one, any sign). */
function finiteBits(d: DType, n: number, rng: Rng): Uint8Array {
  const bytes = new Uint8Array(n * size(d));
  const dv = new DataView(bytes.buffer);
  for (let i = 0; i < n; i++) {
    const u = rng.u32();
    if (d === "float32") {
      const e = (u >>> 23) & 0xff;
      dv.setUint32(4 * i, e === 0xff ? u & ~0x00800000 : u, true);
    } else {
      const h = u & 0xffff, m = d === "float16" ? 0x7c00 : 0x7f80;
      dv.setUint16(2 * i, (h & m) === m ? h & ~(d === "float16" ? 0x0400 : 0x0080) : h, true);
    }
  }
  return bytes;
}

/** Writes a non-finite pattern (NaN, +inf or -inf, by `kind`) at element `i`. */
function poison(d: DType, bytes: Uint8Array, i: number, kind: number): void {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (d === "float32") {
    dv.setUint32(4 * i, [0x7fc00001, 0x7f800000, 0xff800000][kind], true);
  } else if (d === "float16") dv.setUint16(2 * i, [0x7e01, 0x7c00, 0xfc00][kind], true);
  else dv.setUint16(2 * i, [0x7fc1, 0x7f80, 0xff80][kind], true);
}

Deno.test("firstNonFinite: finds exactly the first bad element, anywhere", () => {
  const seed = (Math.random() * 2 ** 32) >>> 0;
  const rng = new Rng(seed);
  for (const d of DTYPES) {
    const per = d === "float32" ? 1 : 2;
    for (const n of [1, 2, 3, 7, 4096 * per - 1, 4096 * per, 4096 * per + 1, 3 * 4096 * per + 5]) {
      const clean = finiteBits(d, n, rng);
      assert.equal(firstNonFinite(dataArray(d, clean)), -1, `${d} n=${n} finite (seed ${seed})`);
      const spots = new Set([0, n - 1, Math.min(n - 1, 1), rng.int(n), rng.int(n)]);
      for (const b of [4096 * per - 1, 4096 * per, 2 * 4096 * per + 1]) if (b < n) spots.add(b);
      for (const at of spots) {
        const bytes = clean.slice();
        poison(d, bytes, at, rng.int(3));
        const later = at + 1 + rng.int(Math.max(1, n - at));
        if (later < n) poison(d, bytes, later, rng.int(3)); // a second one after it
        const a = dataArray(d, bytes);
        assert.equal(firstNonFinite(a), at, `${d} n=${n} bad at ${at} (seed ${seed})`);
        assert.equal(firstNonFinite(a), naive(a));
      }
    }
  }
});

Deno.test("firstNonFinite: the largest, smallest and signed finite values are finite", () => {
  const values = [0, -0, 1, -1, 65504, -65504, 6e-8, -6e-8, 3.3895e38, -3.3895e38, 1e-40];
  for (const d of DTYPES) {
    const a = fromFloats(d, values.filter((v) => d !== "float16" || Math.abs(v) <= 65504));
    assert.equal(firstNonFinite(a), -1, d);
  }
  // Every float16 and bfloat16 pattern, one by one and packed two to a word.
  for (const d of ["float16", "bfloat16"] as const) {
    const all = new Uint16Array(65536).map((_, i) => i);
    const a = dataArray(d, new Uint8Array(all.buffer));
    const first = d === "float16" ? 0x7c00 : 0x7f80;
    assert.equal(firstNonFinite(a), first, `${d}: first non-finite pattern`);
    for (let h = 0; h < 65536; h++) {
      const one = dataArray(d, new Uint8Array(new Uint16Array([0x3c00, h]).buffer));
      assert.equal(firstNonFinite(one), naive(one), `${d} pattern ${h.toString(16)}`);
    }
  }
});

Deno.test("firstNonFinite: data at any byte offset", () => {
  const rng = new Rng(7);
  for (const d of DTYPES) {
    const n = 9001, e = size(d);
    const bytes = finiteBits(d, n, rng);
    poison(d, bytes, 8000, 0);
    for (const shift of [0, 2, 4]) {
      if (shift % e !== 0 && d === "float32") continue;
      const host = new Uint8Array(bytes.byteLength + 8);
      host.set(bytes, shift);
      const a: DataArray = { dtype: d, length: n, bytes: host.subarray(shift, shift + n * e) };
      assert.equal(firstNonFinite(a), 8000, `${d} at byte offset ${shift}`);
      assert.ok(Number.isNaN(elementAt(a, 8000)));
      assert.equal(elementAt(a, 3), elementAt(dataArray(d, bytes), 3));
    }
  }
});

Deno.test("elementAt: decodes one element of each dtype", () => {
  const v = [1.5, -2.25, 65504, 0.099975586];
  for (const d of DTYPES) {
    const a = fromFloats(d, v);
    for (let i = 0; i < v.length; i++) {
      assert.equal(elementAt(a, i), roundTo(d, v[i]), `${d}[${i}]`);
    }
  }
  assert.equal(elementAt(fromFloats("float16", [Infinity]), 0), Infinity);
});

Deno.test("data: issue 7's decode step is checked for NaN on the device, one token on the host", () => {
  // 32 requests x 1 token, 32 q / 8 kv heads, head 128, f16: 393 KB the host would scan.
  const step = { dtype: "float16" as const, num_tokens: 32, num_kv_tokens: 32 };
  const layer = { num_heads: 32, num_kv_heads: 8, head_size: 128 };
  assert.ok(deviceFiniteCheckBytes() <= 393_216, `${deviceFiniteCheckBytes()} B threshold`);
  assert.equal(checksFiniteOnDevice({ ...step, layer }), true);
  assert.equal(checksFiniteOnDevice({ ...step, num_tokens: 1, num_kv_tokens: 1, layer }), false);
});
