/**
 * deploy/start.sh stops without losing a call: a slow call sent through nginx is answered (and
 * right) when start.sh gets SIGTERM, or when a terminal's Ctrl-C signals its whole process group,
 * and the `ready` file goes with the deployment. Before, start.sh sent nginx SIGTERM first,
 * which closed every client connection at once (curl: an empty reply 40-75 ms after the signal,
 * while the instance finished a result nobody got), and Ctrl-C reached nginx directly. Also: an
 * earlier run's pins are dropped at start, and `--host [::1]` serves. Skipped, saying so, where
 * nginx is not installed (CI installs it: .ci/run).
 */
import assert from "node:assert/strict";
import { AttentionClient } from "../../client/client.ts";
import { encoderCall, maxAbsDiff } from "../server/helpers.ts";
import { findNginx, freePorts, readInstances, waitForStart } from "./nginx_path.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const NGINX = findNginx();
const SETSID = ["/usr/bin/setsid", "/bin/setsid"].find((p) => {
  try {
    return Deno.statSync(p).isFile;
  } catch {
    return false;
  }
});

/** A non-causal encoder_only call on CPU_REFERENCE that takes seconds on the dev VM. */
const slowCall = () => encoderCall(2048, 4, 32);

/** Whether this machine has an IPv6 loopback. */
const IPV6 = (() => {
  try {
    Deno.listen({ hostname: "::1", port: 0 }).close();
    return true;
  } catch {
    return false;
  }
})();

/**
 * SIGKILLs what start.sh left running in `prefix`: each instance's and nginx's process group
 * (start.sh gives each its own; nginx's workers, left alone, keep the script's pipes open).
 */
async function killDeployment(prefix: string): Promise<void> {
  const started = await readInstances(prefix).catch(() => []);
  const pids = started.map((i) => i.pid).filter((pid) => pid > 0);
  const nginx = Number((await Deno.readTextFile(`${prefix}/nginx.pid`).catch(() => "")).trim());
  if (nginx > 0) pids.push(nginx);
  for (const pid of pids) {
    for (const target of [-pid, pid]) {
      try {
        Deno.kill(target, "SIGKILL");
      } catch { /* gone, or not a group */ }
    }
  }
}

async function drainThrough(
  stop: (script: Deno.ChildProcess) => void,
  group: boolean,
  host = "127.0.0.1",
) {
  const prefix = await Deno.makeTempDir({ prefix: "attn-drain-" });
  // A pin left by an earlier run, to an instance this one lacks: start.sh empties the file (it
  // kept it: the id answered nginx's 502, "no resolver defined").
  await Deno.writeTextFile(`${prefix}/moved_caches.map`, '"~^stale$" attn_i7;\n');
  const { port, base } = freePorts(1);
  const args = [`${ROOT}deploy/start.sh`, "--instances", "1", "--no-gpu", "--port", String(port)];
  args.push("--base-port", String(base), "--prefix", prefix, "--host", host);
  const script = new Deno.Command(group ? SETSID! : "bash", {
    args: group ? ["bash", ...args] : args,
    env: { NGINX: NGINX!, DENO: Deno.execPath() },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const logs = Promise.all([script.stdout, script.stderr].map((s) => new Response(s).text()));
  try {
    await waitForStart(prefix, script, logs);
    const origin = `http://${host}:${port}`;
    const stale = await fetch(`${origin}/v1/kv-caches/stale`);
    await stale.body?.cancel();
    assert.equal(stale.status, 404, "an earlier run's pin was dropped");
    assert.equal(await Deno.readTextFile(`${prefix}/moved_caches.map`), "");
    // A create whose id an instance would choose cannot be routed later: refused at nginx.
    const spec = { num_blocks: 1, block_size: 16, num_kv_heads: 1, head_size: 8, dtype: "float32" };
    const post = await fetch(`${origin}/v1/kv-caches`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(spec),
    });
    assert.equal(post.status, 501);
    assert.equal(post.headers.get("content-type"), "application/problem+json");
    assert.equal((await post.json()).code, "not_routable");
    const { body, ref } = slowCall();
    const call = new AttentionClient(origin).forward(body, { binary: true });
    await new Promise((r) => setTimeout(r, 500)); // the call is running on the instance
    const t0 = performance.now();
    stop(script);
    const ans = await call;
    assert.ok(performance.now() - t0 > 200, "the call was still running at the signal");
    assert.ok(maxAbsDiff(ans.output.values, ref) < 2e-5, "the call's answer, right");
    const st = await script.status;
    assert.equal(st.code, 0, (await logs).join("\n"));
    await assert.rejects(Deno.stat(`${prefix}/ready`), Deno.errors.NotFound, "ready removed");
  } finally {
    try {
      script.kill("SIGKILL");
    } catch { /* exited */ }
    await killDeployment(prefix); // after a failure: they hold the script's pipes open
    await logs;
    await Deno.remove(prefix, { recursive: true }).catch(() => {});
  }
}

Deno.test({
  name: "deploy: SIGTERM to start.sh answers the calls in flight first",
  ignore: NGINX === null,
  sanitizeResources: false,
  sanitizeOps: false,
  fn: () => drainThrough((s) => s.kill("SIGTERM"), false),
});

Deno.test({
  name: "deploy: Ctrl-C (SIGINT to start.sh's process group) answers them too",
  ignore: NGINX === null || SETSID === undefined,
  sanitizeResources: false,
  sanitizeOps: false,
  fn: () => drainThrough((s) => Deno.kill(-s.pid, "SIGINT"), true),
});

Deno.test({
  name: "deploy: --host [::1] (a bracketed IPv6 loopback) serves and drains",
  ignore: NGINX === null || !IPV6,
  sanitizeResources: false,
  sanitizeOps: false,
  // It wrote `listen [[::1]]:P`, which nginx refused.
  fn: () => drainThrough((s) => s.kill("SIGTERM"), false, "[::1]"),
});
