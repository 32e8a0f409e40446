/**
 * deploy/start.sh applies the server's access rule to nginx's address: a `--host` that is not
 * loopback needs a token for the instances (ATTN_TOKEN, or `-- --token-file PATH`) or
 * `--allow-unauthenticated` (with a warning). It used to serve 0.0.0.0 with no token and no
 * warning, and since nginx passes the client's Host to loopback instances, a remote client
 * sending `Host: localhost` could PUT and DELETE caches. With a token the instances ask for it
 * whatever the Host (end to end through nginx, where nginx is installed). A flag without its
 * value is one line, not bash's `$2: unbound variable`.
 */
import assert from "node:assert/strict";
import { rawExchange, rawRequest } from "../server/raw_http.ts";
import { findNginx } from "./nginx_path.ts";

const START = new URL("../../deploy/start.sh", import.meta.url).pathname;

const NGINX = findNginx();

/** Runs start.sh to its end (for the refusals: none of them starts anything). */
async function startToExit(args: string[], env: Record<string, string>) {
  const out = await new Deno.Command("bash", {
    args: [START, ...args],
    env: { ATTN_TOKEN: "", DENO: Deno.execPath(), ...env },
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(30_000),
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

Deno.test("deploy/start.sh: a flag without its value is a one-line error (exit 2)", async () => {
  for (const flag of ["--instances", "--port", "--host", "--base-port", "--prefix"]) {
    const r = await startToExit([flag], {});
    assert.equal(r.code, 2, `${flag}: ${r.stderr}`);
    assert.equal(r.stderr, `start.sh: ${flag} needs a value (--help lists them)\n`, flag);
  }
});

Deno.test("deploy/start.sh: a flag it sets on each instance is refused after -- (exit 2)", async () => {
  // Given after `--` it won on the instances while nginx kept start.sh's: a 3000-byte body got
  // nginx's 413 under start.sh's 1000 though the instances took 5000 (a deploy audit).
  for (
    const flags of [
      ["--max-body-bytes", "5000"],
      ["--max-body-bytes=5000"],
      ["--port", "9999"],
      ["--host", "0.0.0.0"],
      ["--instance-name", "x"],
    ]
  ) {
    const r = await startToExit(["--instances", "1", "--no-gpu", "--", ...flags], {});
    assert.equal(r.code, 2, `${flags}: ${r.stderr}`);
    const name = flags[0].split("=")[0];
    assert.match(
      r.stderr,
      new RegExp(`^start.sh: ${name} after -- is start.sh's to set`),
      r.stderr,
    );
  }
});

Deno.test("deploy/start.sh: a non-loopback --host needs a token or --allow-unauthenticated", async () => {
  const prefix = await Deno.makeTempDir({ prefix: "attn-start-access-" });
  const base = ["--instances", "1", "--no-gpu", "--port", "1", "--prefix", prefix];
  try {
    for (const host of ["0.0.0.0", "::", "10.1.2.3"]) {
      const r = await startToExit([...base, "--host", host], { NGINX: "/nonexistent" });
      assert.equal(r.code, 2, r.stderr);
      assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
      assert.match(
        r.stderr,
        new RegExp(`refusing to serve on --host ${host.replaceAll(".", "\\.")} `),
      );
      assert.match(r.stderr, /ATTN_TOKEN.*--token-file.*--allow-unauthenticated/);
      await assert.rejects(Deno.stat(`${prefix}/i0.log`), "no instance was started");
    }
    // Past the check (then stopped by the missing nginx, exit 3): loopback, a token from the
    // environment or a token file for the instances, or the explicit opt-in (with a warning).
    const tokenFile = `${prefix}/token`;
    await Deno.writeTextFile(tokenFile, "t0ken\n");
    const passing: [string[], Record<string, string>, RegExp | null][] = [
      [["--host", "127.0.0.2"], {}, null],
      [["--host", "localhost"], {}, null],
      [["--host", "0.0.0.0"], { ATTN_TOKEN: "t0ken" }, null],
      [["--host", "0.0.0.0", "--", "--token-file", tokenFile], {}, null],
      [["--host", "0.0.0.0", "--", `--token-file=${tokenFile}`], {}, null],
      [["--host", "0.0.0.0", "--allow-unauthenticated"], {}, /WARNING: nginx on 0\.0\.0\.0/],
    ];
    for (const [args, env, warning] of passing) {
      const r = await startToExit([...base, ...args], { NGINX: "/nonexistent", ...env });
      assert.equal(r.code, 3, `${args.join(" ")}: ${r.stderr}`);
      assert.match(r.stderr, /nginx not found/);
      if (warning) assert.match(r.stderr, warning);
      else assert.doesNotMatch(r.stderr, /WARNING/);
    }
  } finally {
    await Deno.remove(prefix, { recursive: true });
  }
});

Deno.test({
  name: "deploy/start.sh: with a token, a forged Host through nginx still needs it",
  ignore: NGINX === null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const prefix = await Deno.makeTempDir({ prefix: "attn-start-token-" });
    const port = freePort(), base = freePort();
    const script = new Deno.Command("bash", {
      args: [
        START,
        ...["--instances", "1", "--no-gpu", "--host", "0.0.0.0", "--port", String(port)],
        ...["--base-port", String(base), "--prefix", prefix],
      ],
      env: { NGINX: NGINX!, DENO: Deno.execPath(), ATTN_TOKEN: "s3cret" },
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const logs = Promise.all([script.stdout, script.stderr].map((s) => new Response(s).text()));
    try {
      const end = Date.now() + 60_000;
      for (;;) {
        if (await Deno.stat(`${prefix}/ready`).then(() => true, () => false)) break;
        const done = await Promise.race([script.status, Promise.resolve(null)]);
        if (done) throw new Error(`start.sh exited ${done.code}: ${(await logs).join("\n")}`);
        if (Date.now() > end) throw new Error("start.sh did not get ready");
        await new Promise((r) => setTimeout(r, 100));
      }
      const spec = JSON.stringify({
        num_blocks: 1,
        block_size: 16,
        num_kv_heads: 1,
        head_size: 4,
        dtype: "float32",
      });
      const send = (method: string, auth?: string) => {
        const headers: Record<string, string> = {
          host: "localhost",
          "content-type": "application/json",
          "content-length": String(method === "PUT" ? spec.length : 0),
          connection: "close",
          ...(auth ? { authorization: auth } : {}),
        };
        return rawExchange(
          port,
          rawRequest(method, "/v1/kv-caches/forged", headers, method === "PUT" ? spec : ""),
        );
      };
      for (const method of ["PUT", "DELETE", "GET"]) {
        const r = await send(method);
        assert.equal(r?.status, 401, `${method} with Host: localhost and no token`);
      }
      assert.equal((await send("PUT", "Bearer s3cret"))?.status, 201);
      assert.equal((await send("DELETE", "Bearer s3cret"))?.status, 204);
    } finally {
      script.kill("SIGTERM");
      await script.status;
      await logs;
      await Deno.remove(prefix, { recursive: true }).catch(() => {});
    }
  },
});
