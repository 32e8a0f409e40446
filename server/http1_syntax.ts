/**
 * The character rules an HTTP/1.1 request head's parts must follow (RFC 9110 5.5 and 5.6.2,
 * RFC 9112 3.2), for the head parser (http1_head.ts): a token (methods, field names), a field
 * value's characters, and a request target's. Pure: no I/O.
 * @module
 */

// tchar (RFC 9110 5.6.2) as a 128-entry table.
const TCHAR = new Uint8Array(128);
for (const c of "!#$%&'*+-.^_`|~") TCHAR[c.charCodeAt(0)] = 1;
for (let c = 48; c < 58; c++) TCHAR[c] = 1;
for (let c = 65; c < 91; c++) TCHAR[c] = 1;
for (let c = 97; c < 123; c++) TCHAR[c] = 1;

/** `s` is a token: one or more tchars. */
export function isToken(s: string): boolean {
  if (s.length === 0) return false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 128 || TCHAR[c] === 0) return false;
  }
  return true;
}

/** A field value's characters are VCHAR, obs-text, SP or HTAB (no CR, LF or NUL). */
export function validValue(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if ((c < 32 && c !== 9) || c === 127) return false;
  }
  return true;
}

/** A request target: visible ASCII, no spaces. */
export function validTarget(s: string): boolean {
  if (s.length === 0) return false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c <= 32 || c >= 127) return false;
  }
  return true;
}
