/**
 * Big JSON forward bodies are decoded in a worker (server/json_decoder.ts): the result equals
 * the inline decode, errors come back as the same problem codes, and the event loop keeps
 * turning while a body of tens of MiB is parsed (inline it is blocked for the whole parse).
 */
import assert from "node:assert/strict";
import { ServiceError } from "../../core/errors.ts";
import { toFloat32 } from "../../core/data.ts";
import { JSON_WORKER_MIN_BYTES, JsonDecoder } from "../../server/json_decoder.ts";
import { decodeJsonForward } from "../../wire/codec.ts";
import { parseJson } from "../../server/body.ts";

function body(tokens: number): Uint8Array {
  const H = 8, D = 64, n = tokens * H * D;
  const q = Array.from({ length: n }, (_, i) => ((i * 7919) % 1000) / 1000 - 0.5);
  const kv = Array.from({ length: tokens * D }, (_, i) => ((i * 104729) % 997) / 997 - 0.5);
  return new TextEncoder().encode(JSON.stringify({
    dtype: "float16",
    layer: { num_heads: H, num_kv_heads: 1, head_size: D },
    query: { dtype: "float16", shape: [tokens, H, D], data: q },
    key: { dtype: "float16", shape: [tokens, 1, D], data: kv },
    value: { dtype: "float16", shape: [tokens, 1, D], data: kv },
    metadata: {
      query_start_loc: [0, tokens],
      seq_lens: [tokens],
      block_table: [Array.from({ length: Math.ceil(tokens / 16) }, (_, i) => i)],
      slot_mapping: Array.from({ length: tokens }, (_, i) => i),
    },
    kv_cache: "c",
  }));
}

Deno.test("json decoder: a big body decodes in the worker to what the inline decode gives", async () => {
  const dec = new JsonDecoder(50);
  try {
    const bytes = body(512);
    assert.ok(bytes.byteLength >= JSON_WORKER_MIN_BYTES, `${bytes.byteLength} bytes`);
    const inline = decodeJsonForward(parseJson(bytes));
    const viaWorker = await dec.decode(bytes.slice());
    assert.deepEqual(toFloat32(viaWorker.input.query.array), toFloat32(inline.input.query.array));
    assert.deepEqual(viaWorker.input.metadata.slot_mapping, inline.input.metadata.slot_mapping);
    assert.equal(viaWorker.encoding, "data");
    // Errors keep their code across the boundary.
    const bad = bytes.slice();
    bad[bad.length - 1] = 0x20; // the closing brace gone
    await assert.rejects(
      dec.decode(bad),
      (e) => e instanceof ServiceError && e.status === 400 && e.code === "malformed_json",
    );
  } finally {
    dec.close();
  }
});

Deno.test("json decoder: the event loop keeps turning while a big body is parsed", async () => {
  const dec = new JsonDecoder(50);
  try {
    const bytes = body(4096); // ~25 MiB of JSON
    const t0 = performance.now();
    decodeJsonForward(parseJson(bytes));
    const inlineMs = performance.now() - t0;
    // Each timer turn's time. A parse on this thread, even one inside a microtask (where no timer
    // turns before the await returns), is one long gap up to the next turn: a macrotask is
    // awaited before the timer is cleared, and the gaps count from the decode's start to the end.
    const turns: number[] = [];
    const tick = setInterval(() => turns.push(performance.now()), 5);
    const t1 = performance.now();
    await dec.decode(bytes);
    const t2 = performance.now();
    await new Promise((r) => setTimeout(r, 0));
    clearInterval(tick);
    const times = [t1, ...turns, performance.now()];
    const worst = Math.max(...times.slice(1).map((t, i) => t - times[i]));
    const workerMs = t2 - t1;
    const during = turns.filter((t) => t < t2).length;
    // The loop's worst gap must be a fraction of what decoding inline blocked it for.
    assert.ok(
      worst < Math.max(100, inlineMs / 3),
      `worst event-loop gap ${worst.toFixed(0)} ms during a ${workerMs.toFixed(0)} ms decode ` +
        `(inline decode blocks ${inlineMs.toFixed(0)} ms)`,
    );
    // A decode long enough for several timer turns had some while it ran.
    if (workerMs >= 50) {
      assert.ok(during >= 2, `${during} timer turns during a ${workerMs.toFixed(0)} ms decode`);
    }
    assert.equal(dec.workerDecodes, 1, "the body was decoded in the worker");
  } finally {
    dec.close();
  }
});

Deno.test("json decoder: keepWarm starts the worker at once and keeps it through idle periods", async () => {
  const idle = new JsonDecoder(30), warm = new JsonDecoder(30);
  try {
    const bytes = body(512);
    const inline = decodeJsonForward(parseJson(bytes));
    assert.equal(warm.running, false, "started on first use by default");
    warm.keepWarm();
    assert.equal(warm.running, true, "keepWarm starts it with no body waiting");
    for (const dec of [idle, warm]) {
      const got = await dec.decode(bytes.slice());
      assert.deepEqual(toFloat32(got.input.query.array), toFloat32(inline.input.query.array));
      assert.equal(dec.running, true);
    }
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(idle.running, false, "an idle worker is ended after idleMs");
    assert.equal(warm.running, true, "a warm one stays");
    const again = await warm.decode(bytes.slice());
    assert.deepEqual(again.input.metadata.slot_mapping, inline.input.metadata.slot_mapping);
  } finally {
    idle.close();
    warm.close();
  }
  assert.equal(warm.running, false, "close() ends it");
  // close() undoes keepWarm (a review: the flag stayed, and a later worker never idled out).
  await warm.decode(body(512));
  assert.equal(warm.running, true);
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(warm.running, false, "after close() a worker idles out again");
});
