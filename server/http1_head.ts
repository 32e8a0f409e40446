/**
 * An HTTP/1.1 request head (RFC 9112 sections 3 to 6) parsed from bytes, for the service's own
 * HTTP/1.1 server (http1_server.ts): the request line, the header fields, and what frames the
 * body (Content-Length or chunked), with every refusal a {@link HeadProblem} that names the
 * field and its value. Pure: no I/O.
 *
 * Kept strict where leniency lets two parties read one message two ways (request smuggling):
 * obsolete line folding, whitespace before a field's colon, a bare LF, Transfer-Encoding with
 * Content-Length, several Content-Length values that differ, and a transfer coding other than
 * a final `chunked` are all refused, and the connection closes after the answer.
 * @module
 */

import { isToken, validTarget, validValue } from "./http1_syntax.ts";

/** A parsed request head. */
export interface RequestHead {
  /** As sent (methods are case-sensitive: `get` is not `GET`). */
  method: string;
  /** The request target as sent (origin-form `/path?q`, absolute-form, `*`). */
  target: string;
  /** 0 for HTTP/1.0, 1 for HTTP/1.1. */
  minor: 0 | 1;
  /** Field lines in order, names lowercased. */
  headers: [string, string][];
  /** The Host field's value (null: none). */
  host: string | null;
  /** Content-Length, or -1 when none (or chunked). */
  contentLength: number;
  /** Transfer-Encoding: chunked. */
  chunked: boolean;
  /** The connection may stay open after the answer (as far as the request says). */
  keepAlive: boolean;
  /** `Expect: 100-continue`. */
  expectContinue: boolean;
}

/** Why a head was refused: the answer's status and problem code, and the field at fault. */
export interface HeadProblem {
  status: number;
  code: string;
  detail: string;
  /** The problem's structured fields (the field's name and value). */
  extra: Record<string, unknown>;
}

/** The largest request head taken (request line and fields), bytes: 64 KiB. */
export const MAX_HEAD_BYTES = 64 * 1024;

/** The most header fields a request may carry (Deno.serve's hyper takes 128 too). */
export const MAX_HEADER_FIELDS = 128;

/**
 * Index just past the head's blank line in `buf[from, to)`, or -1. Lines may end in a bare LF
 * (RFC 9112 2.2 lets a recipient take one, as Deno.serve does): the blank line is an LF after
 * an LF, with or without a CR between.
 */
export function headEnd(buf: Uint8Array, from: number, to: number): number {
  for (let i = Math.max(from, 1); i < to; i++) {
    if (buf[i] !== 10) continue;
    if (buf[i - 1] === 10) return i + 1;
    if (buf[i - 1] === 13 && i >= 2 && buf[i - 2] === 10) return i + 1;
  }
  return -1;
}

function bad(detail: string, extra: Record<string, unknown>, status = 400): HeadProblem {
  return { status, code: status === 400 ? "bad_request" : codeOf(status), detail, extra };
}

function codeOf(status: number): string {
  switch (status) {
    case 431:
      return "headers_too_large";
    case 501:
      return "not_implemented";
    case 505:
      return "http_version_not_supported";
    default:
      return "bad_request";
  }
}

/**
 * Bytes as ISO-8859-1, one character a byte: how the engine reads heads, chunk lines and
 * methods. (TextDecoder's "latin1" is windows-1252: 0x80-0x9F become "€" and the like, which
 * Headers refuses, and a UTF-8 em dash in a User-Agent was a 501.)
 */
export function isoLatin1(b: Uint8Array): string {
  let s = "";
  for (let i = 0; i < b.length; i += 8192) s += String.fromCharCode(...b.subarray(i, i + 8192));
  return s;
}

/** The head in `buf[0, end)` (`end` from {@link headEnd}), or why it is refused. */
export function parseHead(buf: Uint8Array, end: number): RequestHead | HeadProblem {
  const lines = isoLatin1(buf.subarray(0, end)).split("\n");
  lines.length -= 2; // the blank line and what follows its LF
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i].endsWith("\r") ? lines[i].slice(0, -1) : lines[i];
    if (l.includes("\r")) return bad("request head has a bare CR", {});
    lines[i] = l;
  }
  const first = parseRequestLine(lines[0]);
  if ("status" in first) return first;
  if (lines.length - 1 > MAX_HEADER_FIELDS) {
    return bad(
      `request has ${lines.length - 1} header fields, over the ${MAX_HEADER_FIELDS} taken`,
      {
        header_fields: lines.length - 1,
        max_header_fields: MAX_HEADER_FIELDS,
      },
      431,
    );
  }
  const headers: [string, string][] = [];
  for (let i = 1; i < lines.length; i++) {
    const f = parseField(lines[i]);
    if ("status" in f) return f;
    headers.push(f);
  }
  return framing({ ...first, headers });
}

function parseRequestLine(
  line: string,
): Pick<RequestHead, "method" | "target" | "minor"> | HeadProblem {
  const parts = line.split(" ");
  if (parts.length !== 3) {
    return bad(
      `request line ${JSON.stringify(line.slice(0, 200))} is not "METHOD target HTTP/1.x"`,
      {
        request_line: line.slice(0, 200),
      },
    );
  }
  const [method, target, version] = parts;
  if (!isToken(method)) {
    return bad(`request method ${JSON.stringify(method.slice(0, 64))} is not a token`, {
      method: method.slice(0, 64),
    });
  }
  if (!validTarget(target)) {
    return bad(`request target ${JSON.stringify(target.slice(0, 200))} is not valid`, {
      target: target.slice(0, 200),
    });
  }
  const form = target[0] === "/" || /^[a-zA-Z][a-zA-Z0-9+.-]*:\/\//.test(target) ||
    (target === "*" && method === "OPTIONS");
  if (!form) {
    return bad(
      `request target ${JSON.stringify(target.slice(0, 200))} is not origin-form ("/path"), ` +
        'absolute-form ("http://host/path") or "*" (OPTIONS)',
      { target: target.slice(0, 200) },
    );
  }
  if (version === "HTTP/1.1" || version === "HTTP/1.0") {
    return { method, target, minor: version === "HTTP/1.1" ? 1 : 0 };
  }
  if (/^HTTP\/\d\.\d$/.test(version)) {
    return bad(`HTTP version ${version} is not served (HTTP/1.1 and HTTP/1.0 are)`, {
      version,
    }, 505);
  }
  return bad(`request line's version ${JSON.stringify(version.slice(0, 32))} is not HTTP/1.x`, {
    version: version.slice(0, 32),
  });
}

function parseField(line: string): [string, string] | HeadProblem {
  if (line.length === 0) return bad("request head has an empty line before its end", {});
  if (line[0] === " " || line[0] === "\t") {
    return bad("request head folds a field over lines (obsolete line folding)", {
      line: line.slice(0, 200),
    });
  }
  const colon = line.indexOf(":");
  const name = colon < 0 ? line : line.slice(0, colon);
  if (colon < 0 || !isToken(name)) {
    return bad(`header field ${JSON.stringify(name.slice(0, 100))} has no valid name`, {
      header: name.slice(0, 100),
    });
  }
  const value = line.slice(colon + 1).replace(/^[ \t]+|[ \t]+$/g, "");
  if (!validValue(value)) {
    return bad(`header field ${name} has a control character in its value`, {
      header: name.toLowerCase(),
    });
  }
  return [name.toLowerCase(), value];
}

/** Host, Content-Length, Transfer-Encoding, Connection and Expect, checked. */
function framing(
  h: Omit<RequestHead, "host" | "contentLength" | "chunked" | "keepAlive" | "expectContinue">,
): RequestHead | HeadProblem {
  let host: string | null = null, hosts = 0;
  let length = -1;
  let te: string | null = null;
  const connection: string[] = [];
  let expect: string | null = null;
  for (const [name, value] of h.headers) {
    switch (name) {
      case "host":
        hosts++;
        host = value;
        break;
      case "content-length": {
        const n = /^\d{1,15}$/.test(value) ? Number(value) : NaN;
        if (Number.isNaN(n)) {
          return bad(`Content-Length ${JSON.stringify(value.slice(0, 64))} is not a byte count`, {
            content_length: value.slice(0, 64),
          });
        }
        if (length >= 0 && n !== length) {
          return bad(`Content-Length is sent twice with different values (${length}, ${n})`, {
            content_length: value,
          });
        }
        length = n;
        break;
      }
      case "transfer-encoding":
        te = te === null ? value : `${te}, ${value}`;
        break;
      case "connection":
        connection.push(...value.toLowerCase().split(",").map((s) => s.trim()));
        break;
      case "expect":
        expect = value.toLowerCase();
        break;
    }
  }
  if (h.minor === 1 && hosts !== 1) {
    return bad(`an HTTP/1.1 request carries one Host field; this one has ${hosts}`, {
      host_fields: hosts,
    });
  }
  let chunked = false;
  if (te !== null) {
    if (length >= 0) {
      return bad("request has both Transfer-Encoding and Content-Length", {
        transfer_encoding: te,
      });
    }
    const codings = te.toLowerCase().split(",").map((c) => c.trim());
    if (h.minor === 0 || codings.length !== 1 || codings[0] !== "chunked") {
      // chunked applied twice is the client's mistake (RFC 9112 6.1), not a coding not served.
      const twice = codings.filter((c) => c === "chunked").length > 1;
      return bad(
        twice
          ? `Transfer-Encoding ${JSON.stringify(te.slice(0, 64))} applies chunked more than once`
          : `Transfer-Encoding ${JSON.stringify(te.slice(0, 64))} is not served (chunked is)`,
        {
          transfer_encoding: te.slice(0, 64),
        },
        h.minor === 0 || twice ? 400 : 501,
      );
    }
    chunked = true;
  }
  if (expect !== null && expect !== "100-continue") {
    return {
      status: 417,
      code: "expectation_failed",
      detail: `Expect ${JSON.stringify(expect.slice(0, 64))} is not met (100-continue is)`,
      extra: { expect: expect.slice(0, 64) },
    };
  }
  // "close" wins over "keep-alive" (RFC 9112 9.3); HTTP/1.0 closes unless it asks for keep-alive.
  const keepAlive = !connection.includes("close") &&
    (h.minor === 1 || connection.includes("keep-alive"));
  return {
    ...h,
    host,
    contentLength: length,
    chunked,
    keepAlive,
    expectContinue: expect === "100-continue" && h.minor === 1,
  };
}
