/**
 * The NaN/infinity checks of validation (service/validate.ts): each data tensor's first
 * non-finite element, named in its own dtype and the call's, and the host scan of a batch
 * whose scan was left to the device ({@link checkFiniteOnHost}).
 * @module
 */
import { elementAt, firstNonFinite, firstNonFiniteIn, nonFiniteMessage } from "../core/data.ts";
import type { DataTensor } from "../wire/tensors.ts";
import type { DataArray, ValidBatch } from "../core/types.ts";
import { Issues } from "./validate_layer.ts";
import type { UnattachedBatch } from "./validate_types.ts";

/**
 * Adds an issue for the first NaN or infinity of `a` (from element `from` on: elements before
 * it are left to the device's check).
 */
function checkFinite(a: DataArray | null, name: string, is: Issues, from = 0): void {
  if (!a) return;
  const bad = from === 0 ? firstNonFinite(a) : firstNonFiniteIn(a, from, a.length);
  if (bad >= 0) {
    is.add([name, bad], nonFiniteMessage(a, bad));
  }
}

/**
 * Adds an issue for the first NaN or infinity of a data tensor `t`, `a` its elements in the
 * call's dtype. It is named in the tensor's own dtype, with the JSON number sent where that
 * overflowed it ("element 0 is 70000, which overflows float16"); a tensor converted to the
 * call's dtype is scanned whole in both, an element finite in its own dtype but not in the
 * call's named in both. With `from` > 0 (the scan left to the device) only `a`'s elements from
 * `from` on are scanned here, as {@link checkFinite} does.
 */
export function checkDataFinite(
  t: DataTensor | undefined,
  a: DataArray | null,
  name: string,
  is: Issues,
  from = 0,
): void {
  if (!t || !a) return;
  if (from > 0) return checkFinite(a, name, is, from);
  const own = t.array;
  const bad = firstNonFinite(own);
  if (bad >= 0) {
    const o = t.overflow;
    is.add(
      [name, bad],
      o?.index === bad
        ? `element ${bad} is ${o.value}, which overflows ${t.dtype} (${
          elementAt(own, bad)
        }): tensors must be finite`
        : nonFiniteMessage(own, bad),
    );
    return;
  }
  if (a === own) return;
  const lost = firstNonFinite(a);
  if (lost >= 0) {
    is.add(
      [name, lost],
      `element ${lost} is ${elementAt(own, lost)} in ${t.dtype}, ${
        elementAt(a, lost)
      } in ${a.dtype} (the call's dtype): tensors must be finite`,
    );
  }
}

/**
 * The host scan of a validated batch's data that {@link validateForward} left to the device
 * (`finite_deferred`), for a plan that does not check on the device after all.
 * @throws ServiceError 422 `invalid_batch` naming each tensor's first non-finite element.
 */
export function checkFiniteOnHost(b: UnattachedBatch | ValidBatch): void {
  const is = new Issues();
  checkFinite(b.query, "query", is);
  checkFinite(b.key, "key", is);
  checkFinite(b.value, "value", is);
  is.throwIfAny();
}
