/**
 * The device threads' liveness ping (server/thread_watchdog.ts) on stand-in threads and a
 * clock of the test's own: each running thread gets one ping a period while none waits; an
 * answered ping clears; a thread silent for `lostMs` is lost once, with why; a lost thread is
 * not pinged; a tick that fires late (the front was busy, its pongs maybe unread) judges no
 * thread; `pingMs` 0 starts nothing; the variables set the options, a bad value the default.
 */
import assert from "node:assert/strict";
import { EnvValueError, settingValue } from "../../core/env.ts";
import { withEnvSync } from "../support/env.ts";
import {
  DEFAULT_WATCHDOG,
  LOST_ENV,
  PING_ENV,
  STUCK_ENV,
  THREAD_STUCK_SETTING,
  ThreadWatchdog,
  watchdogFromEnv,
  type Watched,
} from "../../server/thread_watchdog.ts";

class FakeThread implements Watched {
  lost: string | null = null;
  pings: number[] = [];
  losses: string[] = [];
  working = false;
  done = 0;
  constructor(readonly index: number) {}
  finished() {
    return this.done;
  }
  busy() {
    return this.working;
  }
  ping(seq: number) {
    this.pings.push(seq);
  }
  lose(why: string) {
    this.losses.push(why);
    this.lost = why;
  }
}

function setup(pingMs = 100, lostMs = 1000, stuckMs = 0) {
  let now = 0;
  const threads = [new FakeThread(0), new FakeThread(1)];
  const dog = new ThreadWatchdog(threads, { pingMs, lostMs, stuckMs }, () => now);
  /** Advances the clock by `ms` and ticks. */
  const tick = (ms = pingMs) => {
    now += ms;
    dog.tick();
  };
  return { threads, dog, tick };
}

Deno.test("thread watchdog: a ping a period while none waits; the silent thread is lost once", () => {
  const { threads: [a, b], dog, tick } = setup();
  tick();
  assert.deepEqual([a.pings.length, b.pings.length], [1, 1]);
  dog.pong(a, a.pings[0]);
  dog.pong(b, 12345); // not the one waiting: still waiting
  tick();
  assert.deepEqual([a.pings.length, b.pings.length], [2, 1]);
  // b stays silent; a answers every ping.
  for (let i = 0; i < 8; i++) {
    dog.pong(a, a.pings.at(-1));
    tick();
  }
  assert.deepEqual(b.losses, [], "900 ms silent: not yet");
  dog.pong(a, a.pings.at(-1));
  tick();
  assert.equal(b.losses.length, 1);
  assert.match(b.losses[0], /answered no ping for 1000 ms .*ATTN_THREAD_LOST_MS=1000/);
  assert.deepEqual(a.losses, []);
  const pings = b.pings.length;
  for (let i = 0; i < 20; i++) tick();
  assert.equal(b.pings.length, pings, "a lost thread is not pinged");
  assert.equal(b.losses.length, 1, "nor lost again");
});

Deno.test("thread watchdog: a late tick judges no thread, the next on time does", () => {
  const { threads: [a], dog, tick } = setup();
  tick();
  tick(5000); // the front was busy 5 s: a's pong may be queued, unread
  assert.deepEqual(a.losses, []);
  dog.pong(a, a.pings[0]); // read now
  tick();
  assert.deepEqual(a.losses, []);
  assert.equal(a.pings.length, 2, "pinged again once answered");
  tick(5000);
  tick(); // on time, and the ping waits 5.1 s
  assert.equal(a.losses.length, 1);
});

Deno.test("thread watchdog: pingMs 0 starts nothing; stop() clears the timer", () => {
  const off = new ThreadWatchdog([new FakeThread(0)], { pingMs: 0, lostMs: 1 });
  off.start();
  off.stop();
  const t = new FakeThread(0);
  const on = new ThreadWatchdog([t], { pingMs: 10, lostMs: 1000 }).start();
  on.stop(); // the test's op sanitizer finds no timer left
  assert.deepEqual(t.pings, []);
});

Deno.test("thread watchdog: the variables set the options; empty is the default, a bad value throws naming it", () => {
  const set = (k: string, v: string | undefined) =>
    v === undefined ? Deno.env.delete(k) : Deno.env.set(k, v);
  withEnvSync({ [PING_ENV]: undefined, [LOST_ENV]: undefined }, () => {
    assert.deepEqual(watchdogFromEnv(), DEFAULT_WATCHDOG);
    assert.deepEqual(DEFAULT_WATCHDOG, { pingMs: 1000, lostMs: 30_000, stuckMs: 0 });
    set(PING_ENV, "0");
    set(LOST_ENV, "120000");
    assert.deepEqual(watchdogFromEnv(), { pingMs: 0, lostMs: 120_000, stuckMs: 0 });
    set(PING_ENV, "");
    set(LOST_ENV, "");
    assert.deepEqual(watchdogFromEnv(), DEFAULT_WATCHDOG, "empty reads as unset");
    for (const bad of ["-1", "1.5", "abc", " 5", String(2 ** 31)]) {
      set(PING_ENV, bad);
      set(LOST_ENV, "1000");
      assert.throws(
        () => watchdogFromEnv(),
        (e) =>
          e instanceof EnvValueError && e.variable === PING_ENV && e.value === bad &&
          e.message.includes(JSON.stringify(bad)),
      );
    }
    set(PING_ENV, "1000");
    set(LOST_ENV, "999");
    assert.throws(
      () => watchdogFromEnv(),
      (e) => e instanceof EnvValueError && e.variable === LOST_ENV,
      "lostMs 0 is refused",
    );
  });
});

Deno.test("thread watchdog: a thread at work is not lost for its silence; it is once idle and silent", () => {
  const { threads, tick } = setup(100, 1000);
  threads[0].working = true; // a call holds its JS thread (a GPU wait on Deno's runtime)
  for (let i = 0; i < 50; i++) tick(); // 5 s silent, at work
  assert.deepEqual(threads[0].losses, []);
  threads[0].working = false; // free again, and still silent
  for (let i = 0; i < 9; i++) tick();
  assert.deepEqual(threads[0].losses, [], "its silence counts from when it was free");
  for (let i = 0; i < 3; i++) tick();
  assert.equal(threads[0].losses.length, 1);
});

Deno.test("thread watchdog: stuckMs 0 (the default) never loses a thread at work", () => {
  const { threads: [a], dog, tick } = setup();
  a.working = true;
  for (let i = 0; i < 1000; i++) {
    tick(); // 100 s busy, silent, no call finished
    if (i === 0) dog.pong(a, 999); // not the ping waited for
  }
  assert.deepEqual(a.losses, []);
});

Deno.test("thread watchdog: a thread that runs calls and finishes none for stuckMs is lost once", () => {
  const { threads: [a, b], dog, tick } = setup(100, 1000, 2000);
  a.working = b.working = true;
  for (let i = 0; i < 19; i++) {
    b.done++; // b finishes a call a tick: never stuck
    tick();
    dog.pong(a, a.pings.at(-1));
    dog.pong(b, b.pings.at(-1));
  }
  assert.deepEqual(a.losses, [], "first seen at work at 100 ms: 1,900 ms without a finished call");
  for (let i = 0; i < 2; i++) {
    b.done++;
    tick();
  }
  assert.equal(a.losses.length, 1, "2,000 ms without a finished call");
  assert.match(a.losses[0], /ran calls for 2000 ms without finishing one/);
  assert.match(a.losses[0], /ATTN_THREAD_STUCK_MS=2000/);
  for (let i = 0; i < 30; i++) {
    b.done++;
    tick();
  }
  assert.equal(a.losses.length, 1, "lost once");
  assert.deepEqual(b.losses, []);
});

Deno.test("thread watchdog: a finished call or an idle spell restarts the stuck clock; a late tick judges none", () => {
  const { threads: [a], dog, tick } = setup(100, 1000, 1000);
  a.working = true;
  const answer = () => dog.pong(a, a.pings.at(-1));
  for (let i = 0; i < 9; i++) (tick(), answer());
  a.done++; // a call ends at 900 ms: 900 more to go
  for (let i = 0; i < 9; i++) (tick(), answer());
  a.working = false; // idle at 1,800 ms, then busy again
  tick();
  answer();
  a.working = true;
  for (let i = 0; i < 9; i++) (tick(), answer());
  assert.deepEqual(a.losses, []);
  tick(5000); // late: the front itself was busy
  assert.deepEqual(a.losses, [], "a late tick judges no thread");
  tick();
  assert.equal(a.losses.length, 1);
});

Deno.test("thread watchdog: ATTN_THREAD_STUCK_MS is 0 (never) or at least 1,000 ms", () => {
  assert.equal(settingValue(THREAD_STUCK_SETTING, undefined), 0);
  assert.equal(settingValue(THREAD_STUCK_SETTING, ""), 0);
  assert.equal(settingValue(THREAD_STUCK_SETTING, "0"), 0);
  assert.equal(settingValue(THREAD_STUCK_SETTING, "600000"), 600_000);
  for (const bad of ["999", "-1", "abc", String(2 ** 31)]) {
    assert.throws(
      () => settingValue(THREAD_STUCK_SETTING, bad),
      (e) => e instanceof EnvValueError && e.variable === STUCK_ENV && e.value === bad,
      bad,
    );
  }
});
