/**
 * `deno run --allow-read bench/cpuprofile_summary.ts FILE.cpuprofile [--top N]`: where a V8 CPU
 * profile (`deno run --cpu-prof`) spent the thread's time: the share of samples per function,
 * self and inclusive (a function counted once per sample however deep it recurses), the idle
 * share apart. For the GPU machine, where only a few small files come back: the summary instead
 * of the profile (bench/gpu_machine.sh part `http-prof`).
 * @module
 */
import { parseArgs } from "node:util";

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}

/** A V8 CPU profile's nodes and samples. */
export interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
}

/** One function's share of the samples. */
export interface Share {
  name: string;
  self: number;
  inclusive: number;
}

const nameOf = (n: ProfileNode) => {
  const f = n.callFrame;
  const file = f.url.slice(f.url.lastIndexOf("/") + 1);
  return `${f.functionName || "(anonymous)"} ${file}:${f.lineNumber + 1}`;
};

/** Self and inclusive sample shares per function name, most inclusive first. */
export function summarize(p: CpuProfile): { samples: number; shares: Share[] } {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const count = new Map<number, number>();
  for (const s of p.samples) count.set(s, (count.get(s) ?? 0) + 1);
  const self = new Map<string, number>(), incl = new Map<string, number>();
  for (const [id, c] of count) {
    const leaf = nameOf(byId.get(id)!);
    self.set(leaf, (self.get(leaf) ?? 0) + c);
    const seen = new Set<string>();
    for (let x: number | undefined = id; x !== undefined; x = parent.get(x)) {
      const nm = nameOf(byId.get(x)!);
      if (seen.has(nm)) continue;
      seen.add(nm);
      incl.set(nm, (incl.get(nm) ?? 0) + c);
    }
  }
  const total = p.samples.length || 1;
  const shares = [...incl].map(([name, c]) => ({
    name,
    self: (self.get(name) ?? 0) / total,
    inclusive: c / total,
  })).sort((a, b) => b.inclusive - a.inclusive);
  return { samples: p.samples.length, shares };
}

/** The summary as lines: the top `top` by self share, then by inclusive share. */
export function formatSummary(s: { samples: number; shares: Share[] }, top: number): string[] {
  const pct = (x: number) => `${(100 * x).toFixed(2).padStart(6)}%`;
  const bySelf = [...s.shares].sort((a, b) => b.self - a.self).slice(0, top);
  return [
    `${s.samples} samples`,
    "-- self",
    ...bySelf.map((x) => `${pct(x.self)} ${x.name}`),
    "-- inclusive",
    ...s.shares.slice(0, top).map((x) => `${pct(x.inclusive)} ${x.name}`),
  ];
}

if (import.meta.main) {
  const { values, positionals } = parseArgs({
    args: Deno.args,
    options: { top: { type: "string", default: "40" } },
    allowPositionals: true,
  });
  for (const file of positionals) {
    console.log(`== ${file}`);
    const p = JSON.parse(await Deno.readTextFile(file)) as CpuProfile;
    console.log(formatSummary(summarize(p), Number(values.top)).join("\n"));
  }
}
