/**
 * The wire contract's schemas: every zod schema a request body is validated against (400 on a
 * violation), every response body, the cache id and instance name rules, and the request and
 * response types, inferred from the schemas (`z.output` is what the server holds after parsing,
 * `z.input` what a client may send). Service, server, client and OpenAPI take them from here; schemas with an `id`
 * become named components of `/openapi.json`.
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
function sizeSchema(rule: SizeRule) {
  const error = ruleText(rule);
  return z.int({ error }).min(rule.min, { error }).max(rule.max, { error });
}

/** A name of an enum rule (core/cache_spec.ts), refused in the rule's words. */
const enumSchema = <T extends string>(rule: EnumRule<T>) =>
  z.enum(rule.values, { error: ruleText(rule) });

/** A size or count >= 1: the rule of a cache spec's sizes. */
const posInt = () => sizeSchema(SPEC_SIZE_RULE);
const dim = () => z.int().min(0).max(INT32_MAX);

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
const jsonNumber = (type: "number" | "integer") =>
  z.custom<number>(
    (x) => typeof x === "number",
    { message: "expected a number" },
  ).meta({ type });

/** A backend name in a request: "auto" or a registered name (UPPER_SNAKE, short). */
const backendName = () => z.string().min(1).max(64);

function tensor(
  dtypes: readonly [string, ...string[]],
  id: string,
  description: string,
  element: "number" | "integer" = "number",
) {
  return z.strictObject({
    dtype: z.enum(dtypes),
    shape: z.array(dim()).max(8),
    data: z.array(jsonNumber(element)).optional().describe("Values, row-major."),
    base64: z.string().optional().describe("Raw little-endian bytes of the dtype, base64."),
  }).superRefine((t, ctx) => {
    if ((t.data === undefined) === (t.base64 === undefined)) {
      ctx.addIssue({
        code: "custom",
        message: `give exactly one of data or base64 (got ${
          t.data === undefined ? "neither" : "both"
        })`,
        path: [],
      });
    }
  }).meta({
    id,
    description,
    // The refinement above, for the document: exactly one of the two.
    oneOf: [{ required: ["data"] }, { required: ["base64"] }],
  });
}

/** query / key / value. */
export const DataTensorSchema = tensor(
  ["float32", "float16", "bfloat16", "F32", "F16", "BF16"],
  "DataTensor",
  "An activation tensor; values are rounded to the request dtype.",
);
/** key_cache / value_cache. */
export const CacheTensorSchema = tensor(
  [
    "float32",
    "float16",
    "bfloat16",
    "fp8_e4m3",
    "fp8_e5m2",
    "F32",
    "F16",
    "BF16",
    "F8_E4M3",
    "F8_E5M2",
  ],
  "CacheTensor",
  "A paged cache in its storage dtype, shaped by kv_cache_layout.",
);
/** An integer tensor or a plain (nested) JSON array of integers. */
export const IntTensorSchema = z.union([
  tensor(["int32", "int64", "I32", "I64"], "IntTensorObject", "An integer tensor.", "integer"),
  // Any JSON number, as in an integer tensor's `data`: the decoder refuses a non-integer (400)
  // and a value outside int32 (422) in the same words for both forms (wire/tensors.ts).
  z.array(z.union([jsonNumber("integer"), z.array(jsonNumber("integer"))])).describe(
    "A plain array (2-D for block_table).",
  ),
]).meta({ id: "IntTensor" });

/**
 * A layer's float value: any JSON number, as a tensor's `data` element. One beyond float64
 * (`1e400`, which parses as Infinity) is a value the layer's rules refuse with a 422 naming it
 * (service/validate_layer.ts: finite as a float32), as in tensor data, not a type error.
 */
const layerNumber = () => jsonNumber("number");

/** A layer's attention parameters. */
export const LayerSchema = z.strictObject({
  num_heads: posInt(),
  num_kv_heads: posInt(),
  head_size: posInt(),
  scale: layerNumber().nullable().optional().describe("Default 1/sqrt(head_size); finite > 0."),
  sliding_window: z.int().nullable().optional().describe("Integer >= 1, or null for none."),
  logits_soft_cap: layerNumber().nullable().optional().describe("> 0, or null for none."),
  alibi_slopes: z.array(layerNumber()).nullable().optional().describe("[num_heads]"),
  sinks: z.array(layerNumber()).nullable().optional().describe("[num_heads]"),
  attn_type: AttnTypeSchema.optional().describe("Default decoder."),
  causal: z.boolean().optional().describe("Default true for decoder, false otherwise."),
  k_scale: layerNumber().optional().describe("fp8 key dequant scale, default 1."),
  v_scale: layerNumber().optional().describe("fp8 value dequant scale, default 1."),
}).meta({ id: "Layer" });

/** vLLM's CommonAttentionMetadata. */
export const MetadataSchema = z.strictObject({
  query_start_loc: IntTensorSchema,
  seq_lens: IntTensorSchema,
  block_table: IntTensorSchema.optional().describe(
    "[num_reqs, max_blocks_per_req]; optional for encoder types.",
  ),
  slot_mapping: IntTensorSchema.optional().describe(
    "[num_kv_tokens]; -1 = padding; optional for encoder types.",
  ),
}).meta({ id: "Metadata" });

const forwardCommon = {
  backend: backendName().optional().describe('"auto" (default) or a backend name.'),
  dtype: DTypeSchema,
  layer: LayerSchema,
  kv_cache: CacheIdSchema.optional().describe(
    "Id of a server-held cache. On POST /v1/kv-caches/{id}/forward: absent, or the path's id.",
  ),
  kv_cache_layout: KvLayoutSchema.optional().describe("Layout of inline caches (default NHD)."),
  return_lse: z.boolean().optional(),
  output_encoding: OutputEncodingSchema.optional().describe(
    "JSON responses: data or base64 (default: as the query came).",
  ),
};

/** `POST /v1/attention/forward` JSON body. */
export const ForwardRequestSchema = z.strictObject({
  ...forwardCommon,
  query: DataTensorSchema,
  key: DataTensorSchema.optional(),
  value: DataTensorSchema.optional(),
  metadata: MetadataSchema,
  key_cache: CacheTensorSchema.optional(),
  value_cache: CacheTensorSchema.optional(),
}).meta({ id: "ForwardRequest" });

/** The `request` entry of a binary (safetensors) forward's `__metadata__`, as JSON. */
export const BinaryForwardRequestSchema = z.strictObject(forwardCommon).meta({
  id: "BinaryForwardRequest",
});

/** Names of the tensors a binary forward may carry. */
export const BINARY_FORWARD_TENSORS = [
  "query",
  "key",
  "value",
  "key_cache",
  "value_cache",
  "query_start_loc",
  "seq_lens",
  "block_table",
  "slot_mapping",
] as const;

/** `POST /v1/backends/select`: vLLM's selector config (plus extensions). */
export const SelectRequestSchema = z.strictObject({
  head_size: posInt(),
  dtype: DTypeSchema,
  kv_cache_dtype: KvCacheDTypeSchema.optional(),
  block_size: posInt().nullable().optional(),
  use_mla: z.boolean().optional(),
  has_sink: z.boolean().optional(),
  use_sparse: z.boolean().optional(),
  use_mm_prefix: z.boolean().optional(),
  attn_type: AttnTypeSchema.optional(),
  has_sliding_window: z.boolean().optional(),
  use_non_causal: z.boolean().optional(),
  use_batch_invariant: z.boolean().optional(),
  use_per_head_quant_scales: z.boolean().optional(),
  use_alibi: z.boolean().optional(),
  use_logits_soft_cap: z.boolean().optional(),
  kv_cache_layout: KvLayoutSchema.optional(),
  return_lse: z.boolean().optional(),
  cache_storage: z.enum(["host", "webgpu"]).optional(),
  max_query_len: dim().optional(),
  backend: backendName().optional().describe('Force one backend ("auto" = none).'),
}).meta({ id: "SelectRequest" });

/** `POST /v1/kv-caches`: a cache spec, each field by its rule in core/cache_spec.ts. */
export const CreateCacheRequestSchema = z.strictObject({
  num_blocks: sizeSchema(CACHE_SPEC_RULES.num_blocks),
  block_size: sizeSchema(CACHE_SPEC_RULES.block_size),
  num_kv_heads: sizeSchema(CACHE_SPEC_RULES.num_kv_heads),
  head_size: sizeSchema(CACHE_SPEC_RULES.head_size),
  dtype: DTypeSchema,
  kv_cache_dtype: KvCacheDTypeSchema.optional().describe("Default auto (= dtype)."),
  layout: KvLayoutSchema.optional().describe("Default NHD."),
  backend: backendName().optional().describe(
    '"auto" (default) or a backend name: the backend the cache is made for, whose storage it ' +
      "gets (host or GPU) and which CacheInfo names. Forward calls pick their own backend " +
      "(`backend` in their body), any that reads that storage.",
  ),
}).meta({ id: "CreateCacheRequest" });

// ---- responses ----

/** `GET /healthz`. */
export const HealthResponseSchema = z.object({
  status: z.literal("ok"),
  instance: z.string().optional().describe("The server's --instance-name, when it has one."),
}).meta({ id: "Health" });

const SubgroupMatrixConfigSchema = z.object({
  component_type: z.string(),
  result_component_type: z.string(),
  m: z.int(),
  n: z.int(),
  k: z.int(),
});

const AdapterInfoSchema = z.looseObject({
  vendor: z.string(),
  vendor_name: z.string().optional().describe("the vendor's name where vendor is a PCI id"),
  architecture: z.string(),
  device: z.string(),
  description: z.string(),
  subgroup_min_size: z.int().optional(),
  subgroup_max_size: z.int().optional(),
  is_fallback_adapter: z.boolean().optional(),
  subgroup_matrix_configs: z.array(SubgroupMatrixConfigSchema).optional().describe(
    "Dawn's chromium-experimental-subgroup-matrix configurations",
  ),
});

const RuntimeProbeSchema = z.object({
  available: z.boolean().describe("it loads and finds an adapter here"),
  version: z.string().optional(),
  flags: z.array(z.string()).optional(),
  backend_api: z.string().optional(),
  reason: z.string().optional().describe("why it is unavailable, or why it was not chosen"),
  adapter: AdapterInfoSchema.optional(),
});

/** `GET /v1/device`. */
export const DeviceReportSchema = z.object({
  available: z.boolean(),
  runtime: z.string().describe('"deno" (navigator.gpu), "dawn" (npm webgpu) or "none"'),
  runtime_version: z.string().optional().describe("Deno's version, or the npm package's"),
  runtime_flags: z.array(z.string()).optional().describe("Dawn's create() flags"),
  selection: z.string().optional().describe("what was asked (deno, dawn, auto) and why"),
  backend_api: z.string().optional().describe("vulkan, gl, metal, d3d12..."),
  backend_api_source: z.string().optional(),
  reason: z.string().optional(),
  adapter: AdapterInfoSchema.optional(),
  features: z.array(z.string()),
  limits: z.record(z.string(), z.number()),
  generation: z.int(),
  readback: z.enum(["early", "awaited"]).optional().describe(
    "how results are read back: early = as soon as the GPU is done (Deno's runtime, whose " +
      "mapAsync promise waits out a 10 ms sleep); awaited = when mapAsync resolves",
  ),
  readback_deferred: z.boolean().optional().describe(
    "whether an early read waits one turn so that other ready calls' host work runs first " +
      "(ATTN_DEFER_READ)",
  ),
  warnings: z.array(z.string()).optional(),
  other_runtimes: z.record(z.string(), RuntimeProbeSchema).optional().describe(
    "the runtimes not chosen, probed for an adapter (never a device)",
  ),
  keep_warm: z.object({
    enabled: z.boolean(),
    reason: z.string().optional().describe("why it is off although it was asked for"),
    options: z.object({
      hold_ms: z.int(),
      spin_iters: z.int(),
      workgroups: z.int(),
      depth: z.int(),
    }),
    round_trip_ms: z.number().optional().describe("the completion round trip measured at start"),
    dispatches: z.int().describe("spin dispatches submitted so far"),
    spinning: z.boolean(),
  }).optional().describe("keep-warm spins between calls (--keep-warm-ms), when asked for"),
}).meta({ id: "DeviceReport" });

/** One backend in `GET /v1/backends`. */
export const BackendInfoSchema = z.looseObject({
  name: z.string(),
  priority: z.number(),
  available: z.boolean(),
  unavailable_reasons: z.array(z.string()).optional(),
  capabilities: z.looseObject({
    dtypes: z.array(DTypeSchema),
    kv_cache_dtypes: z.array(KvCacheDTypeSchema),
    block_sizes: z.array(z.union([z.int(), z.object({ multiple_of: z.int() })])),
    head_sizes: z.array(z.int()),
    kv_cache_layouts: z.array(KvLayoutSchema),
    attn_types: z.array(AttnTypeSchema),
  }),
}).meta({ id: "BackendInfo" });

/** `GET /v1/backends`. */
export const BackendsResponseSchema = z.object({ backends: z.array(BackendInfoSchema) }).meta({
  id: "Backends",
});

/** `POST /v1/backends/select` 200. */
export const SelectResponseSchema = z.object({
  backend: z.string(),
  block_size: z.int(),
  rejected: z.record(z.string(), z.array(z.string())).describe(
    "Backends passed over before the winner (auto selection, vLLM's order), with every reason.",
  ),
  unsupported: z.record(z.string(), z.array(z.string())).describe(
    "The other backends that cannot run the configuration either (after the winner, or beside " +
      "a forced one), with every reason; a backend in neither map could run it.",
  ),
}).meta({ id: "SelectResponse" });

/** A server-held cache (`POST /v1/kv-caches` 201, `GET /v1/kv-caches/{id}`). */
export const CacheInfoSchema = z.object({
  id: CacheIdSchema,
  num_blocks: z.int(),
  block_size: z.int(),
  num_kv_heads: z.int(),
  head_size: z.int(),
  dtype: DTypeSchema,
  kv_cache_dtype: KvCacheDTypeSchema,
  layout: KvLayoutSchema,
  bytes: z.int(),
  storage: z.enum(["host", "webgpu"]),
  storage_dtype: z.enum(["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]),
  backend: z.string(),
  lost: z.boolean(),
  created_at: z.string(),
}).meta({ id: "CacheInfo" });

/** An output tensor. */
export const OutputTensorSchema = z.object({
  dtype: z.string(),
  shape: z.array(z.int()),
  data: z.array(z.number().nullable()).optional().describe(
    "Values, row-major; non-finite values (e.g. the lse of a row with no visible key) are null.",
  ),
  base64: z.string().optional(),
}).meta({ id: "OutputTensor" });

/** `POST /v1/attention/forward` 200 (JSON). */
export const ForwardResponseSchema = z.object({
  backend: z.string(),
  output: OutputTensorSchema.describe("[num_tokens, num_heads, head_size] in the request dtype."),
  lse: OutputTensorSchema.optional().describe("[num_heads, num_tokens] float32."),
  timings: z.record(z.string(), z.number()).optional().describe("Milliseconds by phase."),
}).meta({ id: "ForwardResponse" });

/** RFC 9457 problem document (extension fields such as `cache_id` or `limit` may follow). */
export const ProblemSchema = z.looseObject({
  type: z.string(),
  title: z.string(),
  status: z.int(),
  detail: z.string(),
  code: z.string(),
  instance: z.string().optional(),
  issues: z.array(
    z.object({ path: z.array(z.union([z.string(), z.number()])), message: z.string() }),
  )
    .optional(),
  reasons: z.record(z.string(), z.array(z.string())).optional(),
  retryable: z.boolean().optional().describe(
    "On a 503: false where retrying cannot help (a forced GPU backend on a server with no " +
      "device by configuration, --no-gpu; sent without Retry-After); true on a queue_timeout " +
      "(Retry-After: 0).",
  ),
  queue_timeout_ms: z.number().optional().describe(
    "queue_timeout: the call's X-Attention-Queue-Timeout-Ms.",
  ),
  waited_ms: z.number().optional().describe(
    "queue_timeout: how long the call had waited when it was refused.",
  ),
  retry_after_s: z.int().optional().describe("A 503's Retry-After, in seconds, where it says."),
  header: z.string().optional().describe("invalid_header: the request header refused."),
  value: z.union([z.string(), z.number()]).optional().describe(
    "invalid_header: the header's value (64 characters at most); limit_exceeded: the call's count.",
  ),
}).meta({ id: "Problem" });
