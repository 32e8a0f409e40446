/**
 * One rule per cache-spec field (core/cache_spec.ts): the library's check (checkCacheSpec, run by
 * HostKvCache, GpuKvCache and the service's cache create), the forward validator's
 * (service/validate_input.ts checkSpecFields, at `kv_cache.spec`) and the HTTP schema of a cache
 * create (wire/schemas.ts CreateCacheRequestSchema, through fromZod as the server answers it)
 * accept the same values and refuse the others with the same rule text, naming the field and
 * its value. Each path keeps its own shape: 422 `invalid_cache_spec` at `[field]`, 422
 * `invalid_batch` at `kv_cache.spec.field`, 400 `invalid_request` at `[field]`.
 */
import assert from "node:assert/strict";
import { checkCacheSpec } from "../../core/cache_spec.ts";
import { type Issue, ServiceError } from "../../core/errors.ts";
import type { KvCacheSpec } from "../../core/types.ts";
import { validateForward } from "../../service/validate.ts";
import { CreateCacheRequestSchema } from "../../wire/schemas.ts";
import { fromZod } from "../../wire/zod_issues.ts";
import { DECODE_SPEC, decodeInput } from "../service/decode_input.ts";

type Field = keyof KvCacheSpec;
type Loose = Record<string, unknown>;

/** The 422 `invalid_cache_spec` checkCacheSpec throws for `spec`, or null when it takes it. */
function libraryRefusal(spec: unknown): ServiceError | null {
  try {
    checkCacheSpec(spec as KvCacheSpec);
    return null;
  } catch (e) {
    assert.ok(e instanceof ServiceError, `a ServiceError, not ${e}`);
    assert.equal(e.status, 422);
    assert.equal(e.code, "invalid_cache_spec");
    return e;
  }
}

/** The library check's first issue for `spec`, or null. */
const libraryIssue = (spec: unknown): Issue | null => libraryRefusal(spec)?.issues?.[0] ?? null;

/** The forward validator's first issue under `kv_cache.spec` (path relative to it), or null. */
function validatorIssue(spec: unknown): Issue | null {
  try {
    validateForward(decodeInput(), { spec: spec as KvCacheSpec, storage: "webgpu" });
  } catch (e) {
    assert.ok(e instanceof ServiceError, `a ServiceError, not ${e}`);
    const i = e.issues?.find((i) => i.path[0] === "kv_cache" && i.path[1] === "spec");
    if (i) {
      assert.equal(e.code, "invalid_batch");
      return { path: i.path.slice(2), message: i.message };
    }
  }
  return null;
}

/** The HTTP create's first issue for the body, as the server's 400 carries it, or null. */
function httpIssue(body: Loose): Issue | null {
  const r = CreateCacheRequestSchema.safeParse(body);
  if (r.success) return null;
  const e = fromZod(r.error, body);
  assert.equal(e.status, 400);
  assert.equal(e.code, "invalid_request");
  return e.issues![0];
}

/** `base` with `field` set to `v` (left out when undefined). */
function withField(field: Field, v: unknown): Loose {
  const s: Loose = { ...DECODE_SPEC, [field]: v };
  if (v === undefined) delete s[field];
  return s;
}

/** The three paths on `field` = `v`: the same verdict, the same path and the same rule text. */
function assertOneRule(field: Field, v: unknown, http = true): void {
  const s = withField(field, v);
  const lib = libraryIssue(s), val = validatorIssue(s), web = http ? httpIssue(s) : null;
  const what = `${field} = ${typeof v === "string" ? JSON.stringify(v) : String(v)}`;
  assert.equal(lib === null, val === null, `${what}: library ${lib?.message}, validator ${val}`);
  if (http) assert.equal(lib === null, web === null, `${what}: library ${lib}, HTTP ${web}`);
  if (lib === null || val === null) return;
  assert.deepEqual(lib.path, [field], what);
  assert.deepEqual(val.path, [field], what);
  assert.equal(val.message, lib.message, `${what}: the validator's message is the library's`);
  const rule = lib.message.slice(0, lib.message.lastIndexOf(", got "));
  assert.ok(rule.startsWith("must be "), `${what}: ${lib.message}`);
  if (web) {
    assert.deepEqual(web.path, [field], what);
    assert.ok(web.message.startsWith(`${rule}; got `), `${what}: HTTP says ${web.message}`);
  }
}

const SIZES = ["num_blocks", "block_size", "num_kv_heads", "head_size"] as const;

Deno.test("cache spec sizes: one bound, [1, 2^31 - 1], on every path, with one message", () => {
  const values = [1, 3, 2 ** 31 - 1, 0, -1, 2 ** 31, 2 ** 53 - 1, 1.5, "16", null, undefined];
  for (const f of SIZES) for (const v of values) assertOneRule(f, v);
  for (const f of SIZES) for (const v of [NaN, Infinity, true, [4]]) assertOneRule(f, v, false);
});

Deno.test("cache spec sizes: a size over int32 is refused by the library check too", () => {
  for (const f of SIZES) {
    const e = libraryRefusal(withField(f, 2 ** 31));
    assert.ok(e, `${f} = 2^31 was accepted`);
    assert.deepEqual(e.issues, [{
      path: [f],
      message: "must be an integer in [1, 2147483647], got 2147483648",
    }]);
    assert.equal(e.message, `${f} must be an integer in [1, 2147483647], got 2147483648`);
  }
});

Deno.test("cache spec: a value of the wrong type shows its type (a string size is quoted)", () => {
  const e = libraryRefusal(withField("num_blocks", "16"));
  assert.equal(e?.issues?.[0].message, 'must be an integer in [1, 2147483647], got "16"');
  const missing = libraryRefusal(withField("head_size", undefined));
  assert.match(missing!.issues![0].message, /got undefined \(missing\)$/);
  const num = libraryRefusal(withField("dtype", 16));
  assert.equal(num?.issues?.[0].message, "must be one of float32, float16, bfloat16, got 16");
  const empty = libraryRefusal(withField("layout", ""));
  assert.equal(empty?.issues?.[0].message, 'must be one of NHD, HND, got ""');
});

Deno.test("cache spec enums: the same lists and messages on every path", () => {
  const cases: [Field, unknown[]][] = [
    ["dtype", ["float32", "bfloat16", "float64", "auto", "", 16, null, undefined]],
    ["kv_cache_dtype", ["auto", "fp8_e5m2", "float32", "int4", "", null]],
    ["layout", ["NHD", "HND", "nhd", "", 0, null]],
  ];
  for (const [f, values] of cases) for (const v of values) assertOneRule(f, v);
  // An unknown name is shown as itself: `got float64` (what HostKvCache's tests read).
  const e = libraryRefusal(withField("dtype", "float64"));
  assert.equal(e?.message, "dtype must be one of float32, float16, bfloat16, got float64");
});

Deno.test("cache spec: kv_cache_dtype and layout may be left out over HTTP only (defaults)", () => {
  for (const f of ["kv_cache_dtype", "layout"] as const) {
    assert.equal(httpIssue(withField(f, undefined)), null, `${f} left out over HTTP`);
    assert.deepEqual(libraryIssue(withField(f, undefined))?.path, [f]);
    assert.deepEqual(validatorIssue(withField(f, undefined))?.path, [f]);
  }
});

Deno.test("checkCacheSpec: every bad field in one 422, as the validator and the schema list them", () => {
  const s = { ...DECODE_SPEC, num_blocks: 0, dtype: "float64", layout: "XYZ" };
  const e = libraryRefusal(s);
  assert.deepEqual(e?.issues?.map((i) => i.path), [["num_blocks"], ["dtype"], ["layout"]]);
  assert.equal(e?.message, "num_blocks must be an integer in [1, 2147483647], got 0 (and 2 more)");
  const r = CreateCacheRequestSchema.safeParse(s);
  assert.equal(r.success ? 0 : r.error.issues.length, 3);
});

Deno.test("checkCacheSpec: a spec that is not an object is a 422 naming it, never a TypeError", () => {
  for (const bad of [null, undefined, 7, "spec", [1, 2]]) {
    const e = libraryRefusal(bad);
    assert.ok(e, `${String(bad)} was accepted`);
    assert.deepEqual(e.issues?.[0].path, []);
    assert.match(e.message, /^a KV cache spec must be an object/);
  }
});
