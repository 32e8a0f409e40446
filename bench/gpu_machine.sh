#!/usr/bin/env bash
# One call on the GPU machine (see bench/NOTES.md): GPU tests, the bench, the PyTorch anchor.
# Usage there: bash bench/gpu_machine.sh [tests|bench|anchor|all]...   (logs under $OUT)
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
source gpupack/env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >"$out/gpu.txt" 2>&1
what=${*:-all}
run() { # name, command...
  local name=$1; shift
  echo "== $name"
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0))s"
  tail -n "${TAIL:-25}" "$out/$name.log" | sed 's/\x1b\[[0-9;]*m//g'
}
for w in $what; do
  case $w in
    tests | all)
      run gpu-tests deno test --allow-all tests/gpu tests/backends tests/conformance ;;&
    bench | all)
      run bench deno task bench ${BENCH_ARGS:-} ;;&
    anchor | all)
      run anchor python3 bench/torch_anchor.py ;;
  esac
done
