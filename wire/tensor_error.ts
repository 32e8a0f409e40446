/**
 * A tensor's defects as errors: the path a tensor sits at in the request, how a value is shown
 * in a message, and the 400 ServiceError (code `bad_tensor` unless told) that names the path.
 * Shared by the wire decoding (wire/tensors.ts) and the role decoders (wire/tensor_roles.ts).
 * @module
 */
import { type Issue, ServiceError } from "../core/errors.ts";
import { showValue } from "./zod_issues.ts";

/** Where a tensor (or one of its elements) sits in the request body, from its root. */
export type Path = (string | number)[];

/** A value for a message: non-finite numbers spelled (Infinity, not JSON's null). */
export const show = (v: unknown): string => showValue(v, 60);

/** The ServiceError for a defect at `path` (400; `code` bad_tensor unless told). */
export function fail(path: Path, message: string, code = "bad_tensor"): ServiceError {
  const issues: Issue[] = [{ path, message }];
  return new ServiceError(`${path.join(".")}: ${message}`, { status: 400, code, issues });
}
