/**
 * The wire contract's types, every one inferred from its zod schema in wire/schemas.ts (the
 * schemas are their single source): `z.output` is what the server holds after parsing, `z.input`
 * what a client may send.
 * @module
 */
import type { z } from "zod";
import type {
  BackendInfoSchema,
  BinaryForwardRequestSchema,
  CacheInfoSchema,
  CreateCacheRequestSchema,
  DeviceReportSchema,
  ForwardRequestSchema,
  ForwardResponseSchema,
  HealthResponseSchema,
  LayerSchema,
  OutputTensorSchema,
  ProblemSchema,
  SelectRequestSchema,
  SelectResponseSchema,
} from "./schemas.ts";

/** A JSON forward body as the server holds it after parsing. */
export type ForwardRequest = z.output<typeof ForwardRequestSchema>;
/** A JSON forward body as a client writes it. */
export type ForwardBody = z.input<typeof ForwardRequestSchema>;
/** A layer's parameters as the request gives them (defaults not yet applied). */
export type LayerInput = z.output<typeof LayerSchema>;
/** The binary forward's JSON part (`__metadata__.request`). */
export type BinaryForwardRequest = z.output<typeof BinaryForwardRequestSchema>;
/** A select body (vLLM's selector config, partial, plus `backend`). */
export type SelectRequest = z.input<typeof SelectRequestSchema>;
/** A create-cache body (`POST /v1/kv-caches`, `PUT /v1/kv-caches/{id}`). */
export type CreateCacheRequest = z.output<typeof CreateCacheRequestSchema>;

/** `GET /healthz`. */
export type HealthResponse = z.output<typeof HealthResponseSchema>;
/** `GET /v1/device`. */
export type DeviceInfo = z.output<typeof DeviceReportSchema>;
/** One backend of `GET /v1/backends`. */
export type BackendDescription = z.output<typeof BackendInfoSchema>;
/** `POST /v1/backends/select` 200. */
export type SelectResult = z.output<typeof SelectResponseSchema>;
/** A server-held cache's spec and state. */
export type CacheInfo = z.output<typeof CacheInfoSchema>;
/** An output tensor of a JSON forward answer. */
export type OutputTensor = z.output<typeof OutputTensorSchema>;
/** A JSON forward answer. */
export type ForwardResponse = z.output<typeof ForwardResponseSchema>;
/** An RFC 9457 problem document with this service's extension fields. */
export type ProblemDocument = z.output<typeof ProblemSchema>;
