/**
 * The deploy/ tests' harness: deploy/start.sh with `--no-gpu` instances and nginx on free
 * loopback ports under a temporary prefix ({@link deploy}), and a check of a problem document.
 * @module
 */
import assert from "node:assert/strict";
import type { RawResponse } from "../server/raw_http.ts";
import {
  alive,
  findNginx,
  freePorts,
  readInstances,
  type StartedInstance,
  waitFor,
  waitForStart,
} from "./nginx_path.ts";

const START = new URL("../../deploy/start.sh", import.meta.url).pathname;

/** The nginx binary (tests skip without one). */
export const NGINX = findNginx();

/** A deployment {@link deploy} started. */
export interface Deployment {
  prefix: string;
  port: number;
  url: string;
  instances: StartedInstance[];
  /** The rendered PREFIX/nginx.conf. */
  conf(): Promise<string>;
  /** `nginx -s reload` (asserted to succeed), with `conf` written as PREFIX/nginx.conf first. */
  reload(conf?: string): Promise<void>;
  /** Stops start.sh (SIGTERM; its trap stops the rest) and waits; start.sh's exit status. */
  stop(): Promise<Deno.CommandStatus>;
}

/** deploy/start.sh with `args` (ports and prefix added), once PREFIX/ready is there. */
export async function deploy(
  instances: number,
  args: string[],
  env: Record<string, string> = {},
): Promise<Deployment> {
  const prefix = await Deno.makeTempDir({ prefix: "attn-proxy-" });
  const { port, base } = freePorts(instances);
  const [own, server] = args.includes("--") ? split(args) : [args, []];
  const script = new Deno.Command("bash", {
    args: [
      START,
      "--instances",
      String(instances),
      "--no-gpu",
      "--port",
      String(port),
      "--base-port",
      String(base),
      "--prefix",
      prefix,
      ...own,
      ...(server.length ? ["--", ...server] : []),
    ],
    env: { NGINX: NGINX!, DENO: Deno.execPath(), ATTN_BODY_TIMEOUT_MS: "", ...env },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const logs = Promise.all([script.stdout, script.stderr].map((s) => new Response(s).text()));
  let pids: number[] = [];
  const stop = async () => {
    try {
      script.kill("SIGTERM");
    } catch { /* exited */ }
    const status = await script.status;
    await logs;
    const nginx = Number((await Deno.readTextFile(`${prefix}/nginx.pid`).catch(() => "")).trim());
    for (const pid of [...pids, ...(nginx > 0 ? [nginx] : [])]) {
      await waitFor(`process ${pid} to stop`, 15_000, () => !alive(pid)).catch(() => {
        Deno.kill(pid, "SIGKILL");
      });
    }
    await Deno.remove(prefix, { recursive: true }).catch(() => {});
    return status;
  };
  try {
    await waitForStart(prefix, script, logs);
    const list = await readInstances(prefix);
    pids = list.map((i) => i.pid);
    return {
      prefix,
      port,
      url: `http://127.0.0.1:${port}`,
      instances: list,
      conf: () => Deno.readTextFile(`${prefix}/nginx.conf`),
      reload: async (conf?: string) => {
        const file = `${prefix}/nginx.conf`;
        if (conf !== undefined) await Deno.writeTextFile(file, conf);
        const r = await new Deno.Command(NGINX!, {
          args: ["-s", "reload", "-p", prefix, "-c", file, "-e", `${prefix}/error.log`],
        }).output();
        assert.equal(r.code, 0, new TextDecoder().decode(r.stderr));
      },
      stop,
    };
  } catch (e) {
    await stop();
    throw e;
  }
}

function split(args: string[]): [string[], string[]] {
  const i = args.indexOf("--");
  return [args.slice(0, i), args.slice(i + 1)];
}

/** `r` is a problem document of `status` and `code` (RFC 9457, as server/problem.ts makes). */
export function assertProblem(r: RawResponse | null, status: number, code: string, what: string) {
  assert.ok(r, `${what}: no answer`);
  assert.equal(r.status, status, `${what}: ${r.text}`);
  assert.equal(r.headers.get("content-type"), "application/problem+json", `${what}: ${r.text}`);
  const doc = JSON.parse(r.text);
  assert.equal(doc.type, `urn:attn-service:problem:${code}`, what);
  assert.equal(doc.status, status, what);
  assert.equal(doc.code, code, what);
  assert.equal(typeof doc.title, "string", what);
  assert.ok(typeof doc.detail === "string" && doc.detail.length > 0, what);
  return doc;
}
