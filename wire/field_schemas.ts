/**
 * The wire contract's field schemas, shared by requests and responses: the cache id, the enums
 * (dtype, KV-cache dtype, attention type, layout, output encoding), and the builders of fields
 * from core/cache_spec.ts's rules, of JSON numbers and of backend names. Each schema with an `id`
 * becomes a named component of `/openapi.json`; import them through wire/schemas.ts, whose
 * order is the components' order.
 * @module
 */
import { z } from "zod";
import {
  CACHE_SPEC_RULES,
  type EnumRule,
  INT32_MAX,
  ruleText,
  type SizeRule,
  SPEC_SIZE_RULE,
} from "../core/cache_spec.ts";
import { ATTN_TYPES } from "../core/types.ts";
import { CACHE_ID_PATTERN, CACHE_ID_RULE } from "./names.ts";

/** A cache id (path parameter `{id}`, the body field `kv_cache`). */
export const CacheIdSchema = z.string().regex(CACHE_ID_PATTERN, {
  error: `must be ${CACHE_ID_RULE}`,
}).meta({ id: "CacheId", description: `${CACHE_ID_RULE}.` });

/** An integer of a size rule (core/cache_spec.ts), refused in the rule's words. */
export function sizeSchema(rule: SizeRule) {
  const error = ruleText(rule);
  return z.int({ error }).min(rule.min, { error }).max(rule.max, { error });
}

/** A name of an enum rule (core/cache_spec.ts), refused in the rule's words. */
const enumSchema = <T extends string>(rule: EnumRule<T>) =>
  z.enum(rule.values, { error: ruleText(rule) });

/** A size or count >= 1: the rule of a cache spec's sizes. */
export const posInt = () => sizeSchema(SPEC_SIZE_RULE);
export const dim = () => z.int().min(0).max(INT32_MAX);

/** A data dtype. */
export const DTypeSchema = enumSchema(CACHE_SPEC_RULES.dtype).meta({ id: "DType" });
/** A configured KV-cache dtype. */
export const KvCacheDTypeSchema = enumSchema(CACHE_SPEC_RULES.kv_cache_dtype).meta({
  id: "KvCacheDType",
});
/** An attention type. */
export const AttnTypeSchema = z.enum(ATTN_TYPES).meta({ id: "AttnType" });
/** A paged-cache layout. */
export const KvLayoutSchema = enumSchema(CACHE_SPEC_RULES.layout).meta({ id: "KvLayout" });
/** How tensors of a JSON response are encoded. */
export const OutputEncodingSchema = z.enum(["data", "base64"]).meta({ id: "OutputEncoding" });

/**
 * A JSON number, any value JSON.parse gives: a literal beyond float64 (`1e400`) parses as
 * Infinity, which `z.number()` refuses with a 400; taking it lets validation answer what it
 * answers for the same value as bytes (422 `invalid_batch` naming the tensor and the index).
 * Checks nothing else per element, so it is also cheaper than `z.number()` over large arrays.
 */
export const jsonNumber = (type: "number" | "integer") =>
  z.custom<number>(
    (x) => typeof x === "number",
    { message: "expected a number" },
  ).meta({ type });

/** A backend name in a request: "auto" or a registered name (UPPER_SNAKE, short). */
export const backendName = () => z.string().min(1).max(64);
