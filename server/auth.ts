/**
 * Who may call: a bearer token and a Host-header allow-list, checked before routing.
 *
 * - With a token configured, every route but the open ones (`/healthz`) needs
 *   `Authorization: Bearer <token>`; a missing or wrong token is a 401 problem `unauthorized`
 *   with `WWW-Authenticate: Bearer`. Tokens are compared in constant time (SHA-256 digests of
 *   both, compared with `timingSafeEqual`, so neither content nor length leaks).
 * - With an allow-list (a loopback bind without a token: the DNS-rebinding defence), a request
 *   whose `Host` names another host is a 403 problem `host_not_allowed`. A browser page of
 *   `evil.example` whose name was re-pointed at 127.0.0.1 still sends `Host: evil.example`.
 *
 * The startup policy (which bind needs a token, where the token comes from) is in
 * access_config.ts.
 * @module
 */
import { requestUrl, sentPath } from "./routes.ts";
import { createHash, timingSafeEqual } from "node:crypto";
import { problem } from "./problem.ts";
import type { ServiceError } from "../core/errors.ts";

/** Paths that need neither a token nor an allowed Host. */
export const OPEN_PATHS: readonly string[] = ["/healthz"];

/** The Host names a loopback bind accepts by default (any port). */
export const LOOPBACK_HOST_NAMES: readonly string[] = ["localhost", "127.0.0.1", "[::1]"];

/** What the handler enforces. */
export interface AccessPolicy {
  /** A bearer token every non-open route requires. */
  token?: string;
  /** Host names (lower case, no port) requests must carry; null or absent: no Host check. */
  allowedHosts?: readonly string[] | null;
}

const REALM = 'Bearer realm="attn-service"';

const digest = (s: string) => createHash("sha256").update(s, "utf8").digest();

/**
 * The host name of a `Host` header, lower case, without port or trailing dot; IPv6 literals
 * keep their brackets (`[::1]`). Null when the header is unparseable.
 */
export function hostName(header: string): string | null {
  let h = header.trim().toLowerCase();
  if (h.startsWith("[")) {
    const end = h.indexOf("]");
    if (end < 0) return null;
    const rest = h.slice(end + 1);
    if (rest !== "" && !/^:\d*$/.test(rest)) return null;
    return h.slice(0, end + 1);
  }
  const colon = h.indexOf(":");
  if (colon >= 0) {
    if (!/^\d*$/.test(h.slice(colon + 1))) return null;
    h = h.slice(0, colon);
  }
  if (h.endsWith(".")) h = h.slice(0, -1);
  return h === "" ? null : h;
}

/** The bearer token of an `Authorization` header, or null. */
export function bearerToken(header: string | null): string | null {
  if (header === null) return null;
  const m = /^\s*bearer\s+(\S+)\s*$/i.exec(header);
  return m ? m[1] : null;
}

/**
 * Builds the access check for a policy: `check(req)` returns normally or throws the 401 / 403
 * problem. The open paths are compared with the path as sent (routes.ts sentPath), the one the
 * router matches: a path `new URL` would turn into `/healthz` (`/x/..\\healthz`) is not open.
 */
export function accessCheck(policy: AccessPolicy): (req: Request) => void {
  const want = policy.token !== undefined ? digest(policy.token) : null;
  const hosts = policy.allowedHosts
    ? new Set(policy.allowedHosts.map((h) => h.toLowerCase()))
    : null;
  return (req) => {
    if (OPEN_PATHS.includes(sentPath(req))) return;
    if (hosts) {
      const header = req.headers.get("host");
      const name = header === null ? null : hostName(header);
      if (header !== null && (name === null || !hosts.has(name))) {
        throw hostNotAllowed(`Host ${JSON.stringify(header)}`, header, hosts);
      }
      // An absolute-form target ("GET http://evil.example/ HTTP/1.1") names the authority the
      // request is for, whatever its Host says (RFC 9112 3.2.2), and both engines build the
      // URL from it: where the URL's authority is not the Host's (both as URLs normalise them:
      // "[2001:db8:0::1]" is "[2001:db8::1]", ":80" drops), it must be an allowed name too.
      // Without a Host the URL's authority is the engine's own ("localhost", the bound
      // address), and such requests pass.
      const authority = header === null ? undefined : requestUrl(req)?.host;
      const target = authority === undefined ? null : hostName(authority);
      if (
        authority !== undefined && authority !== urlAuthority(header!) &&
        (target === null || !hosts.has(target))
      ) {
        throw hostNotAllowed(
          `the request target's authority ${JSON.stringify(authority)}`,
          authority,
          hosts,
        );
      }
    }
    if (want) {
      const header = req.headers.get("authorization");
      const got = bearerToken(header);
      if (got === null) {
        throw problem(
          401,
          "unauthorized",
          header === null
            ? "this server needs a bearer token: send Authorization: Bearer <token>"
            : "the Authorization header is not of the form Bearer <token>",
          undefined,
          { title: "Unauthorized", headers: { "www-authenticate": REALM } },
        );
      }
      if (!timingSafeEqual(digest(got), want)) {
        throw problem(401, "unauthorized", "the bearer token is not valid", undefined, {
          title: "Unauthorized",
          headers: { "www-authenticate": `${REALM}, error="invalid_token"` },
        });
      }
    }
  };
}

/** A Host header's authority as `new URL` normalises it, or null where none can be built. */
function urlAuthority(header: string): string | null {
  try {
    return new URL(`http://${header}`).host;
  } catch {
    return null;
  }
}

function hostNotAllowed(what: string, host: string, hosts: Set<string>): ServiceError {
  return problem(
    403,
    "host_not_allowed",
    `${what} is not one this server answers to; allowed: ${
      [...hosts].join(", ")
    } (add names with --allowed-host)`,
    { host, allowed_hosts: [...hosts] },
    { title: "Forbidden" },
  );
}

/** {@link accessCheck} as a yes/no (the HTTP fronts skip reading the body of a refused request). */
export function accessAllowed(policy: AccessPolicy): (req: Request) => boolean {
  const check = accessCheck(policy);
  return (req) => {
    try {
      check(req);
      return true;
    } catch {
      return false;
    }
  };
}
