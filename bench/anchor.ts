/**
 * `deno task bench --anchor FILE` (or BENCH_ANCHOR): PyTorch SDPA's times from
 * bench/torch_anchor.py's JSON (`python3 bench/torch_anchor.py --json FILE` on the GPU machine)
 * beside the bench's device times. `x SDPA` = SDPA's ms / our device ms for the same shape:
 * above 1 ours is faster, below 1 SDPA is.
 *
 * The anchor's JSON: `{"device", "torch", "rows": [{"case", "ms", "shape"?}, ...]}`. A row
 * anchors a bench shape through its `shape` (`kind`, `reqs`, `ctx`, `qlen`, `num_heads`,
 * `num_kv_heads`, `head_size`); rows written before the anchor carried `shape` are read from
 * their case names (`decode sdpa contiguous 32x2048`, `prefill sdpa causal 4x1024`, 32 q / 8 kv
 * heads, head 128: what the anchor measured then). Other rows (the copy, the page gather) anchor
 * nothing. A bench shape matches on those fields and an f16 cache (SDPA reads f16 K/V); our
 * block size and cache layout are ours alone (SDPA reads contiguous K/V), so they do not take
 * part. Mixed shapes have no SDPA anchor.
 * @module
 */
import type { BenchShape } from "./shapes.ts";

/** One SDPA time of the anchor and the shape it ran. */
export interface AnchorEntry {
  /** The anchor's case name. */
  case: string;
  kind: "decode" | "prefill";
  reqs: number;
  ctx: number;
  qlen: number;
  num_heads: number;
  num_kv_heads: number;
  head_size: number;
  /** SDPA's milliseconds per call (CUDA events around a loop). */
  ms: number;
}

/** A parsed anchor file. */
export interface Anchor {
  /** The GPU the anchor ran on (torch.cuda.get_device_name()). */
  device: string;
  /** torch.__version__, where the anchor wrote it. */
  torch?: string;
  entries: AnchorEntry[];
}

/** What the anchor measured before its rows carried `shape`. */
const LEGACY_HEADS = { num_heads: 32, num_kv_heads: 8, head_size: 128 };
const LEGACY = /^(decode) sdpa contiguous (\d+)x(\d+)$|^(prefill) sdpa causal (\d+)x(\d+)$/;

const posInt = (x: unknown): x is number => Number.isInteger(x) && (x as number) > 0;

function entryOf(row: Record<string, unknown>, i: number): AnchorEntry | null {
  const name = typeof row.case === "string" ? row.case : `rows[${i}]`;
  let shape: Omit<AnchorEntry, "case" | "ms">;
  const s = row.shape;
  if (s !== undefined && s !== null) {
    if (typeof s !== "object") throw new Error(`anchor ${name}: shape must be an object`);
    const o = s as Record<string, unknown>;
    const ints = ["reqs", "ctx", "qlen", "num_heads", "num_kv_heads", "head_size"] as const;
    const bad = ints.filter((k) => !posInt(o[k]));
    if ((o.kind !== "decode" && o.kind !== "prefill") || bad.length) {
      throw new Error(
        `anchor ${name}: shape needs kind decode|prefill and positive integers ${ints.join(", ")}` +
          (bad.length ? ` (bad: ${bad.join(", ")})` : ` (kind ${JSON.stringify(o.kind)})`),
      );
    }
    shape = {
      kind: o.kind,
      reqs: o.reqs as number,
      ctx: o.ctx as number,
      qlen: o.qlen as number,
      num_heads: o.num_heads as number,
      num_kv_heads: o.num_kv_heads as number,
      head_size: o.head_size as number,
    };
  } else {
    const m = typeof row.case === "string" ? LEGACY.exec(row.case) : null;
    if (!m) return null;
    const decode = m[1] !== undefined;
    const reqs = Number(decode ? m[2] : m[5]), ctx = Number(decode ? m[3] : m[6]);
    shape = {
      kind: decode ? "decode" : "prefill",
      reqs,
      ctx,
      qlen: decode ? 1 : ctx,
      ...LEGACY_HEADS,
    };
  }
  if (typeof row.ms !== "number" || !(row.ms > 0) || !Number.isFinite(row.ms)) {
    throw new Error(`anchor ${name}: ms must be a positive number, got ${JSON.stringify(row.ms)}`);
  }
  return { case: name, ...shape, ms: row.ms };
}

/**
 * The anchor in `text` (bench/torch_anchor.py's JSON). Throws on text that is not such a
 * document, or on an SDPA row without a positive `ms` or with a malformed `shape`.
 */
export function parseAnchor(text: string): Anchor {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new Error(`anchor: not JSON (${e instanceof Error ? e.message : e})`);
  }
  if (typeof doc !== "object" || doc === null || !Array.isArray((doc as { rows?: unknown }).rows)) {
    throw new Error('anchor: expected {"device": ..., "rows": [...]} from bench/torch_anchor.py');
  }
  const d = doc as { device?: unknown; torch?: unknown; rows: unknown[] };
  const entries: AnchorEntry[] = [];
  d.rows.forEach((r, i) => {
    if (typeof r !== "object" || r === null) throw new Error(`anchor: rows[${i}] is not an object`);
    const e = entryOf(r as Record<string, unknown>, i);
    if (e) entries.push(e);
  });
  return {
    device: typeof d.device === "string" ? d.device : "(unknown device)",
    ...(typeof d.torch === "string" ? { torch: d.torch } : {}),
    entries,
  };
}

/** The anchor's entry for bench shape `s`, or null where it measured no such shape. */
export function anchorFor(a: Anchor, s: BenchShape): AnchorEntry | null {
  if (s.kind === "mixed" || s.kv_cache_dtype !== "auto") return null;
  return a.entries.find((e) =>
    e.kind === s.kind && e.reqs === s.reqs && e.ctx === s.ctx && e.qlen === s.qlen &&
    e.num_heads === s.num_heads && e.num_kv_heads === s.num_kv_heads &&
    e.head_size === s.head_size
  ) ?? null;
}

/** SDPA's ms / our device ms (above 1: ours faster); null where either is missing. */
export function xSdpa(
  sdpaMs: number | null | undefined,
  deviceMs: number | undefined,
): number | null {
  if (sdpaMs == null || deviceMs === undefined || !(deviceMs > 0) || !(sdpaMs > 0)) return null;
  return sdpaMs / deviceMs;
}

/** The legend line for the table's `x SDPA` column. */
export function anchorLegend(a: Anchor, file: string): string {
  return `x SDPA = PyTorch SDPA ms / our device ms (${a.device}${
    a.torch ? `, torch ${a.torch}` : ""
  }, ${file}; ${a.entries.length} SDPA shapes): above 1 ours is faster, below 1 SDPA is; ` +
    "- where the anchor has no such shape; stream = SDPA ms / our repetitions timed as one pass " +
    "(SDPA's own way: no per-pass start and drain)";
}

/** Reads and parses the anchor file `path`, naming the file in any error. */
export async function loadAnchor(path: string): Promise<Anchor> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    throw new Error(`--anchor ${path}: ${e instanceof Error ? e.message : e}`);
  }
  try {
    return parseAnchor(text);
  } catch (e) {
    throw new Error(`--anchor ${path}: ${e instanceof Error ? e.message : e}`);
  }
}
