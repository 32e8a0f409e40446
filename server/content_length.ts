/**
 * The value of a request's Content-Length header, as the body reads (body_read.ts,
 * body_whole_read.ts) and the head checks (head_refusal.ts) take it.
 * @module
 */

/**
 * The value of a Content-Length header: -1 when absent, NaN when it is not a decimal count
 * (leading and trailing blanks allowed).
 */
export function contentLength(header: string | null): number {
  if (header === null) return -1;
  const v = header.trim();
  if (v.length === 0) return NaN;
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c < 48 || c > 57) return NaN;
  }
  return Number(v);
}
