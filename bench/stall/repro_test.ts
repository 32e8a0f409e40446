// The stall repro (bench/stall/repro.ts) under `deno test`: ITERS from STALL_ITERS.
Deno.test("dawn pending-map repro", async () => {
  const args = (Deno.env.get("STALL_ITERS") ?? "1000 100000000").split(" ");
  Object.defineProperty(Deno, "args", { value: args });
  await import("./repro.ts");
});
