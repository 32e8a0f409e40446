/**
 * Which device thread holds which server-held cache (device_threads.ts): a cache is placed on
 * the running thread holding the fewest caches, counting the creates still in flight (so
 * creates sent together spread), and every later call on it goes to that thread. A `PUT` of a
 * new id places it at once; the place is kept while any `PUT` of that id is in flight and once
 * one succeeded, and given up when every one failed (so a refused `PUT` leaves no count behind,
 * and a refused one beside a successful one does not hide the cache). A `DELETE` gives the place
 * up only when no `PUT` of the id is in flight: one sent beside it may create the id again on the
 * same thread, after the delete (the thread runs them in order), and must still find it. A cache
 * whose thread was lost is placed anew by the next `PUT` of its id.
 * @module
 */

/** What placement needs of a thread. */
export interface Holder {
  /** Caches placed on it (creates in flight included). */
  caches: number;
  /** Why it stopped; null while it runs. */
  readonly lost: string | null;
}

interface Place<T> {
  holder: T;
  /** PUTs of the id in flight. */
  pending: number;
  /** The id exists on the holder, as far as the answers so far say. */
  confirmed: boolean;
  /** Counted in the holder's `caches` (a create in flight, or the cache). */
  counted: boolean;
}

/** The placement of caches on `holders`; see the module doc. */
export class CachePlacement<T extends Holder> {
  readonly #places = new Map<string, Place<T>>();

  constructor(private readonly holders: readonly T[]) {}

  /** The running holders (none running: the first, which answers for its loss). */
  live(): T[] {
    const l = this.holders.filter((h) => h.lost === null);
    return l.length ? l : [this.holders[0]];
  }

  /**
   * `prefer` when it runs and is not in `skip` (the thread a create came in on, so that its
   * connection's calls stay there: thread_http.ts), else the running holder with the fewest
   * caches, of those not in `skip` (when any is not).
   */
  fewest(skip: readonly T[] = [], prefer?: T): T {
    if (prefer && prefer.lost === null && !skip.includes(prefer)) return prefer;
    const live = this.live();
    const some = live.filter((h) => !skip.includes(h));
    return (some.length ? some : live).reduce((a, b) => (b.caches < a.caches ? b : a));
  }

  /** Where cache `id` is, if placed. */
  holderOf(id: string): T | undefined {
    return this.#places.get(id)?.holder;
  }

  /**
   * A create with no id yet (`POST`): the holder (not one in `skip`, which refused it already),
   * counted now; `done` with the new id or null.
   */
  reserve(skip: readonly T[] = [], prefer?: T): { holder: T; done(id: string | null): void } {
    const holder = this.fewest(skip, prefer);
    holder.caches++;
    return {
      holder,
      done: (id) => {
        if (id === null) holder.caches--;
        else this.#places.set(id, { holder, pending: 0, confirmed: true, counted: true });
      },
    };
  }

  /**
   * A `PUT` of `id` (it may create): its holder (a new place avoids `skip`, holders that refused
   * to create it); `fresh` when this call placed it; `done` with whether it succeeded.
   */
  put(id: string, skip: readonly T[] = [], prefer?: T): { holder: T; done(ok: boolean): void } {
    let p = this.#places.get(id);
    if (!p || p.holder.lost !== null) {
      p = { holder: this.fewest(skip, prefer), pending: 0, confirmed: false, counted: false };
      this.#places.set(id, p);
    }
    const place = p;
    if (!place.counted) {
      place.holder.caches++;
      place.counted = true;
    }
    place.pending++;
    return {
      holder: place.holder,
      done: (ok) => {
        place.pending--;
        if (ok) {
          place.confirmed = true;
          if (!place.counted) { // a delete answered while this PUT ran; it made the id again
            place.holder.caches++;
            place.counted = true;
          }
        }
        if (place.pending === 0 && !place.confirmed) this.#drop(id, place);
      },
    };
  }

  /** Cache `id` was deleted (its `DELETE` answered 204). */
  deleted(id: string): void {
    const p = this.#places.get(id);
    if (!p) return;
    p.confirmed = false;
    if (p.counted) {
      p.holder.caches--;
      p.counted = false;
    }
    if (p.pending === 0) this.#places.delete(id);
  }

  #drop(id: string, place: Place<T>): void {
    if (place.counted) {
      place.holder.caches--;
      place.counted = false;
    }
    if (this.#places.get(id) === place) this.#places.delete(id);
  }
}
