/**
 * One HTTP bench run against one server (at `url`), or against several instances of it (each
 * its own process and device, as behind the nginx front of deploy/: client c's caches and
 * calls all go to instance c mod N, the way `X-Attention-Instance` pins a cache to its
 * instance), like a model runner: read `/v1/device` of the first (software adapter → small
 * shapes unless told otherwise), create one server-held f16 cache per client and layer, fill
 * them by prefill calls (cache 0's calls one at a time and timed alone; the same call on the
 * other caches sent together), then timed decode steps: client 0 alone (sequential: p50/p99),
 * then every client at once from its own worker on its own caches (calls/s). Every answer is
 * checked after the clock stops (bench/http_checks.ts).
 *
 * The parts live beside it: the options and report types (bench/http_run_types.ts, re-exported
 * here), the prefill phase (bench/http_run_prefill.ts) and the decode phase
 * (bench/http_run_decode.ts).
 * @module
 */
import { AttentionClient } from "../client/client.ts";
import type { DeviceReport } from "../core/types.ts";
import { tally } from "./http_checks.ts";
import { Reference } from "./http_reference.ts";
import { BIG_SHAPE, cacheBytes, type HttpShape, layoutOf, SMALL_SHAPE } from "./http_workload.ts";
import type { RunOptions, RunReport } from "./http_run_types.ts";
import { prefill } from "./http_run_prefill.ts";
import { decode } from "./http_run_decode.ts";

export type { RunOptions, RunReport };

const SOFTWARE = /llvmpipe|lavapipe|swiftshader|softpipe/i;

/** Is this report's adapter a software one (or is there no device)? */
export function isSoftware(d: DeviceReport): boolean {
  return !d.available || d.adapter?.is_fallback_adapter === true ||
    SOFTWARE.test(`${d.adapter?.description ?? ""} ${d.adapter?.device ?? ""}`);
}

/** Checks a shape's fields; throws naming the bad one. */
export function checkShape(s: HttpShape): void {
  for (const [k, v] of Object.entries(s)) {
    if (!Number.isSafeInteger(v) || v < 1) {
      throw new Error(`${k} must be a positive integer, got ${v}`);
    }
  }
  if (s.num_heads % s.num_kv_heads) {
    throw new Error(`num_heads ${s.num_heads} is not a multiple of num_kv_heads ${s.num_kv_heads}`);
  }
}

/**
 * Runs the bench against the server at `url`, or against the instances at `url[0..N-1]` (client
 * c's caches and calls on instance c mod N).
 */
export async function runOnServer(url: string | string[], o: RunOptions): Promise<RunReport> {
  const urls = typeof url === "string" ? [url] : url;
  if (urls.length === 0) throw new Error("runOnServer: no server URL");
  const apis = urls.map((u) => new AttentionClient(u, { headers: o.headers }));
  const api = apis[0];
  const device = await api.device();
  const software = isSoftware(device);
  const small = o.size === "small" || (o.size === "auto" && software);
  const shape = { ...(small ? SMALL_SHAPE : BIG_SHAPE), ...o.shape };
  checkShape(shape);
  const report: RunReport = {
    url: urls[0],
    urls,
    client: o.client ?? "raw",
    device,
    software,
    small,
    shape,
    backends: {},
    checks: { prefill: tally(), decode: tally() },
    errors: [],
    ok: false,
  };
  const layout = layoutOf(shape, o.seed);
  const ids: string[] = [];
  /** Cache c's instance: its client's. */
  const instance = (cache: number) => Math.floor(cache / shape.layers) % urls.length;
  try {
    for (let c = 0; c < shape.clients * shape.layers; c++) {
      const info = await apis[instance(c)].createCache({
        num_blocks: layout.num_blocks,
        block_size: shape.block_size,
        num_kv_heads: shape.num_kv_heads,
        head_size: shape.head_size,
        dtype: "float16",
        kv_cache_dtype: "auto",
      });
      ids.push(info.id);
      report.cache = { ...pick(info), count: ids.length };
    }
    o.log(
      `caches: ${ids.length} x ${(cacheBytes(shape, layout) / 2 ** 20).toFixed(1)} MiB ` +
        `(${report.cache?.backend}, ${report.cache?.storage})`,
    );
    const ref = new Reference(shape, o.seed);
    const urlOf = (cache: number) => urls[instance(cache)];
    await prefill(urlOf, o, report, ref, layout, ids);
    if (report.errors.length === 0) await decode(urlOf, o, report, ref, layout, ids);
  } catch (e) {
    report.errors.push(e instanceof Error ? e.message : String(e));
  } finally {
    for (const [c, id] of ids.entries()) await apis[instance(c)].deleteCache(id).catch(() => {});
  }
  const kw = (await api.device().catch(() => null))?.keep_warm;
  if (kw) report.keep_warm = kw;
  const c = report.checks;
  report.ok = report.errors.length === 0 && c.prefill.failed_calls + c.decode.failed_calls === 0 &&
    c.prefill.calls + c.decode.calls > 0;
  return report;
}

const pick = (i: { backend: string; storage: string; bytes: number }) => ({
  backend: i.backend,
  storage: i.storage,
  bytes: i.bytes,
});
