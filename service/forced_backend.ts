/**
 * The backend a call forces: the name it gives, where that is not `auto` (absent or `auto`:
 * none, the selector chooses).
 * @module
 */

export const forced = (b?: string) => (b === undefined || b === "auto" ? undefined : b);
