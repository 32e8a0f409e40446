/**
 * What the client refuses before sending, with the problem the server would answer: a
 * `queueTimeoutMs` outside the header's rule (400 `invalid_header`), and a forward body with a
 * NaN or an infinity outside its tensors' data (422 `invalid_batch`).
 * @module
 */
import { nonFiniteField } from "../wire/client_codec.ts";
import { QUEUE_TIMEOUT_HEADER } from "../wire/names.ts";
import type { ForwardBody } from "../wire/types.ts";
import { AttentionApiError } from "./api_error.ts";
import { isQueueTimeoutMs, QUEUE_TIMEOUT_RULE } from "../core/queue_timeout.ts";
import { shownValue } from "../core/shown.ts";

/**
 * `queueTimeoutMs` as the header's plain decimal (`1e-7` as `0.0000001`), or the server's 400
 * `invalid_header` for a value it refuses (its rule: core/queue_timeout.ts), without sending the
 * call.
 */
export function queueTimeoutText(ms: number): string {
  if (isQueueTimeoutMs(ms)) {
    return ms.toLocaleString("en-US", { useGrouping: false, maximumSignificantDigits: 21 });
  }
  const got = shownValue(ms);
  throw new AttentionApiError(400, {
    type: "urn:attn-service:problem:invalid_header",
    title: "Bad Request",
    status: 400,
    detail: `queueTimeoutMs must be ${QUEUE_TIMEOUT_RULE}; got ${got} (refused by the client)`,
    code: "invalid_header",
    header: QUEUE_TIMEOUT_HEADER,
    value: got.slice(0, 64),
  });
}

/**
 * Refuses a body with a NaN or an infinity outside its tensors' data, as the server refuses
 * such a value (422 `invalid_batch`): JSON text would carry it as `null`, the default, and the
 * call would run without it (wire/client_codec.ts nonFiniteField).
 */
export function refuseNonFinite(body: ForwardBody): void {
  const hit = nonFiniteField(body);
  if (!hit) return;
  const at = hit.path.join(".");
  throw new AttentionApiError(422, {
    type: "urn:attn-service:problem:invalid_batch",
    title: "Unprocessable Content",
    status: 422,
    detail: `${at} is ${hit.value}: JSON has no such number, and sent it would read as null ` +
      "(the default) (refused by the client)",
    code: "invalid_batch",
    issues: [{ path: hit.path, message: `must be a finite number; got ${hit.value}` }],
  });
}
