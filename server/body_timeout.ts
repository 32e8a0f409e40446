/**
 * How long a request body may go without new bytes (nginx's `client_body_timeout`): the limit,
 * the 408 past it, and a stream read that gives up after it. body_read.ts applies it to every
 * body read, in whichever isolate reads bodies.
 * @module
 */
import { ServiceError } from "../core/errors.ts";
import { envVar } from "../core/env.ts";

/** The environment variable {@link bodyTimeoutMs} reads (`--body-timeout-ms` sets it). */
export const BODY_TIMEOUT_ENV = "ATTN_BODY_TIMEOUT_MS";

/** The default {@link bodyTimeoutMs}: nginx's `client_body_timeout`, 60 s. */
export const DEFAULT_BODY_TIMEOUT_MS = 60_000;

/**
 * How long a body may go without new bytes, in ms (`ATTN_BODY_TIMEOUT_MS`, set by the serve
 * flag `--body-timeout-ms`; default 60 s): a streamed read waits at most this long for each
 * chunk, and a body read in one piece (body_read.ts `wholeBody`) gets this long plus 1 s per MiB
 * declared (it sees no chunks). Past it the read ends `timeout`: a 408 `body_timeout`, the
 * request's connection closed. Read from the environment each time, so every isolate that
 * reads bodies (HTTP workers, the device-threads front) has the same limit.
 */
export function bodyTimeoutMs(): number {
  const v = Number(envVar(BODY_TIMEOUT_ENV) ?? DEFAULT_BODY_TIMEOUT_MS);
  return Number.isFinite(v) && v > 0 ? v : DEFAULT_BODY_TIMEOUT_MS;
}

/** A body's bytes stopped coming: 408 with how long was waited and what had arrived. */
export function timedOut(got: number, declared: number, ms: number): ServiceError {
  const of = declared >= 0 ? ` of the ${declared} declared` : "";
  const after = got >= 0 ? ` after ${got}${of} bytes` : ` of ${declared} declared bytes`;
  return new ServiceError(
    `request body stalled${after}: no bytes for ${ms} ms (body_timeout_ms ${ms})`,
    {
      status: 408,
      code: "body_timeout",
      extra: { body_timeout_ms: ms, ...(got >= 0 ? { received_bytes: got } : {}) },
    },
  );
}

/** The reader's next chunk, or null when none comes within `ms`. */
export async function readWithin(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  ms: number,
): Promise<ReadableStreamReadResult<Uint8Array> | null> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const late = new Promise<null>((r) => timer = setTimeout(() => r(null), ms));
    return await Promise.race([reader.read(), late]);
  } finally {
    clearTimeout(timer);
  }
}
