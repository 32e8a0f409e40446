/**
 * The structural checks of forward validation: what the HTTP path's schemas
 * (wire/schemas.ts) and tensor decoders (wire/tensors.ts) guarantee before validation runs,
 * checked again for library callers that hand {@link validateForward} (or the host-batch
 * validation of service/host_input.ts) objects of their own. Every field the later checks and
 * the backends read is there and of its type: enums are members, counts are integers in range,
 * tensors are of their typed-array kind, and each tensor's elements agree with its shape. Each
 * problem is an issue naming the field and its current value; any input (null, missing fields,
 * wrong types) gives issues, never a TypeError. O(1) per field: no element is read.
 * @module
 */
import { cacheSpecIssues, INT32_MAX, ruleText } from "../core/cache_spec.ts";
import { bytesPerElement } from "../core/dtype.ts";
import { ATTN_TYPES, type DType, DTYPES, KV_LAYOUTS, type StorageDType } from "../core/types.ts";
import { showValue } from "../wire/zod_issues.ts";
import { fmt, type Issues } from "./validate_layer.ts";
import type { ForwardInput } from "./validate.ts";

type Path = (string | number)[];
/** A record as the checks read it (each field `unknown` until checked). */
type Rec = Record<string, unknown>;

/** The dtypes a cache tensor may be stored in. */
const STORAGE_DTYPES: readonly StorageDType[] = [
  "float32",
  "float16",
  "bfloat16",
  "fp8_e4m3",
  "fp8_e5m2",
];
const CACHE_STORAGES = ["host", "webgpu"] as const;

/** A value for a message: typed arrays by kind and length, the rest as short JSON. */
export function show(v: unknown): string {
  if (ArrayBuffer.isView(v)) {
    const n = (v as { length?: number }).length ?? v.byteLength;
    return `${v.constructor.name}(${n})`;
  }
  if (typeof v === "function") return "a function";
  return showValue(v, 60);
}

/** A plain record: an object that is neither null, an array nor a typed array. */
export function isRecord(v: unknown): v is Rec {
  return v !== null && typeof v === "object" && !Array.isArray(v) && !ArrayBuffer.isView(v);
}

/** An integer in [min, int32 max]. */
const isInt = (v: unknown, min: number): v is number =>
  typeof v === "number" && Number.isInteger(v) && v >= min && v <= INT32_MAX;

/** A count: an integer in [0, 2^31). */
export const isCount = (v: unknown): v is number => isInt(v, 0);
/** A positive count: an integer in [1, 2^31). */
export const isPositive = (v: unknown): v is number => isInt(v, 1);

/**
 * Where an issue is: `base` (a constant shared by every call, never mutated) or `base.key`. The
 * checks pass both and build the path only for an issue, so a valid input allocates none.
 */
const at = (base: Path, key?: string | number): Path => key === undefined ? base : [...base, key];

const ROOT: Path = [];
const LAYER: Path = ["layer"];
const METADATA: Path = ["metadata"];
const KV_CACHE: Path = ["kv_cache"];
/** One-field paths of the input and of its metadata, by name. */
const TOP: Record<string, Path> = {};
const MD: Record<string, Path> = {};
for (const k of ["dtype", "query", "key", "value", "key_cache", "value_cache"]) TOP[k] = [k];
for (const k of ["backend", "return_lse", "kv_cache_layout"]) TOP[k] = [k];
for (const k of ["query_start_loc", "seq_lens", "block_table", "slot_mapping"]) {
  MD[k] = ["metadata", k];
}

/** Adds an issue unless `v` is an integer >= `min` (0 or 1); returns whether it is. */
export function checkCount(
  v: unknown,
  min: 0 | 1,
  is: Issues,
  base: Path,
  key?: string | number,
): v is number {
  if (isInt(v, min)) return true;
  is.add(at(base, key), `${ruleText({ kind: "size", min, max: INT32_MAX })}, got ${show(v)}`);
  return false;
}

/** Adds an issue unless `v` is one of `values` (or absent, when `optional`). */
export function checkEnum(
  v: unknown,
  values: readonly string[],
  optional: boolean,
  is: Issues,
  base: Path,
  key?: string | number,
): boolean {
  if ((optional && v === undefined) || (typeof v === "string" && values.includes(v))) return true;
  is.add(
    at(base, key),
    `must be one of ${values.join(", ")}${optional ? " (or absent)" : ""}, got ${show(v)}`,
  );
  return false;
}

/** Adds an issue unless `v` is absent or of the JS type `type` (null too when `nullable`). */
export function checkOptional(
  v: unknown,
  type: "number" | "boolean" | "string",
  nullable: boolean,
  is: Issues,
  base: Path,
  key?: string,
): void {
  if (v === undefined || typeof v === type || (nullable && v === null)) return;
  is.add(at(base, key), `must be a ${type}${nullable ? ", null" : ""} or absent, got ${show(v)}`);
}

/** The element count of `t.shape`, or null (and an issue at `base.shape`) when it is not one. */
function shapeCount(s: unknown, is: Issues, base: Path): number | null {
  let n = 1;
  if (Array.isArray(s)) {
    for (let i = 0; i < s.length && !Number.isNaN(n); i++) n = isCount(s[i]) ? n * s[i] : NaN;
    if (!Number.isNaN(n)) return n;
  }
  is.add(at(base, "shape"), `must be an array of integers >= 0, got ${show(s)}`);
  return null;
}

/**
 * A layer's parameters as the schema types them (the defaults and the semantic rules are
 * checkLayer's): positive head counts and head size, numbers, booleans, `attn_type` of
 * {@link ATTN_TYPES}, per-head vectors as arrays (their length and values are checkLayer's).
 */
export function checkLayerFields(l: unknown, is: Issues): l is Rec {
  if (!isRecord(l)) {
    is.add(LAYER, `must be an object, got ${show(l)}`);
    return false;
  }
  const before = is.count;
  checkCount(l.num_heads, 1, is, LAYER, "num_heads");
  checkCount(l.num_kv_heads, 1, is, LAYER, "num_kv_heads");
  checkCount(l.head_size, 1, is, LAYER, "head_size");
  checkOptional(l.scale, "number", true, is, LAYER, "scale");
  checkOptional(l.sliding_window, "number", true, is, LAYER, "sliding_window");
  checkOptional(l.logits_soft_cap, "number", true, is, LAYER, "logits_soft_cap");
  checkOptional(l.k_scale, "number", false, is, LAYER, "k_scale");
  checkOptional(l.v_scale, "number", false, is, LAYER, "v_scale");
  checkOptional(l.causal, "boolean", false, is, LAYER, "causal");
  checkEnum(l.attn_type, ATTN_TYPES, true, is, LAYER, "attn_type");
  for (const k of ["alibi_slopes", "sinks"] as const) {
    const v = l[k];
    if (
      v !== undefined && v !== null && !Array.isArray(v) && !(v instanceof Float32Array) &&
      !(v instanceof Float64Array)
    ) {
      is.add(at(LAYER, k), `must be an array of num_heads numbers, null or absent, got ${show(v)}`);
    }
  }
  return is.count === before;
}

/** A data tensor: `{dtype, shape, array}`, `array` a DataArray of that dtype and shape. */
function checkDataTensor(t: unknown, is: Issues, base: Path): void {
  if (!isRecord(t)) {
    is.add(base, `must be a data tensor {dtype, shape, array}, got ${show(t)}`);
    return;
  }
  const dtypeOk = checkEnum(t.dtype, DTYPES, false, is, base, "dtype");
  const n = shapeCount(t.shape, is, base);
  const a = t.array;
  if (!isRecord(a) || !(a.bytes instanceof Uint8Array) || !isCount(a.length)) {
    is.add(
      at(base, "array"),
      `must be a DataArray {dtype, length, bytes: Uint8Array} (core/data.ts dataArray), got ${
        show(a)
      }`,
    );
    return;
  }
  if (dtypeOk && a.dtype !== t.dtype) {
    is.add([...base, "array", "dtype"], `is ${show(a.dtype)} but the tensor's dtype is ${t.dtype}`);
  } else if (dtypeOk && a.bytes.byteLength !== a.length * bytesPerElement(t.dtype as DType)) {
    is.add(
      [...base, "array", "bytes"],
      `holds ${a.bytes.byteLength} bytes but ${a.length} ${t.dtype} elements need ${
        a.length * bytesPerElement(t.dtype as DType)
      }`,
    );
  }
  if (n !== null && a.length !== n) {
    is.add(
      at(base, "array"),
      `has ${a.length} elements but shape ${fmt(t.shape as number[])} needs ${n}`,
    );
  }
}

/** A cache tensor: `{dtype, shape, bytes}`, the bytes of that storage dtype and shape. */
function checkCacheTensor(t: unknown, is: Issues, base: Path): void {
  if (!isRecord(t)) {
    is.add(base, `must be a cache tensor {dtype, shape, bytes} or absent, got ${show(t)}`);
    return;
  }
  const dtypeOk = checkEnum(t.dtype, STORAGE_DTYPES, false, is, base, "dtype");
  const n = shapeCount(t.shape, is, base);
  if (!(t.bytes instanceof Uint8Array)) {
    is.add(at(base, "bytes"), `must be a Uint8Array, got ${show(t.bytes)}`);
  } else if (dtypeOk && n !== null) {
    const want = n * bytesPerElement(t.dtype as StorageDType);
    if (t.bytes.byteLength !== want) {
      is.add(
        at(base, "bytes"),
        `holds ${t.bytes.byteLength} bytes but ${t.dtype} x ${
          fmt(t.shape as number[])
        } needs ${want}`,
      );
    }
  }
}

/** An integer tensor: `{shape, values}`, `values` an Int32Array of that shape. */
function checkIntTensor(t: unknown, is: Issues, base: Path): void {
  if (!isRecord(t)) {
    is.add(base, `must be an integer tensor {shape, values: Int32Array}, got ${show(t)}`);
    return;
  }
  const n = shapeCount(t.shape, is, base);
  if (!(t.values instanceof Int32Array)) {
    is.add(at(base, "values"), `must be an Int32Array, got ${show(t.values)}`);
  } else if (n !== null && t.values.length !== n) {
    is.add(
      at(base, "values"),
      `has ${t.values.length} entries but shape ${fmt(t.shape as number[])} needs ${n}`,
    );
  }
}

/**
 * A cache spec (a held cache's, or a host batch's cache): each field by its rule of
 * core/cache_spec.ts CACHE_SPEC_RULES (the rules checkCacheSpec and the HTTP schema keep, in
 * the same words). `base` names it in the issues.
 */
export function checkSpecFields(s: unknown, is: Issues, base: Path): void {
  for (const i of cacheSpecIssues(s)) is.add([...base, ...i.path], i.message);
}

const HELD_SPEC: Path = ["kv_cache", "spec"];

/**
 * A cache as the validators are given it: `{spec, storage}` or null (validateForward's held
 * cache, named `kv_cache`; a host batch's KvCache, named `cache`).
 */
export function checkHeld(held: unknown, is: Issues, base: Path = KV_CACHE): void {
  if (held === null) return;
  if (!isRecord(held)) {
    is.add(base, `the cache must be {spec, storage} or null, got ${show(held)}`);
    return;
  }
  checkSpecFields(held.spec, is, base === KV_CACHE ? HELD_SPEC : at(base, "spec"));
  checkEnum(held.storage, CACHE_STORAGES, false, is, base, "storage");
}

/**
 * Checks the structure of a forward input (see the module doc); adds an issue for each field
 * that breaks it. The semantic checks (validate.ts) may read the input once this adds none.
 */
export function checkInputFields(input: unknown, is: Issues): input is ForwardInput {
  const before = is.count;
  if (!isRecord(input)) {
    is.add(ROOT, `a forward input must be an object, got ${show(input)}`);
    return false;
  }
  checkEnum(input.dtype, DTYPES, false, is, TOP.dtype);
  checkLayerFields(input.layer, is);
  checkDataTensor(input.query, is, TOP.query);
  if (input.key !== undefined) checkDataTensor(input.key, is, TOP.key);
  if (input.value !== undefined) checkDataTensor(input.value, is, TOP.value);
  if (input.key_cache !== undefined) checkCacheTensor(input.key_cache, is, TOP.key_cache);
  if (input.value_cache !== undefined) checkCacheTensor(input.value_cache, is, TOP.value_cache);
  const md = input.metadata;
  if (!isRecord(md)) {
    is.add(METADATA, `must be an object, got ${show(md)}`);
  } else {
    checkIntTensor(md.query_start_loc, is, MD.query_start_loc);
    checkIntTensor(md.seq_lens, is, MD.seq_lens);
    if (md.block_table !== undefined) checkIntTensor(md.block_table, is, MD.block_table);
    if (md.slot_mapping !== undefined) checkIntTensor(md.slot_mapping, is, MD.slot_mapping);
  }
  checkOptional(input.kv_cache, "string", false, is, KV_CACHE);
  checkOptional(input.backend, "string", false, is, TOP.backend);
  checkOptional(input.return_lse, "boolean", false, is, TOP.return_lse);
  checkEnum(input.kv_cache_layout, KV_LAYOUTS, true, is, TOP.kv_cache_layout);
  return is.count === before;
}
