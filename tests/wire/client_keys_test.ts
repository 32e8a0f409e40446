/**
 * The client codec's hand-written field lists (wire/client_codec.ts CLIENT_BODY_KEYS) against
 * the request schemas they mirror: a field added to a schema and not to the codec would make
 * the client refuse (or drop) it on the safetensors transport while JSON carries it.
 */
import assert from "node:assert/strict";
import { CLIENT_BODY_KEYS } from "../../wire/client_codec.ts";
import {
  BinaryForwardRequestSchema,
  CacheTensorSchema,
  DataTensorSchema,
  ForwardRequestSchema,
  MetadataSchema,
} from "../../wire/request_schemas.ts";

const sorted = (x: readonly string[]) => [...x].sort();

Deno.test("client codec: the binary request's fields are BinaryForwardRequestSchema's", () => {
  assert.deepEqual(
    sorted(CLIENT_BODY_KEYS.request),
    sorted(Object.keys(BinaryForwardRequestSchema.shape)),
  );
});

Deno.test("client codec: the metadata's fields are MetadataSchema's", () => {
  assert.deepEqual(sorted(CLIENT_BODY_KEYS.metadata), sorted(Object.keys(MetadataSchema.shape)));
});

Deno.test("client codec: a tensor's fields are the data and cache tensors' schemas'", () => {
  assert.deepEqual(sorted(CLIENT_BODY_KEYS.tensor), sorted(Object.keys(DataTensorSchema.shape)));
  assert.deepEqual(sorted(CLIENT_BODY_KEYS.tensor), sorted(Object.keys(CacheTensorSchema.shape)));
});

Deno.test("client codec: a JSON forward body is the request fields, the tensors and metadata", () => {
  const known = [...CLIENT_BODY_KEYS.request, ...CLIENT_BODY_KEYS.float_tensors, "metadata"];
  assert.deepEqual(sorted(known), sorted(Object.keys(ForwardRequestSchema.shape)));
});
