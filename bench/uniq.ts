/**
 * The distinct items of a list, in the order first seen (the backends that answered a bench
 * phase: bench/http_run_prefill.ts, bench/http_run_decode.ts).
 * @module
 */

export const uniq = (xs: string[]) => [...new Set(xs)];
