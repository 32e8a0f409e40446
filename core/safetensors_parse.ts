/**
 * Parsing a safetensors file: an 8-byte little-endian u64 header length, a JSON header
 * `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {key: string}}`, then
 * the data bytes (offsets are relative to the start of the data). Parsing is strict: every
 * defect is a ServiceError 400 `bad_safetensors` whose message says what and where, with an
 * issue per bad field (`[tensor, "dtype" | "shape" | "data_offsets"]`, `["__metadata__", key]`,
 * `["header_length"]`, `["header"]`, `["data"]` for bytes after the last tensor), naming the value.
 * A header that parsed without a defect is kept (a small memo) so the same header is not parsed
 * again.
 * @module
 */
import { type Issue, MAX_LISTED_ISSUES, ServiceError, withNotListed } from "./errors.ts";
import { type DuplicateKey, duplicateKey, REPEATED_NAME } from "./json_structure.ts";
import {
  numel,
  SAFETENSORS_DTYPE_BYTES,
  SAFETENSORS_DTYPES,
  type SafetensorsDType,
  type SafetensorsFile,
  type SafetensorsTensor,
  show,
} from "./safetensors_format.ts";

/** Largest accepted header (JSON) length in bytes. */
export const MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024;

type Path = (string | number)[];

/** One defect: a 400 `bad_safetensors` with its issue. */
function bad(path: Path, message: string): ServiceError {
  return badAll([{ path, message }]);
}

/**
 * Every defect found: a 400 `bad_safetensors` named by the first, listing them (the first
 * {@link MAX_LISTED_ISSUES}, then one issue counting the rest).
 */
function badAll(issues: Issue[]): ServiceError {
  const first = issues[0];
  const where = first.path.length ? `${first.path.join(".")}: ` : "";
  const more = issues.length > 1 ? ` (and ${issues.length - 1} more)` : "";
  // A 100 MB header may hold millions.
  const listed = withNotListed(
    issues.slice(0, MAX_LISTED_ISSUES),
    issues.length - MAX_LISTED_ISSUES,
  );
  return new ServiceError(`invalid safetensors: ${where}${first.message}${more}`, {
    status: 400,
    code: "bad_safetensors",
    issues: listed,
  });
}

function isDType(s: unknown): s is SafetensorsDType {
  return typeof s === "string" && (SAFETENSORS_DTYPES as readonly string[]).includes(s);
}

function isNonNegInt(x: unknown): x is number {
  return typeof x === "number" && Number.isSafeInteger(x) && x >= 0;
}

/** Options of {@link parseSafetensors}. */
export interface ParseOptions {
  /**
   * Called with the header's bytes before they are parsed as JSON, for a header not seen
   * before (e.g. a depth and size pre-scan that throws). A scan that also finds the first
   * repeated member name (wire/json_scan.ts scanJson) returns it, or null, and the header is
   * not walked again for it; one that returns nothing leaves that to the parser.
   */
  scanHeader?: (header: Uint8Array) => DuplicateKey | null | void;
}

/** One tensor's place in a parsed header, in offset order. */
interface Span {
  name: string;
  dtype: SafetensorsDType;
  shape: readonly number[];
  begin: number;
  end: number;
}

/** A header that parsed without a defect, for a data section of its length. */
interface Layout {
  spans: Span[];
  metadata: Readonly<Record<string, string>>;
}

/**
 * Headers parsed before, by their text and data length (every check depends on nothing
 * else): an engine sends the same header for every call of a shape, so its JSON is parsed
 * and checked once. Only headers that parsed without a defect are kept, at most
 * {@link LAYOUT_MEMO_SIZE} of them (the oldest goes first), each at most
 * {@link LAYOUT_MEMO_TEXT} characters.
 */
const layouts = new Map<string, Layout>();
const LAYOUT_MEMO_SIZE = 64;
const LAYOUT_MEMO_TEXT = 64 * 1024;
const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * Parses a safetensors file. Tensor `data` are zero-copy views into `bytes`; a header seen
 * before (same text, same data length) is not parsed again. The tensors' `shape` arrays and
 * the metadata map may be shared between calls: they are frozen.
 * @throws ServiceError 400 `bad_safetensors` on any structural defect.
 */
export function parseSafetensors(bytes: Uint8Array, opts: ParseOptions = {}): SafetensorsFile {
  if (bytes.byteLength < 8) {
    throw bad(
      ["header_length"],
      `file is ${bytes.byteLength} bytes, shorter than the 8-byte header length`,
    );
  }
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLen = dv.getBigUint64(0, true);
  if (headerLen > BigInt(MAX_SAFETENSORS_HEADER_BYTES)) {
    throw bad(
      ["header_length"],
      `header length ${headerLen} exceeds the ${MAX_SAFETENSORS_HEADER_BYTES}-byte limit`,
    );
  }
  const hl = Number(headerLen);
  if (8 + hl > bytes.byteLength) {
    throw bad(
      ["header_length"],
      `header length ${hl} runs past the end of the ${bytes.byteLength}-byte body`,
    );
  }
  const headerBytes = bytes.subarray(8, 8 + hl);
  let text: string;
  try {
    text = utf8.decode(headerBytes);
  } catch (e) {
    opts.scanHeader?.(headerBytes); // its problem first, as for any header not seen before
    throw bad(
      ["header"],
      `header is not valid UTF-8 JSON (${e instanceof Error ? e.message : String(e)})`,
    );
  }
  const data = bytes.subarray(8 + hl);
  const key = text.length <= LAYOUT_MEMO_TEXT ? `${data.byteLength}:${text}` : null;
  const known = key === null ? undefined : layouts.get(key);
  if (known !== undefined) return viewsOf(known, data);
  const scanned = opts.scanHeader?.(headerBytes);
  const twice = scanned === undefined ? duplicateKey(headerBytes) : scanned;
  const layout = parseLayout(text, twice, data.byteLength);
  if (key !== null) {
    if (layouts.size >= LAYOUT_MEMO_SIZE) layouts.delete(layouts.keys().next().value!);
    layouts.set(key, layout);
  }
  return viewsOf(layout, data);
}

/**
 * The file's tensors as views of `data` at a layout's offsets. Shapes and metadata are the
 * caller's own copies: the layout's are frozen and shared by every body the memo matched.
 */
function viewsOf(layout: Layout, data: Uint8Array): SafetensorsFile {
  const tensors: Record<string, SafetensorsTensor> = {};
  for (const s of layout.spans) {
    tensors[s.name] = {
      dtype: s.dtype,
      shape: [...s.shape],
      data: data.subarray(s.begin, s.end),
    };
  }
  return { tensors, metadata: { ...layout.metadata } as Record<string, string> };
}

/**
 * A header's JSON text, checked against a data section of `dataBytes`: every bad metadata value
 * and every bad tensor (its first defect) is listed, then, when all tensors are well formed,
 * every overlap and every byte that belongs to no tensor. `twice`: the first name the header
 * repeats, found by the caller (refused once the text parses).
 */
function parseLayout(text: string, twice: DuplicateKey | null, dataBytes: number): Layout {
  let header: unknown;
  try {
    header = JSON.parse(text);
  } catch (e) {
    throw bad(
      ["header"],
      `header is not valid UTF-8 JSON (${e instanceof Error ? e.message : String(e)})`,
    );
  }
  if (twice) {
    throw bad(twice.path.map(String), REPEATED_NAME);
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) {
    throw bad(["header"], `header must be a JSON object, got ${show(header)}`);
  }
  const metadata: Record<string, string> = {};
  const spans: Span[] = [];
  const issues: Issue[] = [];
  const add = (path: Path, message: string) => void issues.push({ path, message });
  for (const [name, entry] of Object.entries(header as Record<string, unknown>)) {
    if (name === "__metadata__") {
      if (typeof entry !== "object" || entry === null || Array.isArray(entry)) {
        add([name], `must be an object of strings, got ${show(entry)}`);
        continue;
      }
      for (const [k, v] of Object.entries(entry as Record<string, unknown>)) {
        if (typeof v !== "string") add([name, k], `must be a string, got ${show(v)}`);
        else metadata[k] = v;
      }
      continue;
    }
    const span = tensorSpan(name, entry, dataBytes);
    if ("path" in span) add(span.path, span.message);
    else spans.push(span);
  }
  if (issues.length) throw badAll(issues);
  spans.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let cursor = 0;
  for (let i = 0; i < spans.length; i++) {
    const s = spans[i];
    const at = [s.name, "data_offsets"];
    if (s.begin < cursor) {
      add(at, `[${s.begin}, ${s.end}) overlaps tensor ${spans[i - 1].name}`);
    } else if (s.begin > cursor) {
      add(at, `[${s.begin}, ${s.end}): data bytes [${cursor}, ${s.begin}) belong to no tensor`);
    }
    cursor = Math.max(cursor, s.end);
  }
  if (cursor !== dataBytes) {
    add(
      ["data"],
      `data bytes [${cursor}, ${dataBytes}) belong to no tensor (the data section is ${dataBytes} ` +
        `bytes, the tensors end at ${cursor})`,
    );
  }
  if (issues.length) throw badAll(issues);
  return { spans, metadata: Object.freeze(metadata) };
}

/** One tensor entry's span, or its first defect (an issue at the field). */
function tensorSpan(name: string, entry: unknown, dataBytes: number): Span | Issue {
  if (typeof entry !== "object" || entry === null || Array.isArray(entry)) {
    return { path: [name], message: `tensor entry must be an object, got ${show(entry)}` };
  }
  const { dtype, shape, data_offsets } = entry as Record<string, unknown>;
  if (!isDType(dtype)) {
    const supported = `(supported: ${SAFETENSORS_DTYPES.join(", ")})`;
    return {
      path: [name, "dtype"],
      message: typeof dtype === "string"
        ? `unsupported dtype ${show(dtype)} ${supported}`
        : `dtype must be a string ${supported}, got ${show(dtype)}`,
    };
  }
  if (!Array.isArray(shape) || !shape.every(isNonNegInt)) {
    return {
      path: [name, "shape"],
      message: `shape must be an array of non-negative integers, got ${show(shape)}`,
    };
  }
  const offsets = [name, "data_offsets"];
  if (
    !Array.isArray(data_offsets) || data_offsets.length !== 2 ||
    !data_offsets.every(isNonNegInt) || data_offsets[0] > data_offsets[1]
  ) {
    return {
      path: offsets,
      message: `data_offsets must be [begin, end] with begin <= end, got ${show(data_offsets)}`,
    };
  }
  const [begin, end] = data_offsets as [number, number];
  if (end > dataBytes) {
    return {
      path: offsets,
      message: `data_offsets ${
        show(data_offsets)
      } out of range of the ${dataBytes}-byte data section`,
    };
  }
  const want = numel(shape) * SAFETENSORS_DTYPE_BYTES[dtype];
  if (end - begin !== want) {
    return {
      path: offsets,
      message: `${end - begin} bytes but ${dtype} x ${show(shape)} needs ${want} (data_offsets ${
        show(data_offsets)
      })`,
    };
  }
  return { name, dtype, shape: Object.freeze([...shape]) as number[], begin, end };
}
