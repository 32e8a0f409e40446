/**
 * The wire contract's schemas: every zod schema a request body is validated against (400 on a
 * violation), every response body, the cache id and instance name rules, and the request and
 * response types, inferred from the schemas (`z.output` is what the server holds after parsing,
 * `z.input` what a client may send). Service, server, client and OpenAPI take them from here;
 * schemas with an `id` become named components of `/openapi.json`.
 *
 * The schemas live in wire/field_schemas.ts (the cache id, the enums and the field builders
 * shared by both sides), wire/request_schemas.ts and wire/response_schemas.ts; this module
 * gathers them. Import them from here: zod registers a schema with an `id` when its module runs,
 * and the order below (fields, then requests, then responses) is the order of the components in
 * `/openapi.json`.
 * @module
 */
export {
  AttnTypeSchema,
  CacheIdSchema,
  DTypeSchema,
  KvCacheDTypeSchema,
  KvLayoutSchema,
  OutputEncodingSchema,
} from "./field_schemas.ts";
export {
  BINARY_FORWARD_TENSORS,
  BinaryForwardRequestSchema,
  CacheTensorSchema,
  CreateCacheRequestSchema,
  DataTensorSchema,
  ForwardRequestSchema,
  IntTensorSchema,
  LayerSchema,
  MetadataSchema,
  SelectRequestSchema,
} from "./request_schemas.ts";
export {
  BackendInfoSchema,
  BackendsResponseSchema,
  CacheInfoSchema,
  DeviceReportSchema,
  ForwardResponseSchema,
  HealthResponseSchema,
  OutputTensorSchema,
  ProblemSchema,
  SelectResponseSchema,
} from "./response_schemas.ts";
