/**
 * A warning line on stderr, said once per process for each distinct text: for a configuration
 * that a call finds it cannot take (a named flash tile or tensor-core shape replaced), which
 * every later call would otherwise say again.
 * @module
 */

const said = new Set<string>();

/** Prints `warning: message` on stderr unless this process has said it already. */
export function warnOnce(message: string): void {
  if (said.has(message)) return;
  said.add(message);
  console.error(`warning: ${message}`);
}
