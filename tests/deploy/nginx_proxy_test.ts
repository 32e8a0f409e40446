/**
 * deploy/: what nginx answers itself, how long it waits for a body, and its routes to one
 * instance by name, each end to end (deploy/start.sh, `--no-gpu` instances and nginx on loopback).
 * - nginx's own refusals (400, 405, 414, 431, 501, 505, and its 404 for its internal paths) were
 *   its HTML pages; they are problem documents now, as the instances answer, while the instances'
 *   own problems (404, 400, 405) still pass through unchanged. nginx's 408 sends no answer at all.
 * - nginx's client_body_timeout was its 60 s default, the instances' own default, so the two
 *   raced, and an instance given a longer `--body-timeout-ms` lost to nginx (which closes the
 *   connection with no answer); start.sh renders it from the instances' setting now, and a
 *   stalled body gets the instance's own 408 problem through nginx.
 * - `GET /instances/NAME/{healthz,metrics,v1/device}` reach the instance NAME (they went to an
 *   instance the hash picked, which answered 404): an operator can scrape each one.
 * Skipped, saying so, where nginx is not installed (CI installs it: .ci/run).
 */
import assert from "node:assert/strict";
import { rawExchange, rawRequest, type RawResponse } from "../server/raw_http.ts";
import { alive, freePorts, waitFor } from "./nginx_path.ts";
import { assertProblem, deploy, NGINX } from "./nginx_deploy.ts";

const START = new URL("../../deploy/start.sh", import.meta.url).pathname;
if (!NGINX) {
  console.log("nginx_proxy_test: skipped: no nginx binary in PATH or /usr/sbin");
}

const ignore = NGINX === null;
const resources = { sanitizeResources: false, sanitizeOps: false };

Deno.test({
  name: "nginx: its own refusals are problem documents; the instances' own pass through unchanged",
  ignore,
  ...resources,
  async fn(t) {
    const d = await deploy(2, ["--max-body-bytes", String(1 << 20)]);
    try {
      const long = "a".repeat(9000);
      const get = (line: string, fields = "Host: x\r\n") => `${line}\r\n${fields}\r\n`;
      const post = (fields: string, body = "") =>
        `POST /v1/attention/forward HTTP/1.1\r\nHost: 127.0.0.1\r\n${fields}\r\n${body}`;
      // Each is refused by nginx before any instance sees it: [what, request, status, code].
      const refusals: [string, string | Uint8Array, number, string][] = [
        ["a request line that is not one", get("GARBAGE", ""), 400, "bad_request"],
        ["a method that is not a token", get("G@T /healthz HTTP/1.1"), 400, "bad_request"],
        [
          "a header name with a space",
          get("GET /healthz HTTP/1.1", "A B: c\r\n"),
          400,
          "bad_request",
        ],
        ["no Host in HTTP/1.1", get("GET /healthz HTTP/1.1", ""), 400, "bad_request"],
        ["two Hosts", get("GET /healthz HTTP/1.1", "Host: a\r\nHost: b\r\n"), 400, "bad_request"],
        ["a path above the root", get("GET /../x HTTP/1.1"), 400, "bad_request"],
        ["a Content-Length of letters", post("Content-Length: abc\r\n"), 400, "bad_request"],
        [
          "Content-Length and Transfer-Encoding",
          post("Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"),
          400,
          "bad_request",
        ],
        ["a broken chunk", post("Transfer-Encoding: chunked\r\n", "zz\r\n"), 400, "bad_request"],
        ["TRACE", get("TRACE /healthz HTTP/1.1"), 405, "method_not_allowed"],
        ["a 9000-byte URI", get(`GET /${long} HTTP/1.1`), 414, "uri_too_long"],
        [
          "a 9000-byte header",
          get("GET /healthz HTTP/1.1", `Host: x\r\nX-Big: ${long}\r\n`),
          431,
          "headers_too_large",
        ],
        ["Transfer-Encoding: gzip", post("Transfer-Encoding: gzip\r\n"), 501, "not_implemented"],
        ["HTTP/2.5", get("GET /healthz HTTP/2.5"), 505, "http_version_not_supported"],
        ["nginx's internal path", rawRequest("GET", "/_attn_proxy/400", {}), 404, "not_found"],
      ];
      await t.step("nginx's refusals are problems, not HTML", async () => {
        for (const [what, req, status, code] of refusals) {
          const r = await rawExchange(d.port, req);
          const doc = assertProblem(r, status, code, what);
          assert.equal(r!.headers.get("x-attention-instance"), undefined, `${what}: from nginx`);
          if (status === 414) assert.equal(doc.max_request_line_bytes, 8192);
          if (status === 431) assert.equal(doc.max_header_line_bytes, 8192);
        }
      });

      await t.step("the instances' own problems pass through unchanged", async () => {
        const cases: [string, RequestInit, number, string][] = [
          ["/v1/nope", {}, 404, "not_found"],
          [
            "/v1/backends/select",
            { method: "POST", headers: { "content-type": "application/json" }, body: "{" },
            400,
            "malformed_json",
          ],
          ["/healthz", { method: "POST" }, 405, "method_not_allowed"],
        ];
        for (const [path, init, status, code] of cases) {
          const via = await fetch(`${d.url}${path}`, init);
          const name = via.headers.get("x-attention-instance");
          const at = d.instances.find((i) => i.name === name);
          assert.ok(at, `${path}: answered by an instance (${name})`);
          const direct = await fetch(`http://127.0.0.1:${at.port}${path}`, init);
          assert.equal(via.status, status, path);
          assert.equal(via.headers.get("content-type"), "application/problem+json");
          assert.equal(via.headers.get("allow"), direct.headers.get("allow"), path);
          const [a, b] = [await via.json(), await direct.json()];
          assert.equal(a.code, code, path);
          assert.deepEqual(a, b, `${path}: the instance's own problem`);
          assert.equal(a.instance, new URL(path, d.url).pathname, "the instance's own field");
        }
      });

      await t.step("nginx's 408s (header or body timeout) send no answer at all", async () => {
        // Both lowered for the test (the instances keep their 60 s): error_page cannot make these
        // problems, as nginx closes the connection without a word.
        const conf = (await d.conf())
          .replace(/^\s*client_body_timeout \S+;\n/m, "")
          .replace(
            /^\s*listen [^;]*;$/m,
            "$&\n    client_header_timeout 1s;\n    client_body_timeout 1s;",
          );
        assert.equal(conf.match(/client_body_timeout \S+;/g)?.length, 1);
        await d.reload(conf);
        await new Promise((r) => setTimeout(r, 500)); // the new workers take over
        const head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n";
        const body = "POST /v1/attention/forward HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
          "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{";
        for (const [what, req] of [["a head", head], ["a body", body]]) {
          let last: { r: RawResponse | null; ms: number } | undefined;
          await waitFor(`nginx to time ${what} out`, 15_000, async () => {
            const t0 = performance.now();
            const r = await rawExchange(d.port, req, { closeWrite: false, timeoutMs: 4000 });
            last = { r, ms: performance.now() - t0 };
            return last.ms < 3000;
          });
          assert.equal(last!.r, null, `${what}: no answer, got ${last!.r?.text}`);
          assert.ok(last!.ms > 900, `${what}: after nginx's 1 s: ${last!.ms} ms`);
        }
      });
    } finally {
      await d.stop();
    }
  },
});

/** The client_body_timeout in a rendered config, ms. */
function clientBodyTimeoutMs(conf: string): number {
  const m = /^\s*client_body_timeout (\d+)ms;$/m.exec(conf);
  assert.ok(m, "nginx.conf sets client_body_timeout");
  return Number(m[1]);
}

Deno.test({
  name: "nginx: client_body_timeout follows the instances' --body-timeout-ms; theirs answers first",
  ignore,
  ...resources,
  async fn(t) {
    await t.step(
      "a body timeout that is not a number is refused before anything starts",
      async () => {
        const prefix = await Deno.makeTempDir({ prefix: "attn-proxy-" });
        const { port, base } = freePorts(1);
        const ports = ["--port", String(port), "--base-port", String(base), "--prefix", prefix];
        const out = await new Deno.Command("bash", {
          args: [
            START,
            "--instances",
            "1",
            "--no-gpu",
            ...ports,
            "--",
            "--body-timeout-ms",
            "soon",
          ],
          env: { NGINX: NGINX!, DENO: Deno.execPath() },
          stdout: "piped",
          stderr: "piped",
          signal: AbortSignal.timeout(30_000),
        }).output();
        await Deno.remove(prefix, { recursive: true });
        const stderr = new TextDecoder().decode(out.stderr);
        assert.equal(out.code, 2, stderr);
        assert.match(stderr, /body timeout .* got "soon"/);
      },
    );

    // The flag after `--` over ATTN_BODY_TIMEOUT_MS, the last one over the first (as the
    // instances' parseArgs takes it), leading zeros allowed as the instances allow them: the
    // instances wait 1.5 s for a body's next bytes.
    const maxBody = 4 << 20;
    const d = await deploy(1, [
      "--max-body-bytes",
      String(maxBody),
      "--",
      "--body-timeout-ms",
      "900000",
      "--body-timeout-ms=00000000001500",
    ], { ATTN_BODY_TIMEOUT_MS: "70000" });
    try {
      await t.step("rendered from the instances' setting", async () => {
        // Twice the instances' longest wait (1.5 s, plus 1 s per 256 KiB of the 4 MiB limit for
        // a body read in one piece), plus 5 s.
        assert.equal(clientBodyTimeoutMs(await d.conf()), 2 * (1500 + 16_000) + 5000);
      });

      await t.step("a stalled body gets the instance's 408 problem through nginx", async () => {
        // On a cache's forward route, whose body nginx streams (it reads POST
        // /v1/attention/forward's whole first, to send it again on a 404: there a stalled body
        // meets nginx's own timeout, as in the step above).
        const spec = { num_blocks: 1, block_size: 4, num_kv_heads: 1, head_size: 4 };
        const put = await fetch(`${d.url}/v1/kv-caches/stall`, {
          method: "PUT",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ ...spec, dtype: "float32" }),
        });
        await put.body?.cancel();
        assert.equal(put.status, 201);
        const stall = (type: string, declared: number) =>
          rawExchange(
            d.port,
            "POST /v1/kv-caches/stall/forward HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
              `Content-Type: ${type}\r\nContent-Length: ${declared}\r\n\r\n{`,
            { closeWrite: false, timeoutMs: 20_000 },
          ).then((r) => ({ r, at: performance.now() }));
        const t0 = performance.now();
        // A JSON body is streamed: 408 after 1.5 s without bytes. A safetensors body of 1.5 MiB
        // is read in one piece: 408 when not whole by 1.5 s + 6 s, later than the instances'
        // timeout plus a fixed margin of 5 s (nginx would have closed the connection first).
        const [json, whole] = await Promise.all([
          stall("application/json", 100),
          stall("application/octet-stream", 6 * 256 * 1024),
        ]);
        const a = assertProblem(json.r, 408, "body_timeout", "a stalled JSON body");
        assert.equal(a.body_timeout_ms, 1500);
        assert.equal(a.received_bytes, 1);
        assert.equal(json.r!.headers.get("x-attention-instance"), "i0");
        assert.ok(json.at - t0 < 6000, `the JSON body's 408 after ${json.at - t0} ms`);
        const b = assertProblem(whole.r, 408, "body_timeout", "a stalled safetensors body");
        assert.equal(b.deadline_ms, 7500);
        assert.equal(whole.r!.headers.get("x-attention-instance"), "i0");
        assert.ok(whole.at - t0 > 7000, `the whole-body 408 after ${whole.at - t0} ms`);
      });
    } finally {
      await d.stop();
    }

    await t.step("from ATTN_BODY_TIMEOUT_MS without the flag, and the default limit", async () => {
      const e = await deploy(1, [], { ATTN_BODY_TIMEOUT_MS: "120000" });
      try {
        // 512 MiB read in one piece may take 120 s + 2,048 s.
        assert.equal(clientBodyTimeoutMs(await e.conf()), 2 * (120_000 + 2_048_000) + 5000);
      } finally {
        await e.stop();
      }
    });
  },
});

/** The value of a counter's `line` (name and labels) in Prometheus text, 0 when absent. */
function counter(metrics: string, line: string): number {
  const m = metrics.split("\n").find((l) => l.startsWith(`${line} `));
  return m ? Number(m.slice(line.length + 1)) : 0;
}

Deno.test({
  name: "nginx: /instances/NAME/{healthz,metrics,v1/device} reach that instance; answers name it",
  ignore,
  ...resources,
  async fn() {
    const d = await deploy(2, []);
    try {
      const names = d.instances.map((i) => i.name);
      assert.deepEqual(names, ["i0", "i1"]);
      const get = async (path: string) => {
        const r = await fetch(`${d.url}${path}`);
        return { status: r.status, by: r.headers.get("x-attention-instance"), r };
      };
      for (const name of names) {
        const h = await get(`/instances/${name}/healthz`);
        assert.equal(h.status, 200, `${name}/healthz`);
        assert.equal(h.by, name);
        assert.deepEqual(await h.r.json(), { status: "ok", instance: name });
        const dev = await get(`/instances/${name}/v1/device`);
        assert.equal(dev.status, 200);
        assert.equal(dev.by, name);
        assert.equal((await dev.r.json()).available, false, "--no-gpu");
      }
      // Each /instances/NAME/metrics is NAME's own: 3 health checks sent to i1 count there only.
      const line = 'attn_http_requests_total{route="/healthz",method="GET",status="200"}';
      const scrape = async (name: string) => {
        const m = await get(`/instances/${name}/metrics`);
        assert.equal(m.status, 200);
        assert.equal(m.by, name);
        assert.match(m.r.headers.get("content-type") ?? "", /^text\/plain/);
        return counter(await m.r.text(), line);
      };
      const before = [await scrape("i0"), await scrape("i1")];
      for (let i = 0; i < 3; i++) await (await get("/instances/i1/healthz")).r.body?.cancel();
      assert.deepEqual([await scrape("i0"), await scrape("i1")], [before[0], before[1] + 3]);
      const direct = await fetch(`http://127.0.0.1:${d.instances[1].port}/metrics`);
      assert.equal(counter(await direct.text(), line), before[1] + 3, "the instance agrees");

      // Without the prefix any instance answers, and the answer says which.
      for (const path of ["/healthz", "/metrics", "/healthz", "/metrics"]) {
        const r = await get(path);
        await r.r.body?.cancel();
        assert.equal(r.status, 200);
        assert.ok(r.by !== null && names.includes(r.by), `${path} from ${r.by}`);
      }

      const unknown = await get("/instances/i7/metrics");
      assert.equal(unknown.r.headers.get("content-type"), "application/problem+json");
      const u = await unknown.r.json();
      assert.equal(unknown.status, 404);
      assert.equal(u.code, "unknown_instance");
      assert.equal(u.type, "urn:attn-service:problem:unknown_instance");
      assert.equal(u.instance_name, "i7");
      assert.match(u.detail, /"i7"/);
      assert.deepEqual(u.instances, names);
      for (const path of ["/instances/i0/v1/backends", "/instances/", "/instances/a%22b/healthz"]) {
        const r = await get(path);
        assert.equal(r.status, 404, path);
        assert.equal(r.r.headers.get("content-type"), "application/problem+json", path);
        assert.equal((await r.r.json()).code, "not_found", path);
      }

      // A stopped instance's own routes time out by name (nginx's proxy_read_timeout lowered to
      // 1 s for the test; the instance's process paused, then resumed).
      const conf = (await d.conf()).replace(/proxy_read_timeout \S+;/, "proxy_read_timeout 1s;");
      assert.match(conf, /proxy_read_timeout 1s;/);
      await d.reload(conf);
      await new Promise((r) => setTimeout(r, 500)); // the new workers take over
      const paused = d.instances[0];
      Deno.kill(paused.pid, "SIGSTOP");
      try {
        const slow = await get(`/instances/${paused.name}/healthz`);
        assert.equal(slow.status, 504);
        assert.equal(slow.r.headers.get("content-type"), "application/problem+json");
        const q = await slow.r.json();
        assert.equal(q.code, "instance_timeout");
        assert.equal(q.instance_name, paused.name);
        assert.match(q.detail, new RegExp(`"${paused.name}"`));
      } finally {
        Deno.kill(paused.pid, "SIGCONT");
      }

      // A dead instance's own routes say so by name; the other's keep answering.
      const victim = d.instances[1];
      Deno.kill(victim.pid, "SIGKILL");
      await waitFor(`${victim.name} to exit`, 10_000, () => !alive(victim.pid));
      const dead = await get(`/instances/${victim.name}/healthz`);
      assert.equal(dead.status, 502);
      const p = await dead.r.json();
      assert.equal(p.code, "instance_unavailable");
      assert.equal(p.instance_name, victim.name);
      assert.equal(p.upstream, `127.0.0.1:${victim.port}`);
      const live = await get("/instances/i0/healthz");
      await live.r.body?.cancel();
      assert.deepEqual([live.status, live.by], [200, "i0"]);
    } finally {
      await d.stop();
    }
  },
});
