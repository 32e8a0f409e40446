/**
 * A device thread's own listener (`--device-threads N --device-threads-http`,
 * device_threads.ts): the thread serves the port beside the others (`reusePort`: the kernel
 * spreads connections over the threads; Linux) and answers the calls on caches it holds itself,
 * with the same handler as a request the front sent it, so such a call never crosses a thread.
 * Everything else goes to the main thread's front through a RequestSender on a port of its own
 * (request_sender.ts), as an HTTP worker's requests do: creates (`POST /v1/kv-caches`, `PUT` of
 * a cache), which the front places on this thread when it has room ({@link ORIGIN_HEADER}),
 * deletes (the front keeps the placement), `/metrics` (merged over the threads), calls on
 * caches of other threads, and anything whose body did not arrive whole.
 *
 * Which calls stay here: a cache route (`/v1/kv-caches/{id}/...`, and `GET`/`HEAD` of the cache)
 * whose cache this thread's service holds now, and a `POST /v1/attention/forward` whose body
 * names one (server/forward_cache_id.ts). A cache deleted meanwhile is answered as the thread
 * would answer it after the delete (404), as through the front.
 * @module
 */
import { mediaType } from "./body.ts";
import type { StreamedBody } from "./body_read.ts";
import { setPreReadBody } from "./body_read.ts";
import { keepRead } from "./request_arrival.ts";
import { findForwardCacheId, type ScanWorker } from "./forward_cache_id.ts";
import { badQueueTimeoutHeader } from "./queue_timeout_header.ts";
import { claimLentAnswer, lentAnswerClaimed, serveLentBodies } from "./lent_body.ts";
import type { ErrorLogger } from "./problem.ts";
import type { RequestSender } from "./request_sender.ts";
import { SAFETENSORS } from "./responses.ts";
import { keepSentPath, requestUrl, sentPath, urlAsSent } from "./routes.ts";
import { type ResilientServer, serveResilient } from "./serve_resilient.ts";

/**
 * The header a thread adds to a create it passes to the front: `<thread index> <token>` (the
 * front's token: a client cannot steer placement with it). The front then places the new cache
 * on that thread when it has room, so the connection's later calls stay there.
 */
export const ORIGIN_HEADER = "x-attention-origin-thread";

/** What a thread's listener needs (device_thread.ts passes it). */
export interface ThreadHttpOptions {
  index: number;
  port: number;
  hostname: string;
  /** The front's token for {@link ORIGIN_HEADER}. */
  token: string;
  /** The thread's handler (the service's). */
  handler: (req: Request) => Promise<Response>;
  /** Wraps what serves the port (the thread's drainer, the instance header). */
  wrap: (h: (req: Request) => Promise<Response>) => (req: Request) => Promise<Response>;
  /** Whether this thread's service holds cache `id` now. */
  holds: (id: string) => boolean;
  /** Passes a request to the front (and its answer back). */
  front: RequestSender;
  scans: ScanWorker;
  onListen: (addr: { hostname: string; port: number }) => void;
  log: ErrorLogger;
}

/** The cache id of a path under /v1/kv-caches/ (decoded as the route does), and what follows. */
export function cachePath(path: string): { id: string; rest: string } | null {
  const m = /^\/v1\/kv-caches\/([^/]+)(\/.*)?$/.exec(path);
  if (!m) return null;
  let id = m[1];
  try {
    id = decodeURIComponent(id);
  } catch { /* the handler names the bad id */ }
  return { id, rest: m[2] ?? "" };
}

/** `req` again, with its body read already (`body`), as the handler takes a pre-read body. */
function withBody(req: Request, body: StreamedBody): Request {
  const bytes = body.bytes;
  const stream = new ReadableStream<Uint8Array>({
    pull(c) {
      if (bytes.byteLength > 0) c.enqueue(bytes);
      c.close();
    },
  });
  const again = new Request(req.url, {
    method: req.method,
    headers: req.headers,
    body: stream,
    signal: req.signal,
  });
  setPreReadBody(again, Promise.resolve(body));
  keepRead(again, body.readMs ?? 0); // Server-Timing's parse counts this thread's read
  keepSentPath(again, sentPath(req), urlAsSent(req));
  if (lentAnswerClaimed(req)) claimLentAnswer(again); // the same listener answers it
  return again;
}

/** Serves the port on this thread; see the module doc. */
export function serveThreadHttp(o: ThreadHttpOptions): ResilientServer {
  const origin: [string, string][] = [[ORIGIN_HEADER, `${o.index} ${o.token}`]];
  const route = async (req: Request): Promise<Response> => {
    if (requestUrl(req) === null) return await o.handler(req); // 400 there, counted there
    const path = sentPath(req);
    const method = req.method.toUpperCase();
    const c = cachePath(path);
    if (c) {
      const own = c.rest !== "" || method === "GET" || method === "HEAD";
      if (own && o.holds(c.id)) return await o.handler(req);
      const create = method === "PUT" && c.rest === ""; // may create the cache: place it here
      return await o.front.send(req, undefined, create ? origin : []);
    }
    if (path === "/v1/kv-caches" && method === "POST") {
      return await o.front.send(req, undefined, origin);
    }
    if (path !== "/v1/attention/forward" || method !== "POST") return await o.front.send(req);
    if (badQueueTimeoutHeader(req)) return await o.handler(req); // refused before its body
    const body = await o.front.readBody(req);
    if (body?.end !== "complete") return await o.front.send(req, body);
    const safetensors = mediaType(req.headers.get("content-type")) === SAFETENSORS;
    const found = await findForwardCacheId(body.bytes, safetensors, o.scans);
    const read = { ...body, bytes: found.bytes };
    if (found.id !== undefined && o.holds(found.id)) return await o.handler(withBody(req, read));
    return await o.front.send(req, read);
  };
  return serveResilient({
    port: o.port,
    hostname: o.hostname,
    reusePort: true,
    onListen: o.onListen,
    log: o.log,
  }, serveLentBodies(o.wrap(route)));
}
