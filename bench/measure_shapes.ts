/**
 * The bench's measurement loop (bench/main.ts): every registered backend and swept variant on
 * every shape of a case, one bench/measure.ts row each (or a skip saying why), with a log line
 * per row.
 * @module
 */
import { validateConfiguration } from "../backends/capabilities.ts";
import { builtinBackends } from "../backends/index.ts";
import type {
  AttentionBackend,
  BackendContext,
  GpuContext,
  KvCache,
  KvCacheDType,
  ValidBatch,
} from "../core/types.ts";
import { validHostBatch } from "../service/host_input.ts";
import { type BackendRow, measureBackend } from "./measure.ts";
import { breakdownText, f, partsText, xSdpaText } from "./report_text.ts";
import { type Anchor, anchorFor, xSdpa } from "./anchor.ts";
import { benchShapes, makeBatch, shapeName } from "./shapes.ts";
import type { Variant } from "./variants.ts";

/** Every backend and variant on every shape of `kind`: one row each (skips say why). */
export async function measureShapes(
  o: {
    gpu: GpuContext;
    small: boolean;
    iters: number;
    reps: number;
    copyGbps: number;
    fmaTflops: number;
    only: RegExp | null;
    hnd: boolean;
    prefillCaches: KvCacheDType[];
    prefillGroups: number[];
    anchor: Anchor | null;
  },
  variants: Variant[],
  kind: string,
  log: (s: string) => void,
): Promise<BackendRow[]> {
  const { gpu, small, iters, reps } = o;
  const ctx: BackendContext = { gpu };
  const rows: BackendRow[] = [];
  const shapes = benchShapes(small, o.hnd, o.prefillCaches, o.prefillGroups).filter((x) =>
    (kind === "all" || x.kind === kind) && (!o.only || o.only.test(shapeName(x)))
  );
  for (const s of shapes) {
    const name = shapeName(s);
    log(`== ${name}`);
    const data = makeBatch(s);
    const caches = new Map<string, { cache: KvCache; batch: ValidBatch }>();
    const candidates: { label: string; backend: AttentionBackend; unfit?: string | null }[] = [
      ...builtinBackends().map((b) => ({ label: b.name, backend: b })),
      ...variants.filter((v) => v.kind === s.kind || v.also === s.kind).map((v) => ({
        label: v.label,
        backend: v.backend,
        unfit: v.unfit(gpu, s.head_size),
      })),
    ];
    let reference: Float32Array | null = null;
    try {
      for (const c of candidates) {
        const b = c.backend;
        const why = [
          ...validateConfiguration(b, data.selector, ctx),
          ...(c.unfit ? [c.unfit] : []),
        ];
        if (!b.requires.needs_device && !small) why.push("host backend skipped on big shapes");
        if (why.length) {
          rows.push({ case: name, backend: c.label, skipped: why.join("; ") });
          log(`skip ${c.label}: ${why.join("; ")}`);
          continue;
        }
        let held = caches.get(b.cache_storage);
        if (!held) {
          const cache = await b.importCache(data.spec, data.key, data.value, ctx);
          held = { cache, batch: validHostBatch(data.batch, cache) };
          caches.set(b.cache_storage, held);
        }
        const { row, output } = await measureBackend(c.label, name, b, s, {
          gpu,
          batch: held.batch,
          // A 268 MB output takes ~0.7 s to read back in Deno: one awaited call is enough.
          iters: !b.requires.needs_device
            ? 1
            : held.batch.query.bytes.byteLength > 2 ** 26
            ? 1
            : iters,
          reps,
          fmaTflops: o.fmaTflops,
          copyGbps: o.copyGbps,
          reference,
        });
        reference ??= output;
        if (o.anchor) {
          row.sdpa_ms = anchorFor(o.anchor, s)?.ms ?? null;
          row.x_sdpa = xSdpa(row.sdpa_ms, row.device_ms);
          row.x_sdpa_stream = xSdpa(row.sdpa_ms, row.device_breakdown?.one_pass);
        }
        rows.push(row);
        const kern = Object.entries(row.device_kernels ?? {}).map(([k, v]) => `${k} ${f(v)}`);
        log(
          `${c.label}: device ${f(row.device_ms)} ms (${kern.join(", ")}; ${breakdownText(row)}), ${
            s.kind === "mixed"
              ? `decode + prefill ${partsText(row)} ms${
                row.device_parts
                  ? ` (${f(row.kv_gbps)} GB/s = ${f(row.x_copy)} x copy + ` +
                    `${f(row.tflops)} TFLOP/s = ${f(row.x_fma)} x FMA)`
                  : ""
              }`
              : s.kind === "prefill"
              ? `${f(row.tflops)} TFLOP/s = ${f(row.x_fma)} x FMA`
              : `${f(row.kv_gbps)} GB/s = ${f(row.x_copy)} x copy`
          }${
            o.anchor
              ? `, ${xSdpaText(row.x_sdpa)} x SDPA (${f(row.sdpa_ms)} ms; stream ${
                xSdpaText(row.x_sdpa_stream)
              })`
              : ""
          }, e2e ${f(row.e2e_ms)} ms, max diff ${row.max_diff ?? "ref"}; ${
            (row.kernels ?? []).filter((k) => !/^(fill|cache_write)/.test(k)).join(" + ")
          } ${JSON.stringify(row.info ?? {})}${row.paths ? ` [${row.paths}]` : ""}`,
        );
      }
    } finally {
      for (const c of caches.values()) c.cache.destroy();
    }
  }
  return rows;
}
