/**
 * The forward routes: `POST /v1/attention/forward` (the cache, if any, named by the body's
 * `kv_cache`) and `POST /v1/kv-caches/{id}/forward` (the cache named by the path, so a proxy can
 * route on it, and looked up before the body is read: a missing cache is a 404 whatever else is
 * wrong with the call; a body that names another `kv_cache` is a 400 `kv_cache_mismatch`). Either takes
 * a JSON or safetensors body and answers JSON or, with `Accept: application/octet-stream`,
 * safetensors. Each call's phases are measured for the metrics: `parse` (read and decode the
 * body) and `encode_response` here, the rest from the service's `timings`. The answer's
 * `Server-Timing` header carries `parse` (`parse;dur=MS`), so a client can tell the server's
 * share of a round trip outside the service's `total`; a refused call's problem carries it too
 * (the time until the body was decoded, or refused while reading or decoding it). Where the
 * backend's plan records its paths (WEBGPU_FLASH), the answer carries them: `X-Attention-Paths`
 * and, where a part is not on its preferred kernels, `X-Attention-Path-Reasons` (both made when
 * the plan was built; docs/api.md). A call may bound its wait to start with the header
 * `X-Attention-Queue-Timeout-Ms` (core/queue_timeout.ts: checked before the body is read; past
 * it the call is answered 503 `queue_timeout` without running).
 * @module
 */
import { isPooledBodyBuffer } from "./http1_body_pool.ts";
import { ServiceError } from "../core/errors.ts";
import { QUEUE_TIMEOUT_HEADER } from "../wire/names.ts";
import { parseQueueTimeoutHeader } from "./queue_timeout_header.ts";
import { readElsewhere, waitedBetweenThreads } from "./request_arrival.ts";
import type { AttentionService } from "../service/service.ts";
import {
  decodeBinaryForward,
  type DecodedForward,
  forwardJson,
  type ForwardOutcome,
  forwardSafetensors,
} from "../wire/codec.ts";
import { showValue } from "../wire/zod_issues.ts";
import { answerKind, bodyKind, type BodyLimits, readBody } from "./body.ts";
import type { JsonDecoder } from "./json_decoder.ts";
import { cacheIdParam } from "./cache_routes.ts";
import type { Metrics } from "./metrics.ts";
import { jsonResponse, SAFETENSORS } from "./responses.ts";
import { lentAnswerClaimed, lentBodyResponse } from "./lent_body.ts";
import { withErrorHeaders } from "./problem.ts";
import type { RouteContext, Router } from "./routes.ts";

/** Reads and decodes a forward body of either kind; `bytes` is the body as read. */
async function decode(
  req: Request,
  limits: BodyLimits,
  json: JsonDecoder,
): Promise<{ decoded: DecodedForward; binary: boolean; bytes: Uint8Array }> {
  const kind = bodyKind(req, ["json", "binary"]);
  // A safetensors body is borrowed: its tensors are uploaded (or copied) during the call, and
  // nothing keeps a view of them once the answer is built.
  const binary = kind === "binary";
  const bytes = await readBody(req, limits[kind], { whole: binary, borrow: binary });
  return kind === "json"
    ? { decoded: await json.decode(bytes), binary: false, bytes }
    : { decoded: decodeBinaryForward(bytes), binary: true, bytes };
}

/**
 * Frees a forward body's memory once its call is answered: the decoded tensors are views into
 * it, and nothing keeps them past the call (the plan cache, the plan tables and the caches
 * copy what they keep), so the buffer is detached (`transfer(0)`), which returns its memory
 * at once. Left to the collector, a decode step's 412 KB body a call adds up as external
 * memory, and V8 answers that with a full mark-compact about every 50 calls (measured on the
 * dev VM with `--trace-gc`: 35 in 2,000 stub calls, 2 with the bodies released). A buffer
 * handed on already (a JSON body sent to a decode worker) is detached and left alone, and one
 * the service's own HTTP/1.1 server lent from its pool (http1_body_pool.ts) goes back there.
 */
export function releaseBody(bytes: Uint8Array): void {
  const buf = bytes.buffer;
  if (isPooledBodyBuffer(buf)) return; // the HTTP/1.1 server's, reused once the answer is sent
  if (buf instanceof ArrayBuffer && !buf.detached && buf.byteLength > 0) buf.transfer(0);
}

/**
 * Points a decoded forward at the path's cache. A body naming the same cache is fine.
 * @throws ServiceError 400 `kv_cache_mismatch` when the body names another one.
 */
function onCache(d: DecodedForward, id: string, binary: boolean): DecodedForward {
  const named = d.input.kv_cache;
  if (named !== undefined && named !== id) {
    const path = binary ? ["__metadata__", "request", "kv_cache"] : ["kv_cache"];
    throw new ServiceError(
      `the body names kv_cache ${showValue(named)} but the path names cache ${showValue(id)}; ` +
        "leave kv_cache out of a call on /v1/kv-caches/{id}/forward",
      {
        status: 400,
        code: "kv_cache_mismatch",
        issues: [{ path, message: `is ${showValue(named)} but the path names ${showValue(id)}` }],
        extra: { cache_id: id },
      },
    );
  }
  return { ...d, input: { ...d.input, kv_cache: id } };
}

/**
 * The answer: safetensors parts streamed from the result's lent memory, released once the body
 * was delivered (server/lent_body.ts); or JSON, which copies the output, so the memory goes
 * back at once.
 */
function answer(
  kind: "json" | "binary",
  outcome: ForwardOutcome,
  encoding: DecodedForward["encoding"],
  headers: Record<string, string>,
): Response {
  const release = () => outcome.result.release?.();
  try {
    if (kind === "binary") {
      return lentBodyResponse(forwardSafetensors(outcome), release, {
        headers: { "content-type": SAFETENSORS, ...headers },
      });
    }
    const res = jsonResponse(forwardJson(outcome, encoding), 200, headers);
    release();
    return res;
  } catch (e) {
    release();
    throw e;
  }
}

/** Adds the forward routes. */
export function addForwardRoutes(
  router: Router,
  service: AttentionService,
  limits: BodyLimits,
  metrics: Metrics,
  json: JsonDecoder,
): void {
  // `pathId`: the cache route's raw `{id}` (checked inside, so that its 400 carries
  // Server-Timing as every answer of these routes does), or null for the body route.
  const run = async (ctx: RouteContext, pathId: string | null): Promise<Response> => {
    const { req } = ctx;
    const t0 = performance.now();
    let tParsed: number | null = null;
    let body: Awaited<ReturnType<typeof decode>> | null = null;
    // A body another thread read first (the device-threads front) counts that read too.
    const timing = () =>
      `parse;dur=${((tParsed ?? performance.now()) - t0 + readElsewhere(req)).toFixed(3)}`;
    try {
      const cacheId = pathId === null ? null : cacheIdParam(pathId);
      // 404 before reading a body meant for no cache (the body route's cache is in its body).
      if (cacheId !== null) service.getCache(cacheId);
      // 406 before reading the body: an answer nobody accepts is not computed.
      const answerAs = answerKind(req);
      const queueTimeoutMs = parseQueueTimeoutHeader(req.headers.get(QUEUE_TIMEOUT_HEADER));
      body = await decode(req, limits, json);
      const decoded = cacheId === null ? body.decoded : onCache(body.decoded, cacheId, body.binary);
      tParsed = performance.now();
      const outcome = await service.forward(decoded.input, {
        signal: req.signal,
        queueTimeoutMs,
        queueSince: performance.now() - waitedBetweenThreads(req),
        // `answer` releases the result at once for JSON, and a lent body once it was delivered
        // where the server says so (never while anything may still write it out).
        lendReadback: answerAs === "json" || lentAnswerClaimed(req),
      });
      const tRan = performance.now();
      const headers: Record<string, string> = {
        "x-attention-backend": outcome.backend,
        "server-timing": timing(),
      };
      const paths = outcome.result.paths;
      if (paths?.header) headers["x-attention-paths"] = paths.header;
      if (paths?.reasons_header) headers["x-attention-path-reasons"] = paths.reasons_header;
      const res = answer(answerAs, outcome, decoded.encoding, headers);
      const tEncoded = performance.now();
      metrics.recordForward(outcome.backend, (tRan - tParsed) / 1000);
      metrics.recordPhases(outcome.backend, {
        ...outcome.result.timings,
        parse: tParsed - t0,
        encode_response: tEncoded - tRan,
      });
      return res;
    } catch (e) {
      throw withErrorHeaders(e, { "server-timing": timing() });
    } finally {
      if (body) releaseBody(body.bytes); // a refused call's body too
    }
  };
  router.add("POST", "/v1/attention/forward", (ctx) => run(ctx, null));
  router.add("POST", "/v1/kv-caches/:id/forward", (ctx) => run(ctx, ctx.params.id));
}
