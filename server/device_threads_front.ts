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
import { findForwardCacheId, scanWorker } from "./forward_cache_id.ts";
import { CachePlacement } from "./cache_placement.ts";
import { createOnSomeThread, PerKeyQueue, putOnSomeThread } from "./create_elsewhere.ts";
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

export function front(
  threads: Thread[],
  scrapeToken: string,
  log: ErrorLogger,
  watchdog: ThreadWatchdog,
  instance: string | undefined,
): DeviceThreads {
  const places = new CachePlacement(threads);
  const puts = new PerKeyQueue();
  /** The header of a create another thread may be asked for (metrics_merge.ts). */
  const mark = (tentative: boolean): [string, string][] =>
    tentative ? [[TENTATIVE_HEADER, scrapeToken]] : [];
  const scans = scanWorker();
  const own = new FrontMetrics(); // the answers the front gives itself
  /** `/healthz`, as a thread's handler answers it (server/handler.ts). */
  const health = async (req: Request, method: string): Promise<Response> => {
    const live = places.live()[0]; // thread 0 when every thread is lost: its 503 answers
    if (live.lost !== null) return await live.send(req);
    const headers: Record<string, string> = instance ? { [INSTANCE_HEADER]: instance } : {};
    const res = jsonResponse(healthDocument(instance), 200, headers);
    return own.made(method === "HEAD" ? await headOf(res) : res);
  };
  const leastBusy = () => places.live().reduce((a, b) => (b.sender.size < a.sender.size ? b : a));
  /** The thread a create came in on (thread_http.ts ORIGIN_HEADER with this front's token). */
  const origin = (req: Request): Thread | undefined => {
    const [i, token] = (req.headers.get(ORIGIN_HEADER) ?? "").split(" ");
    return token === scrapeToken ? threads[Number(i)] : undefined;
  };

  const onCache = async (req: Request, id: string, rest: string): Promise<Response> => {
    const method = req.method.toUpperCase();
    if (method === "PUT" && rest === "") return await putCache(req, id);
    const res = await (places.holderOf(id) ?? places.live()[0]).send(req);
    if (method === "DELETE" && rest === "" && res.status === 204) places.deleted(id);
    return res;
  };

  /** A `PUT` of a cache: to its holder, or, for a new id, to a thread with room. */
  const putCache = async (req: Request, id: string): Promise<Response> => {
    const body = await threads[0].sender.readBody(req);
    return await putOnSomeThread(
      places,
      puts,
      id,
      body,
      (t, b, tent) => t.send(req, b, mark(tent)),
      origin(req),
    );
  };

  /** A `POST` create: to a thread with room; its id is placed there once answered. */
  const create = async (req: Request): Promise<Response> => {
    const body = await threads[0].sender.readBody(req);
    return await createOnSomeThread<Thread>(body, places.live().length, (skip) => {
      const r = places.reserve(skip, origin(req));
      let id: string | null = null;
      return {
        holder: r.holder,
        send: async (b, tentative) => {
          const res = await r.holder.send(req, b, mark(tentative));
          if (res.status !== 201) return res;
          const text = await res.text();
          const got = (JSON.parse(text) as { id?: unknown }).id;
          if (typeof got === "string") id = got;
          return new Response(text, { status: res.status, headers: res.headers });
        },
        done: () => r.done(id),
      };
    });
  };

  const forward = async (req: Request): Promise<Response> => {
    if (badQueueTimeoutHeader(req)) return await leastBusy().send(req); // refused before its body
    let body = await threads[0].sender.readBody(req);
    let id: string | undefined;
    if (body?.end === "complete") {
      const safetensors = mediaType(req.headers.get("content-type")) === SAFETENSORS;
      const found = await findForwardCacheId(body.bytes, safetensors, scans);
      body = { ...body, bytes: found.bytes };
      id = found.id;
    }
    const t = (id !== undefined ? places.holderOf(id) : undefined) ?? leastBusy();
    return await t.send(req, body);
  };

  /**
   * Every running thread's series (a lost thread's are gone with it), for a GET or a HEAD. The
   * first running thread counts the scrape; the others are asked with the front's token, and
   * do not count it again.
   */
  const metrics = async (req: Request): Promise<Response> => {
    const head = req.method.toUpperCase() === "HEAD";
    // The thread that counts the scrape: one free, where one is (a busy one may answer late).
    const live = threads.filter((t) => t.lost === null);
    const first = live.find((t) => !t.busy()) ?? live[0];
    const ask = (t: Thread) => {
      const headers = new Headers(req.headers);
      if (t !== first || head) headers.set(SCRAPE_HEADER, scrapeToken);
      return t.send(new Request(req.url, { method: "GET", headers }));
    };
    // A thread that does not answer in SCRAPE_WAIT_MS (on Deno's runtime a call's GPU wait
    // holds its JS thread) is left out of this scrape: attn_device_thread_up says so.
    const timely = async (t: Thread): Promise<Response | null> => {
      const p = ask(t);
      const r = await raceTimeout(p, SCRAPE_WAIT_MS);
      if (r !== "timeout") return r;
      p.then((late) => late.body?.cancel(), () => {});
      return null;
    };
    const answers = await Promise.all(threads.map((t) => t.lost === null ? timely(t) : null));
    const bad = answers.find((r) => r !== null && r.status !== 200);
    if (bad) return head ? await headOf(bad) : bad;
    const texts = await Promise.all(answers.map((r) => r?.text() ?? ""));
    const headers = new Headers(answers.find((r) => r !== null)?.headers);
    headers.set("content-type", METRICS_CONTENT_TYPE); // also with every thread lost
    const labels = [...threads.map((t) => t.index), "front"];
    const up = threads.map((t, i) =>
      `attn_device_thread_up{device_thread="${t.index}"} ${answers[i] ? 1 : 0}`
    );
    const text = mergeMetrics([...texts, own.render()], labels) + THREAD_UP_HELP + up.join("\n") +
      "\n";
    const res = new Response(text, { headers });
    if (!head) return res;
    // Every thread's text was asked for uncounted; the first thread then counts the HEAD as such
    // (its own answer has no body to merge), after the text, as one thread counts it.
    const counted = first &&
      await first.send(new Request(req.url, { method: "HEAD", headers: req.headers }));
    await counted?.body?.cancel();
    return await headOf(res);
  };

  const route = async (req: Request, pathname: string): Promise<Response> => {
    try {
      const method = req.method.toUpperCase();
      const c = cachePath(pathname);
      if (c) return await onCache(req, c.id, c.rest);
      if (pathname === "/v1/kv-caches" && method === "POST") return await create(req);
      if (pathname === "/v1/attention/forward" && method === "POST") return await forward(req);
      if (pathname === "/metrics" && (method === "GET" || method === "HEAD")) {
        return await metrics(req);
      }
      // /healthz here: a thread in a long call answers nothing meanwhile (a GPU wait on Deno's
      // runtime holds its JS thread), and the front knows which threads are lost.
      if (pathname === "/healthz" && (method === "GET" || method === "HEAD")) {
        return await health(req, method);
      }
      return await places.live()[0].send(req);
    } catch (e) {
      return problemResponse(toProblem(e, undefined, lostThread(e) ? NOT_LOGGED : undefined));
    }
  };
  // The answers no thread gave (a lost thread's 503s, a failure here) are counted here.
  const handler = async (req: Request): Promise<Response> => {
    const pathname = sentPath(req);
    // A URL no Request takes cannot be sent on to a thread: 400 here, as on one thread.
    const res = requestUrl(req) === null
      ? problemResponse(toProblem(badUrlProblem(req)))
      : await route(req, pathname);
    own.record(req, pathname, res);
    return res;
  };

  return {
    threads: threads.length,
    handler,
    metrics: own,
    fault: (i, how = "throw") => threads[i].fault(how),
    listen: (o) => listenOnThreads(threads, { ...o, token: scrapeToken, log }),
    async close() {
      watchdog.stop(); // a thread busy closing is not lost
      scans.close();
      for (const t of threads) if (t.lost === null) t.worker.postMessage({ type: "device-close" });
      await Promise.all(threads.map((t) => t.closed.promise));
      threads.forEach((t) => t.worker.terminate());
      await threadExitGrace();
    },
  };
}
