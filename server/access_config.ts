/**
 * The startup access policy: a bind address that is not loopback needs a bearer token (from
 * `--token-file PATH`, else the `ATTN_TOKEN` environment variable) unless
 * `--allow-unauthenticated` says otherwise (then with a warning); a token, once configured,
 * applies on any address; a loopback bind without a token checks the Host header against
 * loopback names, the bound address and `--allowed-host` names (the DNS-rebinding defence).
 * @module
 */
import { type AccessPolicy, hostName, LOOPBACK_HOST_NAMES } from "./auth.ts";

/** The inputs of {@link resolveAccess}. */
export interface AccessInputs {
  host: string;
  tokenFile?: string;
  allowUnauthenticated: boolean;
  allowedHosts: string[];
}

/** What the server enforces, and what to print at startup. */
export interface ResolvedAccess {
  policy: AccessPolicy;
  /** Printed to stderr at startup (the unauthenticated-exposure warning). */
  warning?: string;
  /** Where the token came from, for the startup line. */
  tokenSource?: "token-file" | "ATTN_TOKEN";
}

/** A refused configuration: main.ts prints the message and exits 2. */
export class AccessConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "AccessConfigError";
  }
}

/** True for addresses only this machine can reach: 127.0.0.0/8, ::1, localhost. */
export function isLoopbackAddress(host: string): boolean {
  const h = host.trim().toLowerCase().replace(/^\[(.*)\]$/, "$1");
  if (h === "localhost" || h === "::1" || h === "0:0:0:0:0:0:0:1") return true;
  const m = /^127\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(h);
  return m !== null && m.slice(1).every((x) => Number(x) <= 255);
}

function checkToken(token: string, where: string): string {
  if (token === "") throw new AccessConfigError(`${where} is empty`);
  if (/\s/.test(token)) {
    throw new AccessConfigError(`${where} holds whitespace inside the token; one token, no spaces`);
  }
  return token;
}

/** Reads the token: the file's content without surrounding whitespace, else ATTN_TOKEN. */
function readToken(
  tokenFile: string | undefined,
  env: (name: string) => string | undefined,
): { token: string; source: "token-file" | "ATTN_TOKEN" } | null {
  if (tokenFile !== undefined) {
    let text: string;
    try {
      text = Deno.readTextFileSync(tokenFile);
    } catch (e) {
      throw new AccessConfigError(
        `--token-file ${tokenFile}: cannot read it (${e instanceof Error ? e.message : e})`,
      );
    }
    return { token: checkToken(text.trim(), `--token-file ${tokenFile}`), source: "token-file" };
  }
  const v = env("ATTN_TOKEN");
  if (v === undefined || v === "") return null;
  return { token: checkToken(v.trim(), "ATTN_TOKEN"), source: "ATTN_TOKEN" };
}

/**
 * The policy for a bind address and the auth flags.
 * @throws AccessConfigError when a non-loopback bind has no token and no
 * `--allow-unauthenticated`, or the token cannot be read.
 */
export function resolveAccess(
  o: AccessInputs,
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): ResolvedAccess {
  const t = readToken(o.tokenFile, env);
  const loopback = isLoopbackAddress(o.host);
  if (t) return { policy: { token: t.token }, tokenSource: t.source };
  if (loopback) {
    // The bound address too (127.0.0.2, ...): a request addressed to it names it in its Host.
    const bound = hostName(
      o.host.includes(":") && !o.host.startsWith("[") ? `[${o.host}]` : o.host,
    );
    const extra = [bound ?? "", ...o.allowedHosts.map((h) => h.trim().toLowerCase())];
    const names = new Set([...LOOPBACK_HOST_NAMES, ...extra.filter((h) => h !== "")]);
    return { policy: { allowedHosts: [...names] } };
  }
  if (!o.allowUnauthenticated) {
    throw new AccessConfigError(
      `refusing to serve on ${o.host} without a token: anyone who can reach it could read, ` +
        "write and delete every cache. Give a bearer token with --token-file PATH or the " +
        "ATTN_TOKEN environment variable, bind to 127.0.0.1, or pass --allow-unauthenticated.",
    );
  }
  return {
    policy: {},
    warning: `WARNING: serving on ${o.host} with no authentication (--allow-unauthenticated): ` +
      "anyone who can reach this address can read, write and delete every cache",
  };
}
