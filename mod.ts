/**
 * Batched paged attention as a library and a REST service: vLLM-style backend registry and
 * selector, a float64 CPU reference backend, WebGPU (WGSL) backends, the HTTP handler, and a
 * typed client for other services.
 *
 * Select a backend for a configuration, and see why the others were passed over:
 *
 * @example
 * ```ts
 * import { BackendRegistry, builtinBackends, selectorConfigDefaults } from "./mod.ts";
 *
 * const registry = new BackendRegistry(builtinBackends(), () => null); // no GPU here
 * const choice = registry.select(selectorConfigDefaults({ head_size: 128, dtype: "float16" }));
 * console.log(choice.backend.name, choice.block_size, choice.rejected);
 * ```
 *
 * Serve the API in-process and call it with the client:
 *
 * @example
 * ```ts
 * import { AttentionClient, AttentionService, builtinBackends, createHandler, NoDeviceProvider } from "./mod.ts";
 *
 * const service = new AttentionService({
 *   backends: builtinBackends(),
 *   device: new NoDeviceProvider("example without a GPU"),
 *   memoryBudgetBytes: 64 << 20,
 * });
 * const server = Deno.serve({ port: 0, onListen() {} }, createHandler(service));
 * const client = new AttentionClient(`http://127.0.0.1:${server.addr.port}`);
 * console.log(await client.health());
 * await server.shutdown();
 * ```
 * Validate a host batch once and run it on a backend (plans are built from the batch's shape
 * alone; the output comes back in the batch dtype):
 *
 * @example
 * ```ts
 * import { CPU_REFERENCE, HostKvCache, toFloat32, validHostBatch } from "./mod.ts";
 *
 * const spec = {
 *   num_blocks: 2, block_size: 16, num_kv_heads: 1, head_size: 4,
 *   dtype: "float32" as const, kv_cache_dtype: "auto" as const, layout: "NHD" as const,
 * };
 * const cache = HostKvCache.create(spec);
 * const batch = validHostBatch({
 *   dtype: "float32",
 *   layer: {
 *     num_heads: 2, num_kv_heads: 1, head_size: 4, scale: 0.5, sliding_window: null,
 *     logits_soft_cap: null, alibi_slopes: null, sinks: null, attn_type: "decoder",
 *     causal: true, k_scale: 1, v_scale: 1,
 *   },
 *   num_tokens: 1,
 *   query: new Float32Array([1, 0, 0, 0, 0, 1, 0, 0]),
 *   key: new Float32Array([1, 2, 3, 4]),
 *   value: new Float32Array([5, 6, 7, 8]),
 *   metadata: {
 *     num_reqs: 1, query_start_loc: Int32Array.of(0, 1), seq_lens: Int32Array.of(1),
 *     block_table: Int32Array.of(1), max_blocks_per_req: 1, slot_mapping: Int32Array.of(16),
 *   },
 *   return_lse: false,
 * }, cache);
 * const ctx = { gpu: null };
 * const r = await CPU_REFERENCE.run(await CPU_REFERENCE.plan(batch, ctx), batch, ctx);
 * console.log(toFloat32(r.output)); // one visible key: the output is its value row, twice
 * await CPU_REFERENCE.close();
 * ```
 * @module
 */

export type {
  AttentionBackend,
  AttnType,
  BackendContext,
  BatchMetadata,
  BatchShape,
  BatchStats,
  CacheStorage,
  Capabilities,
  DataArray,
  DeviceProvider,
  DeviceReport,
  DeviceRequirements,
  DType,
  ForwardBatch,
  ForwardResult,
  GpuContext,
  GraphSupport,
  KernelBlockSize,
  KvCache,
  KvCacheDType,
  KvCacheSpec,
  KvLayout,
  LayerSpec,
  MultipleOf,
  RunOptions,
  SelectorConfig,
  StorageDType,
  ValidBatch,
} from "./core/types.ts";
export { dataArray, fromFloats, hostBatch, toFloat32 } from "./core/data.ts";
export { HostKvCache } from "./backends/cpu/host_cache.ts";
export { validateHostBatch, validHostBatch } from "./service/host_input.ts";
export {
  attachCache,
  type CallLimits,
  DEFAULT_CALL_LIMITS,
  type ForwardInput,
  validateForward,
} from "./service/validate.ts";
export { PlanCache } from "./service/plan_cache.ts";
export {
  ClientClosedError,
  DeviceUnavailableError,
  type Issue,
  NoValidBackendError,
  QueueTimeoutError,
  ServiceError,
  ShaderCompileError,
} from "./core/errors.ts";
export {
  preferredBlockSize,
  supportsBlockSize,
  validateConfiguration,
} from "./backends/capabilities.ts";
export {
  type BackendInfo,
  BackendRegistry,
  type SelectionResult,
  selectorConfigDefaults,
} from "./backends/registry.ts";
export { builtinBackends } from "./backends/index.ts";
export { CPU_REFERENCE } from "./backends/cpu/cpu_reference.ts";
export { NoDeviceProvider, WebGpuDeviceManager } from "./gpu/device.ts";
export { AttentionService, type AttentionServiceOptions } from "./service/service.ts";
export { createHandler, type Handler, type HandlerOptions } from "./server/handler.ts";
export {
  AttentionApiError,
  AttentionClient,
  type CacheContents,
  type CacheData,
  type ClientOptions,
  createRequestOf,
  type ForwardAnswer,
  type ForwardOptions,
  type PutCacheResult,
} from "./client/client.ts";
export type {
  BackendDescription,
  CacheInfo,
  CreateCacheRequest,
  DeviceInfo,
  ForwardBody,
  ForwardResponse,
  HealthResponse,
  ProblemDocument,
  SelectRequest,
  SelectResult,
} from "./wire/types.ts";
