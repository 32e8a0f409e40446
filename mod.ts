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
 * @module
 */

export type {
  AttentionBackend,
  AttnType,
  BackendContext,
  BatchMetadata,
  CacheStorage,
  Capabilities,
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
  SelectorConfig,
  StorageDType,
} from "./core/types.ts";
export {
  DeviceUnavailableError,
  type Issue,
  NoValidBackendError,
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
  createRequestOf,
  type ForwardAnswer,
  type PutCacheResult,
} from "./client/client.ts";
export type {
  CacheInfo,
  CreateCacheRequest,
  ForwardBody,
  ForwardResponse,
  ProblemDocument,
  SelectRequest,
  SelectResult,
} from "./wire/types.ts";
