/**
 * BENCH_PREFILL_CACHES and BENCH_PREFILL_GQA (bench/main.ts): the comma lists of cache dtypes
 * and of GQA group sizes for which the bench runs the prefill shapes again.
 * @module
 */
import type { KvCacheDType } from "../core/types.ts";
import { KV_CACHE_DTYPES } from "../core/types.ts";

/** The non-empty items of a comma list. */
const commaList = (text: string) => text.split(",").map((x) => x.trim()).filter((x) => x !== "");

/** BENCH_PREFILL_CACHES: a comma list of cache dtypes for the prefill shapes again, or an error. */
export function prefillCachesOf(text: string): KvCacheDType[] {
  const list = commaList(text);
  for (const x of list) {
    if (!(KV_CACHE_DTYPES as readonly string[]).includes(x)) {
      throw new Error(`BENCH_PREFILL_CACHES: "${x}" is not one of ${KV_CACHE_DTYPES.join(", ")}`);
    }
  }
  return list as KvCacheDType[];
}

/** BENCH_PREFILL_GQA: a comma list of GQA group sizes for the prefill shapes again, or an error. */
export function prefillGroupsOf(text: string): number[] {
  const list = commaList(text);
  for (const x of list) {
    if (!/^[1-9][0-9]?$/.test(x)) {
      throw new Error(`BENCH_PREFILL_GQA: "${x}" is not a group size from 1 to 99`);
    }
  }
  return list.map(Number);
}
