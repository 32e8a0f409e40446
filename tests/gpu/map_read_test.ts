/**
 * Read-backs without Deno's 10 ms sleep (gpu/map_read.ts): on Deno's runtime a buffer mapped
 * once the awaited way is read as soon as `mapAsync` returns, and what it reads is what the GPU
 * wrote by then (fresh random words each round, the buffer poisoned before each copy); a range
 * not mapped yet falls back to the promise; `ATTN_EARLY_READ` and the Deno version decide, and a
 * value its rule refuses fails the device's acquire without leaving the device alive.
 */
import assert from "node:assert/strict";
import {
  DEFER_READ_SETTING,
  defersReads,
  EARLY_READ_SETTING,
  earlyReadDefault,
  mapDeferredReads,
  mapReadCounts,
  mapReadRange,
  mapReadRangeDeferred,
  markDenoDevice,
  ownsMappedCopies,
  readsEarly,
  settleEarlyReads,
} from "../../gpu/map_read.ts";
import { type EnvSetting, EnvValueError, settingValue } from "../../core/env.ts";
import { WebGpuDeviceManager } from "../../gpu/device.ts";
import { withEnv } from "../support/env.ts";
import { launch } from "../../gpu/launch.ts";
import { deviceSummary } from "../../gpu/runtime_report.ts";
import { hostPool } from "../../gpu/host_pool.ts";
import { freshSeed, GPU, GPU_TEST, rng } from "./helpers.ts";
import { MANAGER, SELECTION } from "../support/gpu.ts";

const WORDS = 4096;

/** Writes `words` to `src`, poisons `dst`'s range through a copy of NaN words, then copies. */
function copyOver(
  dev: GPUDevice,
  src: GPUBuffer,
  poison: GPUBuffer,
  dst: GPUBuffer,
  w: Uint32Array<ArrayBuffer>,
) {
  dev.queue.writeBuffer(src, 0, w);
  const enc = dev.createCommandEncoder();
  enc.copyBufferToBuffer(poison, 0, dst, 0, WORDS * 4);
  enc.copyBufferToBuffer(src, 0, dst, 0, WORDS * 4);
  dev.queue.submit([enc.finish()]);
}

Deno.test({
  name: "map read: Deno's runtime reads a primed buffer at once, and reads what the GPU wrote",
  ...GPU_TEST,
  ignore: GPU_TEST.ignore || SELECTION.runtime.name !== "deno",
  async fn() {
    const dev = GPU!.device;
    const checked = earlyReadDefault(Deno.version.deno);
    assert.equal(readsEarly(dev), checked);
    assert.equal(MANAGER.report().readback, checked ? "early" : "awaited");
    assert.equal(MANAGER.report().readback_deferred, defersReads(dev));
    assert.equal(defersReads(dev), checked, "deferred wherever early (ATTN_DEFER_READ unset)");
    // The start-up line says both.
    const line = deviceSummary(MANAGER.report());
    assert.equal(line.includes("read-back as soon as the GPU is done"), checked, line);
    assert.equal(line.includes("after the other ready calls' host work"), checked, line);
    if (!readsEarly(dev)) return; // an unchecked Deno version: the awaited path only
    const usage = GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
    const src = dev.createBuffer({ size: WORDS * 4, usage });
    const poison = dev.createBuffer({ size: WORDS * 4, usage });
    dev.queue.writeBuffer(poison, 0, new Uint32Array(WORDS).fill(0x7fc00000));
    const dst = dev.createBuffer({
      size: WORDS * 4,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
    const r = rng(freshSeed());
    const before = { ...mapReadCounts };
    try {
      for (let round = 0; round < 12; round++) {
        const w = new Uint32Array(WORDS).map(() => (r() * 2 ** 32) >>> 0);
        copyOver(dev, src, poison, dst, w);
        const got = new Uint32Array(await mapReadRange(dev, dst, 0, WORDS * 4)).slice();
        dst.unmap();
        assert.deepEqual(got, w, `round ${round}`);
      }
      // The first map of a buffer is awaited; every later one is read as mapAsync returns (the
      // counts, not a time: a loaded machine may take long for the copy either way).
      assert.equal(mapReadCounts.awaited - before.awaited, 1);
      assert.equal(mapReadCounts.early - before.early, 11);
      await settleEarlyReads();
    } finally {
      src.destroy();
      poison.destroy();
      dst.destroy();
    }
  },
});

/** A stand-in buffer whose range is readable only once its map promise resolved. */
function fakeBuffer(bytes: Uint8Array, mappedEarly: boolean) {
  let mapped = false;
  const calls: string[] = [];
  const buffer = {
    mapAsync() {
      calls.push("mapAsync");
      if (mappedEarly) mapped = true;
      return new Promise<void>((res) =>
        setTimeout(() => {
          mapped = true;
          res();
        }, 5)
      );
    },
    getMappedRange(offset: number, size: number) {
      calls.push(mapped ? "range" : "range refused");
      if (!mapped) throw new DOMException("not mapped", "OperationError");
      return bytes.slice(offset, offset + size).buffer;
    },
    unmap() {
      mapped = false;
    },
  };
  return { buffer: buffer as unknown as GPUBuffer, calls };
}

Deno.test("map read: a range not mapped when mapAsync returns waits for the promise", async () => {
  const dev = {} as GPUDevice;
  await withEnv({ ATTN_EARLY_READ: "1" }, () => {
    assert.equal(markDenoDevice(dev, "0.0.0"), true);
  });
  const { buffer, calls } = fakeBuffer(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8]), false);
  // First map: awaited (the buffer is not primed), no early try.
  assert.deepEqual([...new Uint8Array(await mapReadRange(dev, buffer, 4, 4))], [5, 6, 7, 8]);
  buffer.unmap();
  assert.deepEqual(calls, ["mapAsync", "range"]);
  // Primed now; the range still refuses before the promise: the read waits, then reads.
  calls.length = 0;
  assert.deepEqual([...new Uint8Array(await mapReadRange(dev, buffer, 0, 2))], [1, 2]);
  assert.deepEqual(calls, ["mapAsync", "range refused", "range"]);
  buffer.unmap();
  // Mapped within the call: read at once, the promise left behind settles later.
  const early = fakeBuffer(new Uint8Array([9, 8, 7, 6]), true);
  await mapReadRange(dev, early.buffer, 0, 4); // primes it
  early.buffer.unmap();
  early.calls.length = 0;
  const before = mapReadCounts.early;
  assert.deepEqual([...new Uint8Array(await mapReadRange(dev, early.buffer, 0, 4))], [9, 8, 7, 6]);
  assert.deepEqual(early.calls, ["mapAsync", "range"]);
  assert.equal(mapReadCounts.early, before + 1);
  early.buffer.unmap();
  await settleEarlyReads();
});

Deno.test("map read: a deferred read waits a turn, and another call's submit maps it first", async () => {
  const dev = {} as GPUDevice;
  await withEnv({ ATTN_EARLY_READ: "1" }, () => markDenoDevice(dev, "0.0.0"));
  assert.equal(defersReads(dev), true, "ATTN_DEFER_READ unset: on where reads are early");
  const { buffer, calls } = fakeBuffer(new Uint8Array([1, 2, 3, 4]), true);
  // Not primed: mapped within the call (its first map is awaited anyway).
  const first = mapReadRangeDeferred(dev, buffer, 0, 4);
  assert.deepEqual(calls, ["mapAsync"], "the map began within the call");
  await first;
  buffer.unmap();
  calls.length = 0;
  const before = { ...mapReadCounts };
  // Alone: nothing mapped within the call; mapped once its turn came.
  const alone = mapReadRangeDeferred(dev, buffer, 0, 4);
  assert.deepEqual(calls, [], "not mapped within the call");
  assert.deepEqual([...new Uint8Array(await alone)], [1, 2, 3, 4]);
  assert.deepEqual(calls, ["mapAsync", "range"]);
  buffer.unmap();
  calls.length = 0;
  // Another call's submit maps it before its turn comes, once.
  const taken = mapReadRangeDeferred(dev, buffer, 0, 4);
  mapDeferredReads(dev);
  assert.deepEqual(calls, ["mapAsync", "range"], "mapped by the submit");
  mapDeferredReads(dev);
  assert.deepEqual([...new Uint8Array(await taken)], [1, 2, 3, 4]);
  assert.deepEqual(calls, ["mapAsync", "range"], "not mapped again");
  assert.equal(mapReadCounts.deferred - before.deferred, 2);
  assert.equal(mapReadCounts.by_submit - before.by_submit, 1);
  buffer.unmap();
  // ATTN_DEFER_READ=0: a primed buffer is mapped within the call again.
  const off = {} as GPUDevice;
  await withEnv(
    { ATTN_EARLY_READ: "1", ATTN_DEFER_READ: "0" },
    () => markDenoDevice(off, "0.0.0"),
  );
  assert.equal(defersReads(off), false);
  const b = fakeBuffer(new Uint8Array([5, 6]), true);
  await mapReadRange(off, b.buffer, 0, 2);
  b.buffer.unmap();
  b.calls.length = 0;
  const now = mapReadRangeDeferred(off, b.buffer, 0, 2);
  assert.deepEqual(b.calls, ["mapAsync", "range"]);
  assert.deepEqual([...new Uint8Array(await now)], [5, 6]);
  b.buffer.unmap();
  await settleEarlyReads();
});

/** `setting` is a switch unset by default: 0 off, 1 on, `bad` refused naming the variable. */
function assertSwitch(setting: EnvSetting<boolean | null>, bad: string) {
  assert.equal(settingValue(setting, undefined), null);
  assert.equal(settingValue(setting, "0"), false);
  assert.equal(settingValue(setting, "1"), true);
  assert.throws(
    () => settingValue(setting, bad),
    (e: unknown) =>
      e instanceof EnvValueError && new RegExp(`${setting.name}.*${bad}`).test(e.message),
  );
}

Deno.test("map read: ATTN_DEFER_READ is 0 or 1; reads are deferred only where they are early", async () => {
  assertSwitch(DEFER_READ_SETTING, "on");
  const dev = {} as GPUDevice;
  await withEnv(
    { ATTN_EARLY_READ: "0", ATTN_DEFER_READ: "1" },
    () => markDenoDevice(dev, "2.9.6"),
  );
  assert.equal(defersReads(dev), false, "awaited reads are not deferred");
});

Deno.test("map read: ATTN_EARLY_READ is 0 or 1; unset, Deno 2.9.0-2.9.6 read early, others do not", async () => {
  assertSwitch(EARLY_READ_SETTING, "yes");
  assert.equal(earlyReadDefault("2.9.6"), true);
  assert.equal(earlyReadDefault("2.9.0"), true);
  assert.equal(earlyReadDefault("2.9.7"), false);
  assert.equal(earlyReadDefault("2.9.60"), false);
  assert.equal(earlyReadDefault("2.10.0"), false);
  assert.equal(earlyReadDefault("3.0.0"), false);
  const dev = {} as GPUDevice;
  await withEnv({ ATTN_EARLY_READ: "0" }, () => {
    assert.equal(markDenoDevice(dev, "2.9.6"), false);
    assert.equal(readsEarly(dev), false);
  });
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

Deno.test({
  name: "map read: a refused ATTN_EARLY_READ fails the acquire and leaves no device behind",
  ...GPU_TEST,
  ignore: GPU_TEST.ignore || SELECTION.runtime.name !== "deno",
  async fn() {
    const base = SELECTION.runtime;
    const devices: GPUDevice[] = [];
    const runtime = {
      ...base,
      prepareDevice: (d: GPUDevice) => {
        devices.push(d);
        base.prepareDevice?.(d);
      },
    };
    const m = new WebGpuDeviceManager({ runtime });
    try {
      await withEnv({ ATTN_EARLY_READ: "yes" }, async () => {
        for (let i = 0; i < 2; i++) {
          await assert.rejects(m.acquire(), (e: unknown) => e instanceof EnvValueError);
        }
      });
      assert.equal(devices.length, 2, "each acquire made a device");
      const fate = await Promise.all(
        devices.map((d) =>
          Promise.race([d.lost.then(() => "destroyed"), sleep(300).then(() => "alive")])
        ),
      );
      assert.deepEqual(fate, ["destroyed", "destroyed"], "devices of failed acquires");
    } finally {
      m.close();
      for (const d of devices) d.destroy();
    }
  },
});

Deno.test({
  name: "map read: on Deno's runtime a launch's parts are Deno's own copy, freed by release",
  ...GPU_TEST,
  ignore: GPU_TEST.ignore || SELECTION.runtime.name !== "deno",
  async fn() {
    const ctx = GPU!;
    const dev = ctx.device;
    assert.equal(ownsMappedCopies(dev), earlyReadDefault(Deno.version.deno));
    if (!ownsMappedCopies(dev)) return;
    const src = dev.createBuffer({
      size: WORDS * 4,
      usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
    });
    const r = rng(freshSeed());
    const held: { parts: Uint8Array[]; release: () => void; w: Uint32Array }[] = [];
    const leases = hostPool.stats();
    try {
      for (let round = 0; round < 4; round++) {
        const w = new Uint32Array(WORDS).map(() => (r() * 2 ** 32) >>> 0);
        const res = await launch(ctx, {
          label: "map_read.owned",
          uploads: [{ buffer: src, data: new Uint8Array(w.buffer) }],
          calls: [],
          reads: [{ buffer: src, bytes: WORDS * 4 }],
        });
        held.push({ ...res, w });
      }
      // Every result still holds its own words after later calls reused the read-back buffer.
      for (const h of held) assert.deepEqual(new Uint32Array(h.parts[0].slice().buffer), h.w);
      assert.deepEqual(hostPool.stats().in_use, leases.in_use, "no host lease taken");
      for (const h of held) {
        h.release();
        h.release(); // idempotent
        assert.equal(h.parts[0].byteLength, 0, "released memory is freed at once (detached)");
      }
      await settleEarlyReads();
    } finally {
      src.destroy();
    }
  },
});

Deno.test({
  name:
    "map read: launches in flight together: each reads its own words, later submits map earlier reads",
  ...GPU_TEST,
  ignore: GPU_TEST.ignore || SELECTION.runtime.name !== "deno",
  async fn() {
    const ctx = GPU!;
    const dev = ctx.device;
    const N = 6;
    const usage = GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
    const srcs = Array.from({ length: N }, () => dev.createBuffer({ size: WORDS * 4, usage }));
    const r = rng(freshSeed());
    const before = { ...mapReadCounts };
    try {
      // Round 0 primes the read-back buffers; rounds 1-3 find them primed.
      for (let round = 0; round < 4; round++) {
        const words = srcs.map(() => new Uint32Array(WORDS).map(() => (r() * 2 ** 32) >>> 0));
        const results = await Promise.all(srcs.map((src, i) =>
          launch(ctx, {
            label: "map_read.deferred",
            uploads: [{ buffer: src, data: new Uint8Array(words[i].buffer) }],
            calls: [],
            reads: [{ buffer: src, bytes: WORDS * 4 }],
          })
        ));
        results.forEach((res, i) => {
          assert.deepEqual(new Uint32Array(res.parts[0].slice().buffer), words[i], `${round}/${i}`);
          res.release();
        });
      }
      if (defersReads(dev)) {
        assert.ok(mapReadCounts.by_submit > before.by_submit, JSON.stringify(mapReadCounts));
      }
      await settleEarlyReads();
    } finally {
      for (const s of srcs) s.destroy();
    }
  },
});
