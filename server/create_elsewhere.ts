/**
 * Creates under `--device-threads` (device_threads.ts): each thread holds 1/N of the memory
 * budget, so a create one thread refuses for memory (422 `memory_budget_exceeded`) may fit
 * another. {@link createOnSomeThread} tries the threads in placement order, each at most once,
 * and answers with the first that is not such a refusal; when every running thread refused, the
 * last refusal says the budget is split (its detail, and `device_threads`), which a client
 * otherwise could not tell from "N of M bytes remain". {@link putOnSomeThread} does the same
 * for a `PUT` of a cache id, one `PUT` of an id at a time: two sent together used to go to the
 * same thread (the first placed the id, the second followed it), and the first's retry went back
 * to that thread too while the second was in flight there, so both were refused as if no thread
 * had room.
 * @module
 */
import type { StreamedBody } from "./body_read.ts";
import type { CachePlacement, Holder } from "./cache_placement.ts";

/** The code of a refusal for memory. */
const OVER_BUDGET = "memory_budget_exceeded";

/** One attempt: the answer, and what the placement does with it (`done`). */
export interface Attempt<T> {
  holder: T;
  /**
   * Sends the create; `tentative`: another thread may be asked if this one refuses it for
   * memory (the thread then does not count that refusal: metrics_merge.ts TENTATIVE_HEADER).
   */
  send(body: StreamedBody | null, tentative: boolean): Promise<Response>;
  /** The attempt's outcome for the placement (the answer taken, or refused). */
  done(res: Response | null): void;
}

/** A copy of a read body for one more send (a send transfers the bytes it is given). */
function copy(b: StreamedBody | null): StreamedBody | null {
  return b && { ...b, bytes: b.bytes.slice() };
}

/** The answer as it was, or its problem when it is a refusal for memory. */
async function overBudget(
  res: Response,
): Promise<{ res: Response; doc: Record<string, unknown> | null }> {
  if (res.status !== 422) return { res, doc: null };
  const text = await res.text();
  const again = new Response(text, { status: res.status, headers: res.headers });
  try {
    const doc = JSON.parse(text) as Record<string, unknown>;
    return { res: again, doc: doc?.code === OVER_BUDGET ? doc : null };
  } catch {
    return { res: again, doc: null };
  }
}

/**
 * Sends a create to one thread after another (`attempt(skip)` places it avoiding those that
 * refused) until one answers other than a refusal for memory or every running thread refused.
 */
export async function createOnSomeThread<T>(
  body: StreamedBody | null,
  running: number,
  attempt: (skip: T[]) => Attempt<T>,
): Promise<Response> {
  const refused: T[] = [];
  const remaining: number[] = []; // each refusal's remaining_bytes, in the order asked
  for (;;) {
    const a = attempt(refused);
    let res: Response | null = null;
    try {
      const retry = body?.end === "complete" && refused.length + 1 < running;
      const got = await overBudget(await a.send(copy(body), retry));
      res = got.res;
      if (got.doc === null) return res;
      if (typeof got.doc.remaining_bytes === "number") remaining.push(got.doc.remaining_bytes);
      if (retry) {
        refused.push(a.holder);
        continue;
      }
      return split(got.doc, res, running, remaining);
    } finally {
      a.done(res);
    }
  }
}

/**
 * The last refusal, saying the budget is split over the threads (when there are several), and
 * the most any thread asked had left (`largest_remaining_bytes`; `remaining_bytes` stays the
 * last thread's): a client sizing a smaller cache needs the largest, not the last.
 */
function split(
  doc: Record<string, unknown>,
  res: Response,
  threads: number,
  remaining: number[],
): Response {
  if (threads < 2) return res;
  const largest = remaining.length > 0 ? Math.max(...remaining) : undefined;
  const out = {
    ...doc,
    detail: `${doc.detail}; each of the ${threads} device threads holds 1/${threads} of ` +
      `--memory-budget-bytes, and none has room` +
      (largest === undefined ? "" : ` (the most any has left: ${largest} bytes)`),
    device_threads: threads,
    ...(largest === undefined ? {} : { largest_remaining_bytes: largest }),
  };
  const headers = new Headers(res.headers);
  headers.delete("content-length");
  return new Response(JSON.stringify(out), { status: res.status, headers });
}

/** Runs the tasks of one key one after another, in the order they came. */
export class PerKeyQueue {
  readonly #tails = new Map<string, Promise<void>>();

  run<R>(key: string, task: () => Promise<R>): Promise<R> {
    const next = (this.#tails.get(key) ?? Promise.resolve()).then(task);
    const tail = next.then(() => {}, () => {});
    this.#tails.set(key, tail);
    void tail.then(() => {
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    });
    return next;
  }

  /** Keys with tasks queued or running. */
  get size(): number {
    return this.#tails.size;
  }
}

/**
 * A `PUT` of cache `id` under `--device-threads`: after any earlier `PUT` of the same id
 * (`queue`), to the id's holder, or for a new id to a thread with room, trying the next one
 * that has room when one refuses for memory ({@link createOnSomeThread}); a new id goes to
 * `prefer` first when given (the thread the `PUT` came in on).
 */
export function putOnSomeThread<T extends Holder>(
  places: CachePlacement<T>,
  queue: PerKeyQueue,
  id: string,
  body: StreamedBody | null,
  send: (holder: T, body: StreamedBody | null, tentative: boolean) => Promise<Response>,
  prefer?: T,
): Promise<Response> {
  return queue.run(id, () =>
    createOnSomeThread<T>(body, places.live().length, (skip) => {
      const put = places.put(id, skip, prefer);
      return {
        holder: put.holder,
        send: (b, tentative) => send(put.holder, b, tentative),
        done: (res) => put.done(res?.ok ?? false),
      };
    }));
}
