/**
 * `/metrics` of several device threads (device_threads.ts) as one Prometheus text: each
 * family once (its `# HELP` and `# TYPE` lines from the first thread that has it), then every
 * thread's samples of it, each with a `device_thread="i"` label first. Families keep the order
 * they first appear in; a family's samples stay together, as the text format asks.
 * @module
 */

/** The label every merged sample gets. */
export const THREAD_LABEL = "device_thread";

interface Family {
  help?: string;
  type?: string;
  samples: string[];
}

/** `name{labels} value` or `name value` with the thread label added. */
function labelled(line: string, thread: number | string): string {
  const label = `${THREAD_LABEL}="${thread}"`;
  const brace = line.indexOf("{");
  const space = line.indexOf(" ");
  if (brace >= 0 && (space < 0 || brace < space)) {
    const empty = line[brace + 1] === "}";
    return line.slice(0, brace + 1) + label + (empty ? "" : ",") + line.slice(brace + 1);
  }
  if (space < 0) return line;
  return `${line.slice(0, space)}{${label}}${line.slice(space)}`;
}

/**
 * Merges the threads' texts, each labelled with its name in `labels` (default: its index, the
 * thread number; the front's own counts go last as `front`).
 */
export function mergeMetrics(
  texts: string[],
  labels: (number | string)[] = texts.map((_, i) => i),
): string {
  const families = new Map<string, Family>();
  const family = (name: string) => {
    let f = families.get(name);
    if (!f) families.set(name, f = { samples: [] });
    return f;
  };
  texts.forEach((text, thread) => {
    let current: Family | null = null;
    for (const line of text.split("\n")) {
      const m = /^# (HELP|TYPE) (\S+)/.exec(line);
      if (m) {
        current = family(m[2]);
        if (m[1] === "HELP") current.help ??= line;
        else current.type ??= line;
      } else if (line !== "" && !line.startsWith("#")) {
        current ??= family(line.split(/[{ ]/)[0]);
        current.samples.push(labelled(line, labels[thread]));
      }
    }
  });
  const out: string[] = [];
  for (const f of families.values()) {
    if (f.help) out.push(f.help);
    if (f.type) out.push(f.type);
    out.push(...f.samples);
  }
  return out.join("\n") + "\n";
}

/**
 * The header the device threads' front sends, with its secret token, on the scrapes it merges:
 * the threads answer them without counting them (one scrape counts once, on the first thread).
 */
export const SCRAPE_HEADER = "x-attention-merged-scrape";

/**
 * Marks a create the front may retry on another thread (server/create_elsewhere.ts), with the
 * same secret: a thread does not count it when it refuses it for memory (the front then asks
 * the next thread, and the client sees one answer, counted where it was given).
 */
export const TENTATIVE_HEADER = "x-attention-tentative-create";
