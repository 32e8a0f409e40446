/**
 * Captures what native code prints on stderr (file descriptor 2) during one synchronous call.
 *
 * Dawn says why it found no adapter only by printing a warning (for example "Vulkan
 * shaderUniform*ArrayDynamicIndexing required") while `requestAdapter()` enumerates adapters,
 * which it does synchronously inside the call. This points fd 2 at an anonymous temporary
 * file (libc `tmpfile`) for that call, puts it back, and returns the text. It uses FFI, which
 * Dawn's Node-API addon needs anyway (`--allow-ffi`); where FFI or libc is not at hand
 * (Windows, no permission) the call runs uncaptured and `captured` is false.
 *
 * fd 2 belongs to the process, not the thread: two threads capturing at once would each save
 * and restore the other's redirection, and fd 2 could end up pointing at a closed temporary
 * file (every later line of stderr lost: seen with `--device-threads 2 --webgpu-runtime dawn`,
 * whose exit-2 reason never showed). Threads that may capture share one lock
 * ({@link stderrLock}, {@link useStderrLock}); a capture then waits for another's to end, and
 * the console of every thread that took the lock prints under it, so that a line one thread
 * logs while another captures is not swallowed into the capture (with `--device-threads 2` on
 * Dawn a thread's device line went missing that way). Native code of another thread printing
 * during a capture still lands in its text.
 * @module
 */

let lock: Int32Array | null = null;
/** This thread holds the lock (a print inside a capture goes straight out, into it). */
let held = false;

/** A new lock for the threads of one process to share (pass it to each, {@link useStderrLock}). */
export function stderrLock(): SharedArrayBuffer {
  return new SharedArrayBuffer(4);
}

/**
 * This thread's captures take `sab`'s lock (the same buffer in every thread of the process
 * that captures or prints), and its console prints under it. Idempotent for one buffer.
 */
export function useStderrLock(sab: SharedArrayBuffer): void {
  if (lock?.buffer === sab) return;
  const first = lock === null;
  lock = new Int32Array(sab);
  if (!first) return;
  const c = console as unknown as Record<string, (...a: unknown[]) => void>;
  for (const name of ["error", "warn", "log", "info", "debug"]) {
    const print = c[name].bind(console);
    c[name] = (...args: unknown[]) => locked(() => print(...args));
  }
}

/**
 * The longest a print waits for the lock (ms) before it prints anyway: longer than an adapter
 * request takes (tens of ms on Dawn, a few hundred on lavapipe), short enough that a wedged one
 * delays a line instead of stopping the thread.
 */
export const PRINT_WAIT_MS = 2000;

/**
 * `fn()` under the lock, waiting at most {@link PRINT_WAIT_MS} for it (a capture stuck in a
 * wedged adapter request must not stop every thread's logging: past the wait the line goes out
 * unlocked, into that capture if it is still open). Re-entered by the holder: straight.
 */
function locked<T>(fn: () => T): T {
  if (held || !acquire(PRINT_WAIT_MS)) return fn();
  try {
    return fn();
  } finally {
    release();
  }
}

/** Takes the lock, waiting at most `waitMs` (a capture waits as long as it takes). */
function acquire(waitMs = Infinity): boolean {
  if (!lock) return false;
  const until = performance.now() + waitMs;
  while (Atomics.compareExchange(lock, 0, 0, 1) !== 0) {
    const left = until - performance.now();
    if (left <= 0) return false;
    Atomics.wait(lock, 0, 1, Math.min(10, left));
  }
  held = true;
  return true;
}

function release(): void {
  if (!lock || !held) return;
  held = false;
  Atomics.store(lock, 0, 0);
  Atomics.notify(lock, 0, 1);
}

/** The call's value and what it printed on stderr. */
export interface Captured<T> {
  value: T;
  /** The text printed on fd 2 during the call ("" when nothing or not captured). */
  text: string;
  /** False when stderr could not be redirected (the text went to the real stderr). */
  captured: boolean;
}

const SYMBOLS = {
  dup: { parameters: ["i32"], result: "i32" },
  dup2: { parameters: ["i32", "i32"], result: "i32" },
  close: { parameters: ["i32"], result: "i32" },
  tmpfile: { parameters: [], result: "pointer" },
  fileno: { parameters: ["pointer"], result: "i32" },
  fclose: { parameters: ["pointer"], result: "i32" },
  lseek: { parameters: ["i32", "i64", "i32"], result: "i64" },
  read: { parameters: ["i32", "buffer", "usize"], result: "isize" },
} as const;

type Libc = Deno.DynamicLibrary<typeof SYMBOLS>;

function openLibc(): Libc | null {
  const name = Deno.build.os === "linux"
    ? "libc.so.6"
    : Deno.build.os === "darwin"
    ? "libSystem.B.dylib"
    : null;
  if (!name) return null;
  try {
    return Deno.dlopen(name, SYMBOLS);
  } catch {
    return null;
  }
}

function readAll(libc: Libc, fd: number): string {
  libc.symbols.lseek(fd, 0n, 0);
  const chunks: Uint8Array[] = [];
  const buf = new Uint8Array(16384);
  for (;;) {
    const n = Number(libc.symbols.read(fd, buf, BigInt(buf.length)));
    if (n <= 0) break;
    chunks.push(buf.slice(0, n));
  }
  const all = new Uint8Array(chunks.reduce((s, c) => s + c.length, 0));
  let at = 0;
  for (const c of chunks) all.set(c, (at += c.length) - c.length);
  return new TextDecoder().decode(all);
}

/**
 * Runs `fn` with fd 2 redirected to a temporary file and returns its value and the text.
 * Only for short synchronous calls: anything else that writes to stderr meanwhile (nothing
 * in JS can, the call being synchronous; native threads could) lands in the text too.
 */
export function captureStderr<T>(fn: () => T): Captured<T> {
  const libc = openLibc();
  if (!libc) return { value: fn(), text: "", captured: false };
  const s = libc.symbols;
  acquire();
  try {
    const file = s.tmpfile();
    if (file === null) return { value: fn(), text: "", captured: false };
    try {
      const fd = s.fileno(file);
      const saved = s.dup(2);
      if (saved < 0 || s.dup2(fd, 2) < 0) {
        if (saved >= 0) s.close(saved);
        return { value: fn(), text: "", captured: false };
      }
      let value: T;
      try {
        value = fn();
      } finally {
        s.dup2(saved, 2);
        s.close(saved);
      }
      return { value, text: readAll(libc, fd), captured: true };
    } finally {
      s.fclose(file);
    }
  } finally {
    release();
    libc.close();
  }
}
