/**
 * The request header `X-Attention-Queue-Timeout-Ms` of the forward routes: a call's queue
 * timeout (core/queue_timeout.ts), checked before the body is read.
 * @module
 */
import { ServiceError } from "../core/errors.ts";
import { isQueueTimeoutMs, QUEUE_TIMEOUT_RULE } from "../core/queue_timeout.ts";
import { QUEUE_TIMEOUT_HEADER } from "../wire/names.ts";

/**
 * The header's value as a timeout: absent is undefined; the text must be a plain decimal number
 * (`20`, `0.5`; no sign, exponent or unit) within {@link QUEUE_TIMEOUT_RULE}.
 * @throws ServiceError 400 `invalid_header` naming the header and its value.
 */
export function parseQueueTimeoutHeader(value: string | null): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  const ms = /^\d+(\.\d+)?$/.test(text) ? Number(text) : NaN;
  if (isQueueTimeoutMs(ms)) return ms;
  const shown = JSON.stringify(value.length > 64 ? `${value.slice(0, 64)}...` : value);
  throw new ServiceError(
    `header ${QUEUE_TIMEOUT_HEADER} must be ${QUEUE_TIMEOUT_RULE} as a plain decimal; got ${shown}`,
    {
      status: 400,
      code: "invalid_header",
      extra: { header: QUEUE_TIMEOUT_HEADER, value: value.slice(0, 64) },
    },
  );
}

/**
 * Whether `req` carries a queue timeout header the forward routes refuse: a front that reads a
 * forward's body to route it (device threads) passes such a call on unread, to be refused
 * before its body as on one thread.
 */
export function badQueueTimeoutHeader(req: Request): boolean {
  try {
    parseQueueTimeoutHeader(req.headers.get(QUEUE_TIMEOUT_HEADER));
    return false;
  } catch {
    return true;
  }
}
