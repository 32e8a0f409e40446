// fma.wgsl: the compute yardstick of `deno task bench` (bench/fma.ts): the f32 FMA ceiling of
// this adapter through WGSL. Every invocation runs P.iters steps of 8 independent vec4
// fused multiply-adds (32 scalar FMA chains, enough to cover the FMA latency), then stores
// one sum so nothing is optimised away. FLOPs = 2 * 4 * 8 * 8 * iters * invocations (the
// loop body is unrolled 8 times).
//
// Bindings (group 0):
//   0 storage  dst: array<vec4<f32>>   read_write, one vec4 per invocation
//   1 uniform  P                       iters, a, b (a * x + b keeps values bounded)
// Dispatch: (nwg, 1, 1) workgroups of WG. Compile-time: WG.

struct Params {
  iters: u32,
  a: f32,
  b: f32,
  _pad: u32,
}

@group(0) @binding(0) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(1) var<uniform> P: Params;

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let a = vec4<f32>(P.a);
  let b = vec4<f32>(P.b);
  let s = f32(gid.x) * 1.0e-7;
  var x0 = vec4<f32>(s, s + 0.1, s + 0.2, s + 0.3);
  var x1 = x0 + 0.01;
  var x2 = x0 + 0.02;
  var x3 = x0 + 0.03;
  var x4 = x0 + 0.04;
  var x5 = x0 + 0.05;
  var x6 = x0 + 0.06;
  var x7 = x0 + 0.07;
  for (var i = 0u; i < P.iters; i++) {
{{BODY}}
  }
  dst[gid.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}
