/**
 * Access control: the startup policy (a non-loopback bind needs a token or an explicit
 * --allow-unauthenticated), bearer tokens on every route but /healthz (401 problem with
 * WWW-Authenticate), and the Host check of a loopback bind without a token (403 problem), over
 * real ports and with real server processes.
 */
import assert from "node:assert/strict";
import { AccessConfigError, isLoopbackAddress, resolveAccess } from "../../server/access_config.ts";
import { bearerToken, hostName, LOOPBACK_HOST_NAMES } from "../../server/auth.ts";
import { startServer } from "./helpers.ts";
import { runServerToExit, spawnServer } from "./process.ts";
import { rawExchange, rawRequest, type RawResponse } from "./raw_http.ts";

const noEnv = () => undefined;

function assertProblem(r: RawResponse | null, status: number, code: string) {
  assert.ok(r, "an answer");
  assert.equal(r.status, status, r.text);
  assert.equal(r.headers.get("content-type"), "application/problem+json");
  const doc = JSON.parse(r.text);
  assert.equal(doc.status, status);
  assert.equal(doc.code, code);
  for (const k of ["type", "title", "detail"]) assert.equal(typeof doc[k], "string");
  return doc;
}

Deno.test("access policy: loopback, tokens, refusal of an exposed bind", async () => {
  for (const h of ["127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]", "LOCALHOST"]) {
    assert.ok(isLoopbackAddress(h), h);
  }
  for (const h of ["0.0.0.0", "::", "10.0.0.1", "example.com", "127.0.0.256", "128.0.0.1"]) {
    assert.ok(!isLoopbackAddress(h), h);
  }
  const base = { allowUnauthenticated: false, allowedHosts: [] };
  assert.deepEqual(resolveAccess({ ...base, host: "127.0.0.1" }, noEnv).policy, {
    allowedHosts: [...LOOPBACK_HOST_NAMES],
  });
  assert.deepEqual(
    resolveAccess({ ...base, host: "127.0.0.1", allowedHosts: ["My.Host"] }, noEnv).policy
      .allowedHosts,
    [...LOOPBACK_HOST_NAMES, "my.host"],
  );
  assert.throws(
    () => resolveAccess({ ...base, host: "0.0.0.0" }, noEnv),
    (e) => e instanceof AccessConfigError && /refusing to serve on 0\.0\.0\.0/.test(e.message),
  );
  const open = resolveAccess({ ...base, host: "0.0.0.0", allowUnauthenticated: true }, noEnv);
  assert.deepEqual(open.policy, {});
  assert.match(open.warning!, /WARNING: serving on 0\.0\.0\.0 with no authentication/);
  const env = resolveAccess({ ...base, host: "0.0.0.0" }, (n) => n === "ATTN_TOKEN" ? "s3" : "");
  assert.deepEqual(env.policy, { token: "s3" });
  const file = await Deno.makeTempFile();
  try {
    await Deno.writeTextFile(file, "from-file\n");
    const f = resolveAccess({ ...base, host: "127.0.0.1", tokenFile: file }, () => "env");
    assert.deepEqual(
      f.policy,
      { token: "from-file" },
      "the file wins; a token drops the Host check",
    );
    await Deno.writeTextFile(file, "  \n");
    assert.throws(() => resolveAccess({ ...base, host: "::", tokenFile: file }, noEnv), /is empty/);
  } finally {
    await Deno.remove(file);
  }
  assert.throws(
    () => resolveAccess({ ...base, host: "::", tokenFile: "/nonexistent/t" }, noEnv),
    /cannot read it/,
  );
  assert.equal(bearerToken("Bearer abc"), "abc");
  assert.equal(bearerToken("bearer   abc  "), "abc");
  assert.equal(bearerToken("Basic abc"), null);
  assert.equal(bearerToken("Bearer a b"), null);
  assert.equal(hostName("LocalHost:8000"), "localhost");
  assert.equal(hostName("[::1]:99"), "[::1]");
  assert.equal(hostName("127.0.0.1"), "127.0.0.1");
  assert.equal(hostName("evil.example."), "evil.example");
  assert.equal(hostName("a:b"), null);
  assert.equal(hostName("[::1]x"), null);
});

Deno.test("access policy: a loopback bind answers to its own address too", () => {
  const base = { allowUnauthenticated: false, allowedHosts: [] };
  const hosts = (host: string) => resolveAccess({ ...base, host }, noEnv).policy.allowedHosts;
  assert.deepEqual(hosts("127.0.0.2"), [...LOOPBACK_HOST_NAMES, "127.0.0.2"]);
  assert.deepEqual(hosts("0:0:0:0:0:0:0:1"), [...LOOPBACK_HOST_NAMES, "[0:0:0:0:0:0:0:1]"]);
  for (const same of ["127.0.0.1", "localhost", "LocalHost", "::1", "[::1]"]) {
    assert.deepEqual(hosts(same), [...LOOPBACK_HOST_NAMES], same);
  }
});

Deno.test("token: every route but /healthz needs it; 401 problems with WWW-Authenticate", async () => {
  const token = "t0k3n-" + crypto.randomUUID();
  const srv = await startServer({
    access: { token },
    clientHeaders: { authorization: `Bearer ${token}` },
  });
  try {
    const get = (path: string, headers: Record<string, string> = {}, method = "GET") =>
      rawExchange(srv.port, rawRequest(method, path, headers));
    assert.equal((await get("/healthz"))?.status, 200, "/healthz stays open");
    // Paths `new URL` would turn into /healthz are not open: the router takes them as sent (the
    // check took the resolved path and let these through to a 400 or 404 without a token).
    for (
      const path of [
        "/v1/kv-caches/..\\..\\healthz",
        "/v1/kv-caches/x/..\\..\\..\\healthz",
        "/metrics/..\\healthz",
        "/v1/nope/../../healthz",
      ]
    ) {
      const r = await get(path);
      assert.equal(r?.status, 401, `${path}: ${r?.text}`);
    }
    const routes = [
      ["GET", "/v1/device"],
      ["GET", "/v1/backends"],
      ["GET", "/metrics"],
      ["GET", "/openapi.json"],
      ["GET", "/v1/kv-caches/x"],
      ["GET", "/v1/kv-caches/x/data"],
      ["DELETE", "/v1/kv-caches/x"],
      ["POST", "/v1/kv-caches"],
      ["POST", "/v1/attention/forward"],
      ["POST", "/v1/backends/select"],
      ["GET", "/no/such/route"], // no route discovery without the token either
    ];
    for (const [method, path] of routes) {
      const missing = assertProblem(await get(path, {}, method), 401, "unauthorized");
      assert.match(missing.detail, /needs a bearer token/);
      const r = await get(path, { authorization: "Bearer wrong" }, method);
      assertProblem(r, 401, "unauthorized");
      assert.equal(
        r!.headers.get("www-authenticate"),
        'Bearer realm="attn-service", error="invalid_token"',
      );
      const prefix = await get(path, { authorization: `Bearer ${token.slice(0, -1)}` }, method);
      assertProblem(prefix, 401, "unauthorized");
      const longer = await get(path, { authorization: `Bearer ${token}x` }, method);
      assertProblem(longer, 401, "unauthorized");
    }
    const r = await get("/v1/device");
    assert.equal(r!.headers.get("www-authenticate"), 'Bearer realm="attn-service"');
    assertProblem(
      await get("/v1/device", { authorization: `Basic ${token}` }),
      401,
      "unauthorized",
    );
    // With the token: served (the typed client sends it).
    const c = await srv.client.createCache({
      num_blocks: 1,
      block_size: 4,
      num_kv_heads: 1,
      head_size: 8,
      dtype: "float32",
    });
    assert.equal((await srv.client.getCache(c.id)).id, c.id);
    const ok = await get("/metrics", { authorization: `bearer ${token}` });
    assert.equal(ok?.status, 200);
    assert.match(ok!.text, /status="401"/, "refusals are counted");
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("Host check (loopback, no token): foreign names get 403; loopback names pass", async () => {
  const srv = await startServer({
    access: { allowedHosts: [...LOOPBACK_HOST_NAMES, "box.internal"] },
  });
  try {
    const get = (path: string, host: string) =>
      rawExchange(srv.port, rawRequest("GET", path, { host }));
    for (
      const host of ["evil.example", "evil.example:80", "127.0.0.2", "[::2]:1", "localhost.evil"]
    ) {
      const doc = assertProblem(await get("/v1/backends", host), 403, "host_not_allowed");
      assert.equal(doc.host, host);
      assert.match(doc.detail, /--allowed-host/);
    }
    for (
      const host of ["localhost", "LOCALHOST:8000", "127.0.0.1:1", "[::1]:8000", "box.internal"]
    ) {
      assert.equal((await get("/v1/backends", host))?.status, 200, host);
    }
    assert.equal((await get("/healthz", "evil.example"))?.status, 200, "/healthz stays open");
    // No Host at all (HTTP/1.0 tools; browsers always send one) is not a rebinding attempt.
    const noHost = await rawExchange(srv.port, "GET /v1/backends HTTP/1.0\r\n\r\n");
    assert.equal(noHost?.status, 200);
    // An absolute-form target names the host the request is for (RFC 9112 3.2.2), and the
    // service's URL is built from it: it was let through with an allowed Host beside it.
    const absolute: [string, string][] = [
      ["http://evil.example:99", "HTTP/1.1\r\nhost: localhost"],
      ["http://evil.example", "HTTP/1.1\r\nhost: 127.0.0.1:8000"],
    ];
    for (const [target, rest] of absolute) {
      const head = `GET ${target}/v1/backends ${rest}\r\n\r\n`;
      const doc = assertProblem(await rawExchange(srv.port, head), 403, "host_not_allowed");
      assert.equal(doc.host, target.slice("http://".length));
      assert.match(doc.detail, /request target's authority/);
    }
    // Without a Host the request passes (not a browser's), whatever its target says.
    const bare = await rawExchange(
      srv.port,
      "GET http://evil.example/v1/backends HTTP/1.0\r\n\r\n",
    );
    assert.equal(bare?.status, 200);
    for (const target of ["http://localhost:1", "http://box.internal", "http://[::1]"]) {
      const r = await rawExchange(
        srv.port,
        `GET ${target}/v1/backends HTTP/1.1\r\nhost: localhost\r\n\r\n`,
      );
      assert.equal(r?.status, 200, target);
    }
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("Host check: a policy without localhost still passes requests without a Host", async () => {
  // The engines build a no-Host request's URL on "localhost"; the target check must not refuse
  // that name when the policy (a library user's) lists others only.
  const srv = await startServer({ access: { allowedHosts: ["box.internal"] } });
  try {
    const noHost = await rawExchange(srv.port, "GET /v1/backends HTTP/1.0\r\n\r\n");
    assert.equal(noHost?.status, 200);
    const named = await rawExchange(
      srv.port,
      rawRequest("GET", "/v1/backends", { host: "box.internal:9" }),
    );
    assert.equal(named?.status, 200);
    const aimed = await rawExchange(
      srv.port,
      "GET http://evil.example/v1/backends HTTP/1.1\r\nhost: box.internal\r\n\r\n",
    );
    assert.equal(assertProblem(aimed, 403, "host_not_allowed").host, "evil.example");
    const local = await rawExchange(
      srv.port,
      rawRequest("GET", "/v1/backends", { host: "localhost" }),
    );
    assertProblem(local, 403, "host_not_allowed");
  } finally {
    await srv.close();
  }
});

Deno.test("Host check: a Host the URL normalises is not read as another target", async () => {
  // new URL writes [2001:db8:0:0:0:0:0:1] as [2001:db8::1] and drops :80; a review found the
  // target check refusing such a Host, comparing the two spellings.
  const srv = await startServer({
    access: { allowedHosts: ["[2001:db8:0:0:0:0:0:1]", "box.internal"] },
  });
  try {
    for (const host of ["[2001:db8:0:0:0:0:0:1]", "[2001:db8:0:0:0:0:0:1]:80", "BOX.internal:80"]) {
      const r = await rawExchange(srv.port, rawRequest("GET", "/v1/backends", { host }));
      assert.equal(r?.status, 200, host);
    }
  } finally {
    await srv.close();
  }
});

Deno.test("a Host header no URL can be built from: 400 bad_request naming it, counted", async () => {
  const srv = await startServer({});
  try {
    for (const host of ["[", "a b", "localhost:99999"]) {
      for (const path of ["/healthz", "/metrics", "/v1/attention/forward"]) {
        const doc = assertProblem(
          await rawExchange(srv.port, rawRequest("GET", path, { host })),
          400,
          "bad_request",
        );
        assert.equal(doc.host, host, path);
        assert.ok(doc.detail.includes(JSON.stringify(host)), doc.detail);
      }
    }
    const m = await (await fetch(`${srv.url}/metrics`)).text();
    assert.match(
      m,
      /attn_http_requests_total\{[^}]*route="unmatched"[^}]*status="400"[^}]*\} 9/,
      m,
    );
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("main: an exposed bind without a token is refused (exit 2) unless allowed explicitly", async () => {
  const refused = await runServerToExit(["--host", "0.0.0.0", "--port", "0", "--no-gpu"], {
    ATTN_TOKEN: "",
  });
  assert.equal(refused.code, 2, refused.stderr);
  assert.match(refused.stderr, /refusing to serve on 0\.0\.0\.0 without a token/);
  assert.match(refused.stderr, /--token-file/);

  const open = await spawnServer(["--host", "0.0.0.0", "--no-gpu", "--allow-unauthenticated"], {
    ATTN_TOKEN: "",
  });
  try {
    assert.match(open.stderr(), /WARNING: serving on 0\.0\.0\.0 with no authentication/);
    const r = await fetch(`${open.url}/v1/backends`);
    assert.equal(r.status, 200);
    await r.body?.cancel();
  } finally {
    open.kill("SIGTERM");
    await open.exited;
  }

  const file = await Deno.makeTempFile();
  await Deno.writeTextFile(file, "file-token\n");
  const locked = await spawnServer(["--host", "0.0.0.0", "--no-gpu", "--token-file", file]);
  try {
    assert.match(locked.stderr(), /auth: bearer token \(from token-file\)/);
    const no = await fetch(`${locked.url}/v1/backends`);
    assert.equal(no.status, 401);
    assert.equal(no.headers.get("www-authenticate"), 'Bearer realm="attn-service"');
    await no.body?.cancel();
    const yes = await fetch(`${locked.url}/v1/backends`, {
      headers: { authorization: "Bearer file-token" },
    });
    assert.equal(yes.status, 200);
    await yes.body?.cancel();
    const health = await fetch(`${locked.url}/healthz`);
    assert.equal(health.status, 200);
    await health.body?.cancel();
  } finally {
    locked.kill("SIGTERM");
    await locked.exited;
    await Deno.remove(file);
  }

  // A token from the environment applies on loopback too.
  const env = await spawnServer(["--no-gpu"], { ATTN_TOKEN: "env-token" });
  try {
    const no = await fetch(`${env.url}/v1/device`);
    assert.equal(no.status, 401);
    await no.body?.cancel();
    const yes = await fetch(`${env.url}/v1/device`, {
      headers: { authorization: "Bearer env-token" },
    });
    assert.equal(yes.status, 200);
    await yes.body?.cancel();
  } finally {
    env.kill("SIGTERM");
    await env.exited;
  }
});

Deno.test("OpenAPI documents the access answers: 401/403 everywhere but /healthz", async () => {
  const srv = await startServer();
  try {
    const doc = await (await fetch(`${srv.url}/openapi.json`)).json();
    assert.deepEqual(doc.components.securitySchemes.bearerAuth, { type: "http", scheme: "bearer" });
    type Op = { responses: Record<string, unknown>; security?: unknown[] };
    for (const [path, ops] of Object.entries(doc.paths as Record<string, Record<string, Op>>)) {
      for (const op of Object.values(ops)) {
        const codes = Object.keys(op.responses);
        if (path === "/healthz") assert.deepEqual(op.security, [], path);
        else assert.ok(codes.includes("401") && codes.includes("403"), `${path}: ${codes}`);
      }
    }
  } finally {
    await srv.close();
  }
});
