/**
 * deploy/start.sh stops without losing a call: a slow call sent through nginx is answered (and
 * right) when start.sh gets SIGTERM, or when a terminal's Ctrl-C signals its whole process group,
 * and the `ready` file goes with the deployment. Before, start.sh sent nginx SIGTERM first,
 * which closed every client connection at once (curl: an empty reply 40-75 ms after the signal,
 * while the instance finished a result nobody got), and Ctrl-C reached nginx directly. Skipped,
 * saying so, where nginx is not installed (CI installs it: .ci/run).
 */
import assert from "node:assert/strict";
import { AttentionClient, type ForwardBody } from "../../client/client.ts";
import { maxAbsDiff, rand, refAttention, to3d } from "../server/helpers.ts";
import { findNginx, freePorts, waitFor } from "./nginx_path.ts";

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
function slowCall(): { body: ForwardBody; ref: number[] } {
  const T = 2048, H = 4, D = 32;
  const t = () => rand(T * H * D).map(Math.fround);
  const q = t(), k = t(), v = t();
  const tensor = (data: number[]) => ({ dtype: "float32", shape: [T, H, D], data });
  const r = (x: number[]) => to3d(x, T, H, D);
  return {
    body: {
      dtype: "float32",
      layer: { num_heads: H, num_kv_heads: H, head_size: D, attn_type: "encoder_only" },
      query: tensor(q),
      key: tensor(k),
      value: tensor(v),
      metadata: { query_start_loc: [0, T], seq_lens: [T] },
    },
    ref: refAttention({ q: r(q), k: r(k), v: r(v) }, { causal: false }).out.flat(2),
  };
}

async function drainThrough(stop: (script: Deno.ChildProcess) => void, group: boolean) {
  const prefix = await Deno.makeTempDir({ prefix: "attn-drain-" });
  const { port, base } = freePorts(1);
  const args = [`${ROOT}deploy/start.sh`, "--instances", "1", "--no-gpu", "--port", String(port)];
  args.push("--base-port", String(base), "--prefix", prefix);
  const script = new Deno.Command(group ? SETSID! : "bash", {
    args: group ? ["bash", ...args] : args,
    env: { NGINX: NGINX!, DENO: Deno.execPath() },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const logs = Promise.all([script.stdout, script.stderr].map((s) => new Response(s).text()));
  try {
    await waitFor("deploy/start.sh to be ready", 60_000, async () => {
      try {
        return (await Deno.stat(`${prefix}/ready`)).isFile;
      } catch {
        return false;
      }
    });
    const { body, ref } = slowCall();
    const call = new AttentionClient(`http://127.0.0.1:${port}`).forward(body, { binary: true });
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
