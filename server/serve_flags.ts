/**
 * The serve command line's flags as node:util `parseArgs` takes them, and their values as given
 * (strings and booleans, not yet checked: serve_options.ts `parseServeArgs` checks them).
 * @module
 */
import { parseArgs } from "node:util";

/** The flags `parseServeArgs` takes (node:util `parseArgs` options). */
export const SERVE_FLAGS = {
  port: { type: "string" },
  host: { type: "string" },
  "max-body-bytes": { type: "string" },
  "max-json-body-bytes": { type: "string" },
  "memory-budget-bytes": { type: "string" },
  "max-tokens-per-call": { type: "string" },
  "max-attended-keys": { type: "string" },
  "max-attention-flops": { type: "string" },
  "token-file": { type: "string" },
  "allow-unauthenticated": { type: "boolean" },
  "allowed-host": { type: "string", multiple: true },
  "shutdown-deadline-ms": { type: "string" },
  "body-timeout-ms": { type: "string" },
  "no-gpu": { type: "boolean" },
  "instance-name": { type: "string" },
  "http-workers": { type: "string" },
  "http-engine": { type: "string" },
  "device-threads": { type: "string" },
  "device-threads-http": { type: "boolean" },
  "keep-warm-ms": { type: "string" },
  "keep-warm-spin-iters": { type: "string" },
  "keep-warm-workgroups": { type: "string" },
  "keep-warm-depth": { type: "string" },
  "keep-warm-mode": { type: "string" },
  "keep-warm-period-ms": { type: "string" },
  "webgpu-runtime": { type: "string" },
  "dawn-flags": { type: "string" },
  "dawn-flag": { type: "string", multiple: true },
  help: { type: "boolean", short: "h" },
} as const;

/** The flags as given (strict: an unknown flag or a positional argument throws). */
export function serveFlagValues(args: string[]) {
  return parseArgs({ args, options: SERVE_FLAGS, strict: true, allowPositionals: false }).values;
}

/** The parsed flags, before their values are checked. */
export type ServeFlags = ReturnType<typeof serveFlagValues>;
