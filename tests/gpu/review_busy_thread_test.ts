/**
 * The device threads' liveness watchdog (server/thread_watchdog.ts) on a GPU: with Deno's
 * runtime a forward call's completion wait holds the device thread's JS thread for the whole of
 * the call's GPU work (10 s for one 8192-token f32 prefill on lavapipe, over 30 s for a
 * 32768-token one, both within the default call limits). The watchdog used to take that thread
 * for a blocked one: past ATTN_THREAD_LOST_MS the call answered 503 device_thread_lost, the thread
 * was terminated and every cache on it gone (a review; failed when written, lavapipe, 2 cores).
 * A thread running a call is not lost now. The call here, a 4096-token f32 prefill answered as
 * safetensors, takes about 5 s on lavapipe (2 cores), past the 2 s lost limit the test sets (an
 * 8192-token call answered as JSON took 42-48 s of CI's time for the same check). On a fast GPU
 * the call is short and the test passes trivially.
 */
import assert from "node:assert/strict";
import { NO_GPU, SERVE_RUNTIME } from "../support/gpu.ts";
import { spawnServer } from "../server/process.ts";
import { prefillBody } from "../server/helpers.ts";
import { forwardBodyToSafetensors } from "../../client/client.ts";

const T = 4096, H = 4, D = 64, BS = 16;

async function start(env: Record<string, string>) {
  return await spawnServer(
    ["--device-threads", "2", ...SERVE_RUNTIME.args],
    { DENO_WEBGPU_BACKEND: Deno.env.get("DENO_WEBGPU_BACKEND") ?? "", ...env },
    [...SERVE_RUNTIME.perms, "--allow-run"],
  );
}

async function putCache(url: string, id: string): Promise<number> {
  const r = await fetch(`${url}/v1/kv-caches/${id}`, {
    method: "PUT",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      num_blocks: T / BS + 1,
      block_size: BS,
      num_kv_heads: H,
      head_size: D,
      dtype: "float32",
    }),
  });
  await r.body?.cancel();
  return r.status;
}

/** The long prefill on cache `id`, as safetensors (within every default limit). */
function bigCall(url: string, id: string): Promise<Response> {
  const body = forwardBodyToSafetensors({
    ...prefillBody({ h: H, hkv: H, d: D, bs: BS, t: T }),
    kv_cache: id,
  });
  return fetch(`${url}/v1/attention/forward`, {
    method: "POST",
    headers: { "content-type": "application/octet-stream", accept: "application/octet-stream" },
    body: body as unknown as BodyInit,
  });
}

Deno.test({
  name: "review busy thread: a thread busy in one long forward is not lost, nor its caches",
  ignore: NO_GPU,
}, async () => {
  // A lost limit shorter than the call (the default 30 s is shorter than a 32768-token call).
  const srv = await start({ ATTN_THREAD_PING_MS: "200", ATTN_THREAD_LOST_MS: "2000" });
  try {
    assert.equal(await putCache(srv.url, "a"), 201);
    const t0 = performance.now();
    const res = await bigCall(srv.url, "a");
    const text = await res.text();
    const s = ((performance.now() - t0) / 1000).toFixed(1);
    assert.equal(res.status, 200, `after ${s} s: ${text.slice(0, 300)}`);
    const again = await fetch(`${srv.url}/v1/kv-caches/a`);
    await again.body?.cancel();
    assert.equal(again.status, 200, "the cache the call wrote");
    assert.doesNotMatch(srv.stderr(), /stopped/);
  } finally {
    srv.kill("SIGTERM");
    await srv.exited;
  }
});
