/**
 * The pieces the OpenAPI document's paths are written with (server/openapi.ts): a schema
 * `$ref` and a JSON content of one, a problem answer and the problem answers of given statuses
 * (their text by status), the safetensors content, the cache id and queue timeout parameters,
 * a cache's answer, and the forward routes' shared body and answers.
 * @module
 */
import { QUEUE_TIMEOUT_HEADER } from "../wire/names.ts";

const ref = (id: string) => ({ $ref: `#/components/schemas/${id}` });
export const json = (id: string) => ({ "application/json": { schema: ref(id) } });
export const problem = (description: string) => ({
  description,
  content: { "application/problem+json": { schema: ref("Problem") } },
});
const ERROR_TEXT: Record<number, string> = {
  400: "Malformed body, schema violation or invalid cache id (issues name each field and " +
    "value), or a header refused (invalid_header: header and value)",
  404: "Unknown cache or backend",
  408: "The body stopped coming (--body-timeout-ms)",
  409: "The cache exists with another spec",
  413: "Body over the limit",
  406: "Accept takes neither answer (application/json, application/octet-stream); nothing ran",
  415: "Unsupported content type",
  422: "Parses but cannot run",
  499: "The client went away before the call ran (nobody reads it; logs and metrics do)",
};
export const errors = (...codes: number[]) =>
  Object.fromEntries(codes.map((c) => [String(c), problem(ERROR_TEXT[c])]));
export const safetensors = {
  "application/octet-stream": {
    schema: {
      type: "string",
      contentMediaType: "application/octet-stream",
      description: "A safetensors file.",
    },
  },
};
export const idParam = [{ name: "id", in: "path", required: true, schema: ref("CacheId") }];
/** The forward routes' queue timeout (core/queue_timeout.ts). */
export const queueTimeoutParam = {
  name: QUEUE_TIMEOUT_HEADER,
  in: "header",
  required: false,
  description: "The most ms the call may wait to start once its body arrived (behind earlier " +
    "calls on its cache, for the device); past it: 503 queue_timeout, the call did not run and " +
    "wrote nothing. A plain decimal above 0 and at most 2147483647; another value is a 400 " +
    "invalid_header.",
  schema: { type: "string", pattern: "^\\d+(\\.\\d+)?$", examples: ["20", "0.5"] },
};
export const cacheInfo = (description: string) => ({ description, content: json("CacheInfo") });

export const forwardBody = {
  required: true,
  content: { ...json("ForwardRequest"), ...safetensors },
};
export const forwardResponses = {
  "200": { description: "Output", content: { ...json("ForwardResponse"), ...safetensors } },
  ...errors(400, 404, 406, 408, 413, 415, 422, 499),
};
