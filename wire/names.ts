/**
 * The names of the wire contract that are plain values, without zod (so a client that needs
 * only them loads no schema): the cache id rule, the instance name rule, the header that
 * carries an instance's name and the one that bounds a call's wait to start.
 * @module
 */

/** Longest cache id. */
export const CACHE_ID_MAX_LENGTH = 128;

/** The cache id rule in words (messages and docs). */
export const CACHE_ID_RULE =
  "1-128 characters of A-Z a-z 0-9 . _ - starting with a letter or digit";

/**
 * A cache id: 1 to 128 characters of `A-Z a-z 0-9 . _ -`, starting with a letter or digit
 * (URL-safe without escaping, never `.` or `..`, and what deploy/nginx.conf.template's `map`
 * takes from the path). Server-chosen ids (random UUIDs) fit.
 */
export const CACHE_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/** An instance name (`--instance-name`): like a cache id, at most 64 characters. */
export const INSTANCE_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

/** The response header naming the instance that answered (every answer, when it has a name). */
export const INSTANCE_HEADER = "x-attention-instance";

/**
 * The request header of a forward call's queue timeout, in milliseconds (`20`, `0.5`): past it
 * the call is answered 503 `queue_timeout` without running (core/queue_timeout.ts).
 */
export const QUEUE_TIMEOUT_HEADER = "x-attention-queue-timeout-ms";
