/**
 * deploy/: `POST /v1/attention/forward` whose body names a server-held cache (`kv_cache`)
 * reaches the instance that holds it. nginx does not read bodies: it sent the call to the
 * instance the hash of a per-request id picked, which answered 404 `cache_not_found` about 2
 * times in 3 with 3 instances. Now an instance's 404 on that route passes the call (its body
 * kept by nginx, in memory or, past 1 MiB, in a file) to the next instance, until one answers
 * otherwise or each has answered 404 once; other answers, routes and pinned calls are not
 * retried. Skipped, saying so, where nginx is not installed (CI installs it: .ci/run).
 */
import assert from "node:assert/strict";
import { AttentionClient, type ForwardAnswer, type ForwardBody } from "../../client/client.ts";
import {
  decodeJsonAnswer,
  decodeSafetensorsAnswer,
  forwardBodyToSafetensors,
  jsonForwardBody,
} from "../../wire/client_codec.ts";
import type { RawResponse } from "../server/raw_http.ts";
import { encoderCall, maxAbsDiff } from "../server/helpers.ts";
import { HeldSeq } from "../server/held_seq.ts";
import { alive, waitFor } from "./nginx_path.ts";
import { assertProblem, deploy, type Deployment, NGINX } from "./nginx_deploy.ts";

if (!NGINX) console.log("nginx_body_route_test: skipped: no nginx binary in PATH or /usr/sbin");
const opts = { ignore: NGINX === null, sanitizeResources: false, sanitizeOps: false };
const MAX_BODY = 4 << 20;

/**
 * `body` naming `id` (if any) as JSON or safetensors, padded with spaces (in the JSON text, or
 * in the safetensors header, by whole 8-byte words) to about `size` bytes.
 */
function encode(
  body: ForwardBody,
  id: string | null,
  binary: boolean,
  size = 0,
): Uint8Array<ArrayBuffer> {
  const named = id === null ? body : { ...body, kv_cache: id };
  if (!binary) {
    const text = JSON.stringify(jsonForwardBody(named));
    return new TextEncoder().encode(`${text} ${" ".repeat(Math.max(0, size - text.length - 1))}`);
  }
  const st = forwardBodyToSafetensors(named);
  const pad = Math.max(0, Math.ceil((size - st.length) / 8) * 8);
  const hl = Number(new DataView(st.buffer, st.byteOffset).getBigUint64(0, true));
  const out = new Uint8Array(st.length + pad).fill(0x20);
  new DataView(out.buffer).setBigUint64(0, BigInt(hl + pad), true);
  out.set(st.subarray(8, 8 + hl), 8);
  out.set(st.subarray(8 + hl), 8 + hl + pad);
  return out;
}

interface Answer {
  raw: RawResponse;
  instance: string | null;
  ans?: ForwardAnswer;
}

/** POST `bytes` to `path` (`tag` in its query, to find its access log line), decoded. */
async function post(
  d: Deployment,
  path: string,
  tag: string,
  bytes: Uint8Array<ArrayBuffer>,
  binary: boolean,
  headers: Record<string, string> = {},
): Promise<Answer> {
  const type = binary ? "application/octet-stream" : "application/json";
  const res = await fetch(`${d.url}${path}?tag=${tag}`, {
    method: "POST",
    headers: { "content-type": type, accept: binary ? type : "application/json", ...headers },
    body: bytes,
  });
  const body = new Uint8Array(await res.arrayBuffer());
  const text = new TextDecoder().decode(body);
  const raw = { status: res.status, headers: new Map(res.headers), body, text };
  const out: Answer = { raw, instance: res.headers.get("x-attention-instance") };
  if (res.status === 200) {
    out.ans = binary ? decodeSafetensorsAnswer(body) : decodeJsonAnswer(JSON.parse(text));
  }
  return out;
}

/** The instances nginx tried for the call tagged `tag` (names, in order) and their statuses. */
async function tried(d: Deployment, tag: string): Promise<{ names: string[]; statuses: string[] }> {
  let line: string | undefined;
  // nginx logs the call once it has sent the answer: maybe a moment after the client read it.
  await waitFor(`the access log line of ${tag}`, 3000, async () => {
    const log = await Deno.readTextFile(`${d.prefix}/access.log`);
    line = log.split("\n").find((l) => l.includes(`?tag=${tag} `));
    return line !== undefined;
  });
  const m = line && / upstream=(.*) upstream_status=(.*) instance=/.exec(line);
  assert.ok(m, `${tag}: an access log line with upstream= and upstream_status=: ${line}`);
  const port = (a: string) => Number(a.slice(a.lastIndexOf(":") + 1));
  const names = m[1].split(", ").map((a) => d.instances.find((i) => i.port === port(a))!.name);
  return { names, statuses: m[2].split(", ") };
}

/** Each instance's count of `code` problems on `route`, by name. */
async function problems(d: Deployment, route: string, code: string) {
  const counts: Record<string, number> = {};
  for (const i of d.instances) {
    const text = await (await fetch(`http://127.0.0.1:${i.port}/metrics`)).text();
    const line = text.split("\n").find((l) =>
      l.startsWith("attn_http_problems_total{") && l.includes(`route="${route}"`) &&
      l.includes(`code="${code}"`)
    );
    counts[i.name] = line ? Number(line.slice(line.lastIndexOf(" ") + 1)) : 0;
  }
  return counts;
}

Deno.test({
  name:
    "nginx: a forward naming a held cache in its body reaches its instance, JSON or safetensors",
  ...opts,
  async fn() {
    const d = await deploy(3, ["--max-body-bytes", String(MAX_BODY)]);
    try {
      const proxy = new AttentionClient(d.url);
      // Caches until each instance holds 2; each with a twin fed the same steps on its path.
      const owner = new Map<string, string>();
      const held = (name: string) =>
        [...owner].filter(([id, o]) => o === name && !id.endsWith(".twin")).length;
      for (let i = 0; i < 60 && d.instances.some((x) => held(x.name) < 2); i++) {
        const put = await proxy.putCache(`held-${i}`, HeldSeq.cacheSpec());
        const twin = await proxy.putCache(`held-${i}.twin`, HeldSeq.cacheSpec());
        assert.ok(put.created && twin.created && put.instance && twin.instance);
        owner.set(`held-${i}`, put.instance).set(`held-${i}.twin`, twin.instance);
      }
      const ids = [...owner.keys()].filter((id) => !id.endsWith(".twin"));
      assert.ok(d.instances.every((x) => held(x.name) >= 2), `caches spread: ${[...owner]}`);
      let n = 0, retried = 0;
      for (const id of ids) {
        const seq = new HeldSeq();
        // The first cache of each instance also gets bodies nginx keeps in a file (over its
        // 1 MiB buffer): JSON up to the body limit, safetensors of 2 MiB.
        const big = ids.find((x) => owner.get(x) === owner.get(id)) === id;
        const steps: [number, boolean, number][] = [[3, false, 0], [2, true, 0]];
        if (big) steps.push([1, false, MAX_BODY - 64], [1, true, 2 << 20]);
        for (const [tokens, binary, size] of steps) {
          const { body, ref } = seq.step(tokens);
          const tag = `c${n++}`;
          const bytes = encode(body, id, binary, size);
          assert.ok(bytes.length >= size && bytes.length <= MAX_BODY, `${tag}: ${bytes.length}`);
          const a = await post(d, "/v1/attention/forward", tag, bytes, binary);
          const what = `${tag}: ${id} (${binary ? "safetensors" : "JSON"}, ${bytes.length} B)`;
          assert.equal(a.raw.status, 200, `${what}: ${a.raw.text}`);
          assert.equal(a.instance, owner.get(id), `${what}: answered by the holder`);
          const b = await proxy.forwardOn(`${id}.twin`, body, { binary });
          assert.equal(b.instance, owner.get(`${id}.twin`));
          assert.deepEqual(a.ans!.output.shape, b.output.shape, what);
          assert.equal(maxAbsDiff(a.ans!.output.values, b.output.values), 0, `${what}: as on path`);
          assert.ok(maxAbsDiff(a.ans!.output.values, ref) < 2e-5, `${what}: float64 reference`);
          // nginx tried instances that answered 404 (each once), then the holder.
          const t = await tried(d, tag);
          assert.equal(t.names.at(-1), owner.get(id), what);
          assert.equal(new Set(t.names).size, t.names.length, `${what}: ${t.names}`);
          assert.deepEqual(t.statuses, [...t.names.slice(1).map(() => "404"), "200"], what);
          if (t.names.length > 1) retried++;
        }
      }
      assert.ok(retried > 0, "some calls reached an instance that does not hold their cache");
      const errors = await Deno.readTextFile(`${d.prefix}/error.log`);
      assert.match(errors, /a client request body is buffered to a temporary file/);
    } finally {
      await d.stop();
    }
  },
});

Deno.test({
  name: "nginx: an unknown cache in a forward's body is tried on every instance once, then 404",
  ...opts,
  async fn(t) {
    const d = await deploy(3, []);
    const names = d.instances.map((i) => i.name);
    try {
      const before = await problems(d, "/v1/attention/forward", "cache_not_found");
      const { body } = new HeldSeq().step(1);
      for (let k = 0; k < 6; k++) {
        const id = `nope-${k}`, binary = k % 2 === 1, tag = `u${k}`;
        const a = await post(d, "/v1/attention/forward", tag, encode(body, id, binary), binary);
        const doc = assertProblem(a.raw, 404, "cache_not_found", tag);
        assert.equal(doc.cache_id, id);
        const tr = await tried(d, tag);
        assert.deepEqual([...tr.names].sort(), names, `${tag}: every instance, once`);
        assert.deepEqual(tr.statuses, ["404", "404", "404"]);
        assert.equal(a.instance, tr.names[2], `${tag}: the last one's problem`);
      }
      const after = await problems(d, "/v1/attention/forward", "cache_not_found");
      for (const n of names) assert.equal(after[n] - before[n], 6, `${n} answered each once`);

      await t.step("other calls on that route and the path route go to one instance", async () => {
        // A stateless call, one on an inline cache (zeros, HeldSeq's shape), a bad body, and
        // an unknown cache on its path: one instance each (no 404 of the body route).
        const plain = encoderCall(8, 2, 8);
        const inline = new HeldSeq().step(3);
        const zeros = { dtype: "float32", shape: [6, 4, 1, 8], data: new Array(192).fill(0) };
        const withCache = { ...inline.body, key_cache: zeros, value_cache: zeros };
        const calls: [string, string, Uint8Array<ArrayBuffer>, boolean, number, number[] | null][] =
          [
            ["s0", "/v1/attention/forward", encode(plain.body, null, false), false, 200, plain.ref],
            ["s1", "/v1/attention/forward", encode(plain.body, null, true), true, 200, plain.ref],
            ["s2", "/v1/attention/forward", encode(withCache, null, false), false, 200, inline.ref],
            ["s3", "/v1/attention/forward", encode(withCache, null, true), true, 200, inline.ref],
            ["s4", "/v1/attention/forward", new TextEncoder().encode("{"), false, 400, null],
            ["s5", "/v1/kv-caches/nope/forward", encode(body, null, false), false, 404, null],
          ];
        for (const [tag, path, bytes, binary, status, ref] of calls) {
          const a = await post(d, path, tag, bytes, binary);
          assert.equal(a.raw.status, status, `${tag}: ${a.raw.text}`);
          if (ref) assert.ok(maxAbsDiff(a.ans!.output.values, ref) < 2e-5, `${tag}: reference`);
          const tr = await tried(d, tag);
          assert.deepEqual(tr, { names: [a.instance], statuses: [String(status)] }, tag);
        }
      });

      let holder: string | undefined;
      await t.step("X-Attention-Instance keeps the call on the instance it names", async () => {
        holder =
          (await new AttentionClient(d.url).putCache("pinned", HeldSeq.cacheSpec())).instance;
        const other = names.find((n) => n !== holder)!;
        const bytes = encode(body, "pinned", false);
        const pin = { "x-attention-instance": other };
        const a = await post(d, "/v1/attention/forward", "p0", bytes, false, pin);
        assertProblem(a.raw, 404, "cache_not_found", "pinned elsewhere");
        assert.deepEqual(await tried(d, "p0"), { names: [other], statuses: ["404"] });
      });

      await t.step("an instance that is down is passed over on the way to the holder", async () => {
        assert.ok(holder);
        const victim = d.instances.find((i) => i.name !== holder)!;
        Deno.kill(victim.pid, "SIGKILL");
        await waitFor(`${victim.name} to exit`, 10_000, () => !alive(victim.pid));
        // Until the dead one was tried first (1 in 3 a call): every call answered by the holder.
        let passed = false;
        for (let k = 0; k < 40 && !passed; k++) {
          const seq = new HeldSeq(); // slot writes only: each call's output is its own
          const { body, ref } = seq.step(1);
          const a = await post(
            d,
            "/v1/attention/forward",
            `x${k}`,
            encode(body, "pinned", true),
            true,
          );
          assert.equal(a.raw.status, 200, a.raw.text);
          assert.equal(a.instance, holder);
          assert.ok(maxAbsDiff(a.ans!.output.values, ref) < 2e-5);
          const tr = await tried(d, `x${k}`);
          passed = tr.names[0] === victim.name && tr.statuses[0] === "502";
        }
        assert.ok(passed, `${victim.name} was never tried first`);
      });
    } finally {
      await d.stop();
    }
  },
});
