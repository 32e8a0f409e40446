/**
 * The wire contract's request schemas: every zod schema a request body is validated against
 * (400 on a violation): the tensors, a layer, the metadata, the forward bodies (JSON and the
 * binary forward's JSON part), a backend selection and a cache create. Each schema with an `id`
 * becomes a named component of `/openapi.json`; import them through wire/schemas.ts, whose
 * order is the components' order.
 * @module
 */
import { z } from "zod";
import { CACHE_SPEC_RULES } from "../core/cache_spec.ts";
import {
  AttnTypeSchema,
  backendName,
  CacheIdSchema,
  dim,
  DTypeSchema,
  jsonNumber,
  KvCacheDTypeSchema,
  KvLayoutSchema,
  OutputEncodingSchema,
  posInt,
  sizeSchema,
} from "./field_schemas.ts";

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
