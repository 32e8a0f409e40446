/**
 * zod validation failures as this service's issues: each `{path, message}` names the field and
 * carries its current value; {@link fromZod} makes them one 400 ServiceError. Shared by every
 * place a wire schema is checked (request bodies, `__metadata__.request`, path parameters).
 * @module
 */
import type { z } from "zod";
import { type Issue, MAX_LISTED_ISSUES, ServiceError, withNotListed } from "../core/errors.ts";
import { literalAt, valueAt } from "./json_literals.ts";

/** Marks a non-finite number in {@link showValue}'s JSON (a client cannot guess it). */
const NON_FINITE_MARK = `\u0000${crypto.randomUUID()}:`;
const NON_FINITE_QUOTED = new RegExp(`"\\\\u0000${NON_FINITE_MARK.slice(1)}([^"]*)"`, "g");

/** A short JSON rendering of a value for messages. */
export function showValue(v: unknown, max = 80): string {
  if (v === undefined) return "undefined (missing)";
  if (typeof v === "number" && !Number.isFinite(v)) return String(v);
  let s: string;
  try {
    // Non-finite numbers would print as null: spell them (Infinity, -Infinity, NaN).
    const mark = NON_FINITE_MARK;
    s = JSON.stringify(v, (_k, x) =>
      typeof x === "bigint"
        ? x.toString()
        : typeof x === "number" && !Number.isFinite(x)
        ? mark + String(x)
        : x)?.replace(NON_FINITE_QUOTED, "$1") ?? String(v);
  } catch {
    s = String(v);
  }
  return s.length > max ? s.slice(0, max - 3) + "..." : s;
}

/** The value at `path` of `root` for a message: the client's literal where float64 changed it. */
function shownAt(root: unknown, path: readonly PropertyKey[]): string {
  return literalAt(root, path) ?? showValue(valueAt(root, path));
}

type ZIssue = z.core.$ZodIssue;

/** Picks the union branch that got furthest (longest issue paths, not a type mismatch at the root). */
function bestBranch(errors: ZIssue[][], depth: number): ZIssue[] {
  let best = errors[0] ?? [];
  let score = -1;
  for (const branch of errors) {
    const s = Math.max(
      ...branch.map((i) =>
        i.path.length > depth || i.code !== "invalid_type" ? 10 + i.path.length : 0
      ),
    );
    if (s > score) {
      score = s;
      best = branch;
    }
  }
  return best;
}

/**
 * Issues kept (at most MAX_LISTED_ISSUES: a body of 4,000,000 unknown keys, 43 MB within the
 * body and value limits, made a 254 MB answer of one issue each, 28 s of the serving thread and
 * 2 GB) and the count of all.
 */
interface IssueSink {
  list: Issue[];
  total: number;
}

function add(sink: IssueSink, make: () => Issue): void {
  sink.total++;
  if (sink.list.length < MAX_LISTED_ISSUES) sink.list.push(make());
}

/** `root` is the value the issues' paths start from, past the first `skip` entries of `base`. */
function flattenIssues(
  issues: readonly ZIssue[],
  base: PropertyKey[],
  root: unknown,
  out: IssueSink,
  skip: number,
): void {
  for (const i of issues) {
    const path = [...base, ...i.path];
    if (i.code === "invalid_union" && i.errors.length > 0) {
      flattenIssues(bestBranch(i.errors, 0), path, root, out, skip);
      continue;
    }
    if (i.code === "unrecognized_keys") {
      for (const k of i.keys) {
        add(out, () => ({
          path: [...path, k].map(String),
          message: `unknown field ${JSON.stringify(k)}; got ${
            shownAt(root, [...path, k].slice(skip))
          }`,
        }));
      }
      continue;
    }
    add(out, () => ({
      path: path.map((p) => (typeof p === "number" ? p : String(p))),
      message: `${i.message}; got ${shownAt(root, path.slice(skip))}`,
    }));
  }
}

/**
 * zod issues → `{path, message}` issues whose messages carry the current value: the first
 * MAX_LISTED_ISSUES, and how many there are in all.
 */
export function zodIssueList(
  error: z.ZodError,
  input: unknown,
  prefix: (string | number)[] = [],
): IssueSink {
  const out: IssueSink = { list: [], total: 0 };
  flattenIssues(error.issues, prefix, input, out, prefix.length);
  return out;
}

/** A ZodError as a 400 ServiceError (`invalid_request` unless another code is given). */
export function fromZod(
  error: z.ZodError,
  input: unknown,
  opts: { code?: string; prefix?: (string | number)[]; what?: string } = {},
): ServiceError {
  const { list, total } = zodIssueList(error, input, opts.prefix);
  const issues = withNotListed(list, total - list.length);
  const first = issues[0];
  const where = first ? `${first.path.join(".") || "(body)"}: ${first.message}` : "invalid";
  const more = total > 1 ? ` (and ${total - 1} more)` : "";
  return new ServiceError(
    `${opts.what ?? "request body"} does not match the schema: ${where}${more}`,
    {
      status: 400,
      code: opts.code ?? "invalid_request",
      issues,
    },
  );
}
