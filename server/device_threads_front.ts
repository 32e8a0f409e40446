/**
 * The device-thread front's handler (device_threads.ts starts the threads and calls
 * {@link front}): where each request goes (a cache's routes to its holder, creates to a thread
 * with room, forwards to the holder of the cache their body names or the least busy thread,
 * `/metrics` to every thread, merged, `/healthz` answered here, the rest to thread 0), and how
 * the threads are closed after a drain, with the grace a process waits after ending them
 * ({@link threadExitGrace}).
 * @module
 */
import { mediaType } from "./body.ts";
import type { DeviceThreads } from "./device_threads.ts";
import { findForwardCacheId, type ScanWorker, scanWorker } from "./forward_cache_id.ts";
import { CachePlacement } from "./cache_placement.ts";
import {
  type Attempt,
  createOnSomeThread,
  PerKeyQueue,
  putOnSomeThread,
} from "./create_elsewhere.ts";
import { mergeMetrics, SCRAPE_HEADER, TENTATIVE_HEADER } from "./metrics_merge.ts";
import { FrontMetrics } from "./front_metrics.ts";
import { METRICS_CONTENT_TYPE } from "./metrics.ts";
import { type ErrorLogger, NOT_LOGGED, problemResponse, toProblem } from "./problem.ts";
import { cachePath, ORIGIN_HEADER } from "./thread_http.ts";
import { listenOnThreads } from "./thread_listeners.ts";
import type { Thread } from "./thread_handle.ts";
import { badUrlProblem, requestUrl, sentPath } from "./routes.ts";
import { badQueueTimeoutHeader } from "./queue_timeout_header.ts";
import type { ThreadWatchdog } from "./thread_watchdog.ts";
import { headOf, healthDocument, jsonResponse, SAFETENSORS } from "./responses.ts";
import { INSTANCE_HEADER } from "../wire/names.ts";
import { threadExitGraceMs } from "./exit_grace.ts";
import { ServiceError } from "../core/errors.ts";
import { raceTimeout } from "../core/timeout.ts";

/**
 * How long close() waits after terminating the threads: `terminate()` returns before a worker
 * thread has dropped its runtime, and a process that exits meanwhile runs the WebGPU driver's
 * exit-time teardown beside the thread's own (glibc "double free or corruption" or SIGSEGV at
 * a clean shutdown: exit status 134 or 139 after "stopped: every call finished"; bench/NOTES.md
 * v0.16). Deno has no join for a worker, so a grace (`ATTN_THREAD_EXIT_GRACE_MS`, default 300).
 */
export async function threadExitGrace(): Promise<void> {
  const ms = threadExitGraceMs(); // checked at start-up (server/serve_env.ts)
  if (ms > 0) await new Promise((r) => setTimeout(r, ms));
}

/** How long a scrape waits for one thread's metrics before it leaves them out (ms). */
const SCRAPE_WAIT_MS = 2000;

/** The head of the threads' liveness gauge, which the front adds to every merged scrape. */
const THREAD_UP_HELP = "# HELP attn_device_thread_up Whether each device thread's series are in " +
  "this scrape (0: the thread is lost, or answered no scrape within 2 s: busy).\n" +
  "# TYPE attn_device_thread_up gauge\n";

/**
 * Whether `e` is a lost thread's problem (thread_listeners.ts: the body of a call a stopped
 * thread passed on): logged once, at the crash, not again for each call.
 */
function lostThread(e: unknown): boolean {
  return e instanceof ServiceError && e.code === "device_thread_lost";
}

/** What the front's routes share, one per server: the threads, where caches are, its own counts. */
interface FrontState {
  readonly threads: Thread[];
  /** The token of the front's own asks (thread_http.ts ORIGIN_HEADER, metrics_merge.ts). */
  readonly scrapeToken: string;
  readonly instance: string | undefined;
  readonly places: CachePlacement<Thread>;
  /** The `PUT`s of each cache id, one at a time (create_elsewhere.ts). */
  readonly puts: PerKeyQueue;
  readonly scans: ScanWorker;
  /** The answers the front gives itself. */
  readonly own: FrontMetrics;
}

/** The handler of `threads` as one service, and how to listen on them and close them. */
export function front(
  threads: Thread[],
  scrapeToken: string,
  log: ErrorLogger,
  watchdog: ThreadWatchdog,
  instance: string | undefined,
): DeviceThreads {
  const s: FrontState = {
    threads,
    scrapeToken,
    instance,
    places: new CachePlacement(threads),
    puts: new PerKeyQueue(),
    scans: scanWorker(),
    own: new FrontMetrics(),
  };
  return {
    threads: threads.length,
    handler: (req) => handle(s, req),
    metrics: s.own,
    fault: (i, how = "throw") => threads[i].fault(how),
    listen: (o) => listenOnThreads(threads, { ...o, token: scrapeToken, log }),
    close: () => closeThreads(s, watchdog),
  };
}

/** Closes every running thread's service and device, then ends the threads. */
async function closeThreads(s: FrontState, watchdog: ThreadWatchdog): Promise<void> {
  watchdog.stop(); // a thread busy closing is not lost
  s.scans.close();
  for (const t of s.threads) if (t.lost === null) t.worker.postMessage({ type: "device-close" });
  await Promise.all(s.threads.map((t) => t.closed.promise));
  s.threads.forEach((t) => t.worker.terminate());
  await threadExitGrace();
}

/** The header of a create another thread may be asked for (metrics_merge.ts). */
function tentativeMark(s: FrontState, tentative: boolean): [string, string][] {
  return tentative ? [[TENTATIVE_HEADER, s.scrapeToken]] : [];
}

/** The thread a create came in on (thread_http.ts ORIGIN_HEADER with this front's token). */
function originThread(s: FrontState, req: Request): Thread | undefined {
  const [i, token] = (req.headers.get(ORIGIN_HEADER) ?? "").split(" ");
  return token === s.scrapeToken ? s.threads[Number(i)] : undefined;
}

/** The running thread with the fewest calls waiting. */
function leastBusy(s: FrontState): Thread {
  return s.places.live().reduce((a, b) => (b.sender.size < a.sender.size ? b : a));
}

/** A request, routed; counted here when no thread answered (a lost thread's 503s, a failure). */
async function handle(s: FrontState, req: Request): Promise<Response> {
  const pathname = sentPath(req);
  // A URL no Request takes cannot be sent on to a thread: 400 here, as on one thread.
  const res = requestUrl(req) === null
    ? problemResponse(toProblem(badUrlProblem(req)))
    : await route(s, req, pathname);
  s.own.record(req, pathname, res);
  return res;
}

/** Where a request goes, by its path and method; a failure here is its problem answer. */
async function route(s: FrontState, req: Request, pathname: string): Promise<Response> {
  try {
    const method = req.method.toUpperCase();
    const c = cachePath(pathname);
    if (c) return await onCache(s, req, c.id, c.rest);
    if (pathname === "/v1/kv-caches" && method === "POST") return await create(s, req);
    if (pathname === "/v1/attention/forward" && method === "POST") return await forward(s, req);
    if (pathname === "/metrics" && (method === "GET" || method === "HEAD")) {
      return await metrics(s, req);
    }
    // /healthz here: a thread in a long call answers nothing meanwhile (a GPU wait on Deno's
    // runtime holds its JS thread), and the front knows which threads are lost.
    if (pathname === "/healthz" && (method === "GET" || method === "HEAD")) {
      return await health(s, req, method);
    }
    return await s.places.live()[0].send(req);
  } catch (e) {
    return problemResponse(toProblem(e, undefined, lostThread(e) ? NOT_LOGGED : undefined));
  }
}

/** `/healthz`, as a thread's handler answers it (server/handler.ts). */
async function health(s: FrontState, req: Request, method: string): Promise<Response> {
  const live = s.places.live()[0]; // thread 0 when every thread is lost: its 503 answers
  if (live.lost !== null) return await live.send(req);
  const headers: Record<string, string> = s.instance ? { [INSTANCE_HEADER]: s.instance } : {};
  const res = jsonResponse(healthDocument(s.instance), 200, headers);
  return s.own.made(method === "HEAD" ? await headOf(res) : res);
}

/** A call on a cache (`/v1/kv-caches/{id}...`): to its holder; a `DELETE` then unplaces it. */
async function onCache(s: FrontState, req: Request, id: string, rest: string): Promise<Response> {
  const method = req.method.toUpperCase();
  if (method === "PUT" && rest === "") return await putCache(s, req, id);
  const res = await (s.places.holderOf(id) ?? s.places.live()[0]).send(req);
  if (method === "DELETE" && rest === "" && res.status === 204) s.places.deleted(id);
  return res;
}

/** A `PUT` of a cache: to its holder, or, for a new id, to a thread with room. */
async function putCache(s: FrontState, req: Request, id: string): Promise<Response> {
  const body = await s.threads[0].sender.readBody(req);
  return await putOnSomeThread(
    s.places,
    s.puts,
    id,
    body,
    (t, b, tent) => t.send(req, b, tentativeMark(s, tent)),
    originThread(s, req),
  );
}

/** A `POST` create: to a thread with room; its id is placed there once answered. */
async function create(s: FrontState, req: Request): Promise<Response> {
  const body = await s.threads[0].sender.readBody(req);
  return await createOnSomeThread<Thread>(
    body,
    s.places.live().length,
    (skip) => createAttempt(s, req, skip),
  );
}

/** One try of a create: on a thread with room (not in `skip`), its answer's id placed there. */
function createAttempt(s: FrontState, req: Request, skip: Thread[]): Attempt<Thread> {
  const r = s.places.reserve(skip, originThread(s, req));
  let id: string | null = null;
  return {
    holder: r.holder,
    send: async (b, tentative) => {
      const res = await r.holder.send(req, b, tentativeMark(s, tentative));
      if (res.status !== 201) return res;
      const text = await res.text();
      const got = (JSON.parse(text) as { id?: unknown }).id;
      if (typeof got === "string") id = got;
      return new Response(text, { status: res.status, headers: res.headers });
    },
    done: () => r.done(id),
  };
}

/** A forward: to the holder of the cache its body names, else to the least busy thread. */
async function forward(s: FrontState, req: Request): Promise<Response> {
  if (badQueueTimeoutHeader(req)) return await leastBusy(s).send(req); // refused before its body
  let body = await s.threads[0].sender.readBody(req);
  let id: string | undefined;
  if (body?.end === "complete") {
    const safetensors = mediaType(req.headers.get("content-type")) === SAFETENSORS;
    const found = await findForwardCacheId(body.bytes, safetensors, s.scans);
    body = { ...body, bytes: found.bytes };
    id = found.id;
  }
  const t = (id !== undefined ? s.places.holderOf(id) : undefined) ?? leastBusy(s);
  return await t.send(req, body);
}

/**
 * Every running thread's series (a lost thread's are gone with it), for a GET or a HEAD. The
 * first running thread counts the scrape; the others are asked with the front's token, and
 * do not count it again.
 */
async function metrics(s: FrontState, req: Request): Promise<Response> {
  const head = req.method.toUpperCase() === "HEAD";
  // The thread that counts the scrape: one free, where one is (a busy one may answer late).
  const live = s.threads.filter((t) => t.lost === null);
  const first = live.find((t) => !t.busy()) ?? live[0];
  const answers = await Promise.all(
    s.threads.map((t) => t.lost === null ? scrapeThread(s, req, t, t === first && !head) : null),
  );
  const bad = answers.find((r) => r !== null && r.status !== 200);
  if (bad) return head ? await headOf(bad) : bad;
  const res = await mergedScrape(s, answers);
  if (!head) return res;
  // Every thread's text was asked for uncounted; the first thread then counts the HEAD as such
  // (its own answer has no body to merge), after the text, as one thread counts it.
  // Within SCRAPE_WAIT_MS as the GETs: a blocked thread does not hold the answer (uncounted).
  const counted = first &&
    await withinScrapeWait(
      first.send(new Request(req.url, { method: "HEAD", headers: req.headers })),
    );
  await counted?.body?.cancel();
  return await headOf(res);
}

/**
 * Thread `t`'s metrics, as a `GET` (`counts`: it counts the scrape; else asked with the front's
 * token); null when it does not answer in SCRAPE_WAIT_MS.
 */
async function scrapeThread(
  s: FrontState,
  req: Request,
  t: Thread,
  counts: boolean,
): Promise<Response | null> {
  const headers = new Headers(req.headers);
  if (!counts) headers.set(SCRAPE_HEADER, s.scrapeToken);
  // A thread that does not answer in SCRAPE_WAIT_MS (on Deno's runtime a call's GPU wait
  // holds its JS thread) is left out of this scrape: attn_device_thread_up says so.
  return await withinScrapeWait(t.send(new Request(req.url, { method: "GET", headers })));
}

/** `p`'s answer, or null where none came in SCRAPE_WAIT_MS (a late one's body is dropped). */
async function withinScrapeWait(p: Promise<Response>): Promise<Response | null> {
  const r = await raceTimeout(p, SCRAPE_WAIT_MS);
  if (r !== "timeout") return r;
  p.then((late) => late.body?.cancel(), () => {});
  return null;
}

/**
 * The threads' `answers` (null: left out) and the front's own series as one scrape, with each
 * thread's attn_device_thread_up.
 */
async function mergedScrape(s: FrontState, answers: (Response | null)[]): Promise<Response> {
  const texts = await Promise.all(answers.map((r) => r?.text() ?? ""));
  const headers = new Headers(answers.find((r) => r !== null)?.headers);
  headers.set("content-type", METRICS_CONTENT_TYPE); // also with every thread lost
  const labels = [...s.threads.map((t) => t.index), "front"];
  const up = s.threads.map((t, i) =>
    `attn_device_thread_up{device_thread="${t.index}"} ${answers[i] ? 1 : 0}`
  );
  const text = mergeMetrics([...texts, s.own.render()], labels) + THREAD_UP_HELP + up.join("\n") +
    "\n";
  return new Response(text, { headers });
}
