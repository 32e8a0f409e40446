/**
 * The wire contract's response schemas: every response body (health, device report, backends,
 * a selection, a cache, a forward's output) and the RFC 9457 problem document. Each schema with
 * an `id` becomes a named component of `/openapi.json`; import them through wire/schemas.ts,
 * whose order is the components' order.
 * @module
 */
import { z } from "zod";
import {
  AttnTypeSchema,
  CacheIdSchema,
  DTypeSchema,
  KvCacheDTypeSchema,
  KvLayoutSchema,
} from "./field_schemas.ts";

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
