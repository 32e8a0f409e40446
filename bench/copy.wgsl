// copy.wgsl: the bandwidth yardstick of `deno task bench` (bench/main.ts): dst[i] = src[i]
// over vec4<u32> elements, so every invocation reads and writes 16 bytes per step.
//
// Bindings (group 0):
//   0 storage  src: array<vec4<u32>>   read
//   1 storage  dst: array<vec4<u32>>   read_write
//   2 uniform  P                       n: vec4 elements to copy, stride: invocations launched
// Dispatch: (nwg, 1, 1) workgroups of WG with nwg <= maxComputeWorkgroupsPerDimension; a
// grid-stride loop (step P.stride = nwg * WG) covers any n, so one dispatch copies it all.
// Compile-time: WG (workgroup size).

struct Params {
  n: u32,
  stride: u32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  var i = gid.x;
  loop {
    if (i >= P.n) {
      break;
    }
    dst[i] = src[i];
    i = i + P.stride;
  }
}
