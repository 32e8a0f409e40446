/**
 * The safetensors file format: an 8-byte little-endian u64 header length, a JSON header
 * `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {key: string}}`, then
 * the data bytes (offsets are relative to the start of the data). Parsing is strict: every
 * defect is a ServiceError 400 `bad_safetensors` whose message says what and where, with an
 * issue per bad field (`[tensor, "dtype" | "shape" | "data_offsets"]`, `["__metadata__", key]`,
 * `["header_length"]`, `["header"]`, `["data"]` for bytes after the last tensor), naming the value.
 *
 * This module gathers the format's exports in one place: the dtypes and types live in
 * core/safetensors_format.ts, parsing in core/safetensors_parse.ts, writing in
 * core/safetensors_write.ts.
 * @module
 */
export {
  numel,
  SAFETENSORS_DTYPE_BYTES,
  SAFETENSORS_DTYPES,
  type SafetensorsDType,
  type SafetensorsFile,
  type SafetensorsTensor,
} from "./safetensors_format.ts";
export {
  MAX_SAFETENSORS_HEADER_BYTES,
  type ParseOptions,
  parseSafetensors,
} from "./safetensors_parse.ts";
export {
  concatBytes,
  safetensorsHead,
  safetensorsParts,
  serializeSafetensors,
} from "./safetensors_write.ts";
