#!/usr/bin/env bash
# One call on the GPU machine (see bench/NOTES.md): GPU tests, the bench with its kernel sweeps,
# the HTTP bench, the PyTorch anchor. Logs under $OUT; each part's tail is printed.
# Usage there: bash bench/gpu_machine.sh
#   [tests|dawn-tests|both-tests|compile-probe|mma|mma-fast|mma-bench|mma-ceiling|mma-strides|residency|bench|
#    bench-deno|http|http-ab|gap-ab|http-warm|http-prof|stub-ab|host-costs|threads|exit-probe|anchor|clock-probe|group-probe|all]...
# mma: the tensor-core kernel's tests; mma-fast: those of its fast softmax, direct loads, matrix-move
# staging, split S chains, per-subgroup rescale, late next-tile stores, D split over subgroups and
# the pipelined key loop and its staggered subgroups;
# mma-bench: its variant sweep; mma-ceiling: bench/mma_ceiling.ts, what subgroup-matrix loops reach
# (MMA_CEILING_ARGS adds flags, e.g. "--only gemm-st-2x4-w2x2,flash-wg-1x4-w8x1"; MMA_CEILING_TIMEOUT
# 240).
# group-probe: bench/group_prefill_probe.ts, the token-group portable prefill probe (GROUP_PROBE_ARGS,
# e.g. "--runtime dawn --shapes 4:1,4:2"; Deno's runtime by default; GROUP_PROBE_TIMEOUT 240).
# Each part is cut at its own limit (seconds, env): TESTS_TIMEOUT 240, MMA_TIMEOUT 150,
# MMA_BENCH_TIMEOUT 150 (bench/mma_bench.ts's default variants; MMA_BENCH_ARGS adds flags, e.g.
# "--only w8r1k16,w8r1k16-fd --cases 8x4096"),
# tests/dawn-tests: TEST_PATHS (default tests/gpu tests/backends tests/conformance) and TEST_ARGS
# (e.g. "--no-check --filter fp8"); each pipeline compile is logged with its time
# (ATTN_COMPILE_LOG, gpu/pipelines.ts; ATTN_WGSL_DUMP=$OUT/wgsl also keeps the sources).
# BENCH_TIMEOUT 150, HTTP_TIMEOUT 170, ANCHOR_TIMEOUT 60; a cut part reports rc=124.
# bench: sweeps (override by setting them) BENCH_FLASH_TILES (prefill register tiles
# TXxTYxRMxRN[u|l]) and BENCH_DECODE_TUNINGS (a JSON array of partial WEBGPU_DECODE tunings);
# BENCH_ARGS go to the bench as they are (e.g. "--case decode" or "--runtime dawn");
# BENCH_SHAPES (a regex over the shape names, e.g. '^mixed' for the mixed batch) and BENCH_HND=1
# (the f16 decode shapes over an HND cache too) are read by the bench itself.
# anchor: bench/torch_anchor.py (PyTorch SDPA on the same shapes), its text in anchor.log and its
# JSON in $OUT/anchor.json. Parts run in the order named, so name anchor BEFORE bench (or
# bench-deno) to have the bench print `x SDPA` (SDPA's ms / ours) from that JSON:
#   bash bench/gpu_machine.sh anchor bench
# (`all` runs anchor before bench for that; a bench with no anchor from this call reads
# BENCH_ANCHOR if set.)
# http: bench/http_bench.ts (deno task bench:http) on both WebGPU runtimes (HTTP_RUNTIMES,
# default dawn,deno: Dawn first, each runtime's report printed when done), cut at HTTP_TIMEOUT
# seconds (default 170); HTTP_ARGS adds flags (e.g. "--steps 32", "--device-threads 0,4",
# "--instances 1,4"); JSON in $OUT/http.json.
# http-ab: interleaved A/B runs of Dawn's HTTP bench (HTTP_AB, see the part), a log each, each cut
# at HTTP_TIMEOUT, else 55 + 45 s per layer.
# gap-ab: Dawn's HTTP bench without keep-warm, 8 clients, once per GAP_AB entry ENGINE:GAP[:ARGS]
# (see the part), each server with ATTN_TRACE_FILE (its requests' heads, bodies and answers by
# connection, and each launch: gap-ab-N-...-trace.txt beside the log and JSON). v0.30's
# http1-stall part is GAP_AB="http1:0.01 http1:0.01 http1:0.01 http1:0.01" (NOTES v0.31).
# http-prof: the server (HTTP_PROF_RUNTIME, default dawn; keep-warm mode HTTP_PROF_KEEP_WARM,
# default timer; HTTP_PROF_SERVER_ARGS added) under --cpu-prof, the HTTP bench against it (--url,
# HTTP_PROF_ARGS, default "--steps 128"), then SIGINT and bench/cpuprofile_summary.ts of the
# server's profile ($OUT/http-prof-summary.txt); HTTP_TIMEOUT.
# stub-ab: bench/http_overhead.ts's stub behind the http1 engine, sequential, once per STUB_AB
# entry (the stub's busy wait per call, ms; default "0 0.7 0 0.7"); STUB_CALLS, STUB_TIMEOUT 60.
# host-costs: bench/webgpu_host_costs.ts on Dawn, what the WebGPU calls of a decode-like launch
# cost the host (HOST_COSTS_CALLS, default 400; HOST_COSTS_TIMEOUT 90), once per
# HOST_COSTS_BETWEEN entry (KiB of host work between calls, default "0 800").
# threads: bench/device_threads_probe.ts, several threads of one process each with its own device
# (Dawn, then Deno's runtime; THREADS_ARGS, default "--threads 1,2,4,8 --seconds 3"), each in its
# own step (an abort of Dawn in several isolates ends only that step); THREADS_TIMEOUT 60.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
# pack.sh adds the Deno cache only where `deno` is on its PATH; without it every part that
# imports npm packages fails offline here, after the machine's start was paid for (v0.35).
if [ ! -f gpupack/deno_dir.tar.xz ]; then
  echo "gpupack/deno_dir.tar.xz missing: re-run ../shared/gpu/pack.sh gpupack with deno on PATH" >&2
  exit 3
fi
source gpupack/env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv \
  >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
# The SM clock through the call (100 ms samples): the H200 served at 345-420 MHz of 1980 while the
# bench's own warm-up ran at 1980 (bench/NOTES.md v0.5), so each part says what it ran at.
clk="$out/clocks.csv"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=clocks.sm,utilization.gpu --format=csv,noheader,nounits -lms 100 \
    >"$clk" 2>/dev/null &
  clk_pid=$!
  trap 'kill "$clk_pid" 2>/dev/null' EXIT
fi
lines() { if [ -f "$clk" ]; then wc -l <"$clk"; else echo 0; fi; }
clock_summary() { # first line, last line of $clk
  [ "$2" -ge "$1" ] || return 0
  sed -n "$1,$2p" "$clk" | cut -d, -f1 | sort -n | awk '
    { v[NR] = $1; if ($1 >= 1900) hi++ }
    END { if (NR) printf "   SM clock: median %d MHz, %d%% of %d samples at >= 1900 MHz\n",
      v[int((NR + 1) / 2)], 100 * hi / NR, NR }'
}
export BENCH_FLASH_TILES=${BENCH_FLASH_TILES-8x8x4x4,8x8x4x4l,8x8x4x2,4x8x4x4,8x4x4x4,8x16x2x4,4x16x4x4}
# Decode sweep (bench/NOTES.md, "v0.7 decode (branch decode4)"): the residency probe over 8192
# workgroups (the real wave), the fused reduce, kv heads a workgroup 2 / 4 / 8, prefetch's wave and
# prefetch at 528 and 396, 8 keys a step, half the GQA group, 64 invocations at wave 1056. Run it
# with BENCH_SHAPES='f16$|2048.*HND' BENCH_HND=1 (3 shapes) to stay within BENCH_TIMEOUT.
export BENCH_DECODE_TUNINGS=${BENCH_DECODE_TUNINGS-'[{"probe_residency":true,"waves":0,"target_workgroups":8192},{"fused_reduce":true},{"wg_kv_heads":2,"fused_reduce":true},{"wg_kv_heads":4},{"wg_kv_heads":8},{"prefetch":true,"probe_residency":true,"waves":0,"target_workgroups":8192},{"prefetch":true,"fused_reduce":true},{"prefetch":true,"fused_reduce":true,"wave_workgroups":396},{"keys_per_iter":8,"fused_reduce":true},{"max_heads":2,"fused_reduce":true},{"workgroup_size":64,"wave_workgroups":1056,"fused_reduce":true,"probe_residency":true}]'}
what=${*:-all}
both_pids=()
anchor_json= # set by the anchor part when it wrote $out/anchor.json in this call
run() { # name, limit in seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  local t0=$SECONDS l0
  l0=$(lines)
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0))s"
  clock_summary $((l0 + 1)) "$(lines)"
  tail -n "${TAIL:-40}" "$out/$name.log" | sed 's/\x1b\[[0-9;]*m//g'
}
for w in $what; do
  case $w in
    tests | all)
      # shellcheck disable=SC2086
      ATTN_COMPILE_LOG=1 run gpu-tests "${TESTS_TIMEOUT:-240}" \
        deno test --allow-all ${TEST_ARGS:-} ${TEST_PATHS:-tests/gpu tests/backends tests/conformance} ;;&
    dawn-tests)
      # shellcheck disable=SC2086
      ATTN_COMPILE_LOG=1 ATTN_WEBGPU_RUNTIME=dawn run dawn-tests "${TESTS_TIMEOUT:-240}" \
        deno test --allow-all ${TEST_ARGS:-} ${TEST_PATHS:-tests/gpu tests/backends tests/conformance} ;;&
    both-tests)
      # The GPU suite on both runtimes at once (Deno's runtime mostly sleeps in its completion
      # floor, so the two share the card): both-tests-deno.log and both-tests-dawn.log, each cut at
      # TESTS_TIMEOUT (default 420 here), each one's summary line printed last.
      for rt in deno dawn; do
        # shellcheck disable=SC2086
        (ATTN_COMPILE_LOG=1 ATTN_WEBGPU_RUNTIME=$rt timeout -k 5 "${TESTS_TIMEOUT:-420}" \
          deno test --allow-all ${TEST_ARGS:-} ${TEST_PATHS:-tests/gpu tests/backends tests/conformance} \
          >"$out/both-tests-$rt.log" 2>&1
          echo "rc=$?" >>"$out/both-tests-$rt.log") &
        both_pids+=($!)
      done
      wait "${both_pids[@]}" # not a bare wait: the clock sampler runs in the background too
      for rt in deno dawn; do
        echo "== both-tests ($rt)"
        sed 's/\x1b\[[0-9;]*m//g' "$out/both-tests-$rt.log" |
          grep -a -E "^(ok|FAILED) \| |^rc=|=> .*:[0-9]+|^ERRORS|^FAILURES" | tail -n 30
      done ;;&
    mma)
      run mma "${MMA_TIMEOUT:-150}" deno test --allow-all tests/backends/flash_mma_test.ts \
        tests/gpu/flash_mma_fp8_test.ts ;;&
    clock-probe)
      # A decode step every ~1, 3, 6 and 21 ms for ~10 s each after 5 s idle: the server's GPU
      # time and the SM clock against the call rate (NOTES v0.5: served at 345-420 MHz).
      for gap in 0 2 5 20; do
        sleep 5
        TAIL=4 run "clock-probe-gap$gap" 60 deno run -A bench/host_profile.ts --runtime dawn \
          --case decode --kernels --gap-ms "$gap" --iters $((10000 / (gap + 2)))
      done ;;&
    compile-probe)
      # bench/compile_probe.ts on Dawn: each WGSL file of COMPILE_PROBE_FILES (default: the
      # untracked hang/*.wgsl a bisect puts there) alone in its own process, all at once, each cut
      # at COMPILE_PROBE_TIMEOUT (40) seconds, into one log (compile-probe.log); then
      # COMPILE_PROBE_TOGETHER (files started together in one process, --repeat 20 --salt), e.g. a
      # split kernel and its reduce. COMPILE_PROBE_ARGS adds flags (e.g. --dispatch).
      mkdir -p "$out/probe"
      pids=()
      for f in ${COMPILE_PROBE_FILES:-hang/*.wgsl}; do
        n=$(basename "$f" .wgsl)
        # shellcheck disable=SC2086
        (timeout -k 2 "${COMPILE_PROBE_TIMEOUT:-40}" deno run -A bench/compile_probe.ts \
          --runtime dawn ${COMPILE_PROBE_ARGS:-} "$f" >"$out/probe/$n" 2>&1
          echo "rc=$?" >>"$out/probe/$n") &
        pids+=($!)
      done
      wait "${pids[@]}" # not a bare wait: the clock sampler runs in the background too
      for f in ${COMPILE_PROBE_FILES:-hang/*.wgsl}; do
        n=$(basename "$f" .wgsl)
        echo "   $n: $(grep -h 'round 0\|rc=' "$out/probe/$n" | tr '\n' ' ' | cut -c1-220)"
      done | tee "$out/compile-probe.log"
      rm -rf "$out/probe"
      if [ -n "${COMPILE_PROBE_TOGETHER:-}" ]; then
        # shellcheck disable=SC2086
        TAIL=12 run compile-together "${COMPILE_PROBE_TIMEOUT:-40}" deno run -A \
          bench/compile_probe.ts --runtime dawn --together --repeat 20 --salt $COMPILE_PROBE_TOGETHER
      fi ;;&
    mma-fast)
      run mma-fast "${MMA_TIMEOUT:-150}" deno test --allow-all \
        tests/backends/flash_mma_mstage_test.ts tests/backends/flash_mma_fast_test.ts \
        tests/backends/flash_mma_sgresc_test.ts tests/backends/flash_mma_late_test.ts \
        tests/backends/flash_mma_dsplit_test.ts tests/backends/flash_mma_pipe_test.ts \
        tests/backends/flash_mma_stagger_test.ts ;;&
    mma-bench)
      # shellcheck disable=SC2086
      TAIL=${TAIL:-60} run mma-bench "${MMA_BENCH_TIMEOUT:-150}" \
        deno run -A bench/mma_bench.ts --iters 20 ${MMA_BENCH_ARGS:-} ;;&
    residency)
      # Resident workgroups per SM by timing (bench/NOTES.md v0.8, "Next on the H200"): the
      # kernel at 132 / 264 / 396 / 528 workgroups of equal work, then the ladder likewise; the
      # time stays flat while they all fit at once.
      TAIL=${TAIL:-24} run residency-kernel "${MMA_BENCH_TIMEOUT:-150}" \
        deno run -A bench/mma_bench.ts --iters 10 --only "${RESIDENCY_VARIANTS:-w8r1k16-fl,w8r1k16-fld,w16r1k16-fld,w8r2k16-fld}" \
        --cases 1x1056n-h16k4,2x1056n-h16k4,3x1056n-h16k4,4x1056n-h16k4
      for r in 16896 33792 50688 67584; do
        TAIL=3 run "residency-ladder-$r" 60 deno run -A bench/mma_ceiling.ts --iters 10 \
          --flash-rows "$r" --only ladder-pg-k16-w8,ladder-sm-k16-w8
      done ;;&
    mma-strides)
      # The workgroup matrix calls' strides (bench/NOTES.md v0.16): w8r1k16-fl with constant
      # strides (the default) and with the Params words (ATTN_MMA_RUNTIME_STRIDES=all).
      for v in const: runtime:all; do
        IFS=: read -r name strides <<<"$v"
        TAIL=8 ATTN_MMA_RUNTIME_STRIDES=$strides run "mma-$name" 90 \
          deno run -A bench/mma_bench.ts --iters 10 --only w8r1k16-fl --cases 4x1024,8x4096
      done ;;&
    exit-probe)
      # bench/exit_probe.ts: drained --device-threads servers' exit status, Deno's runtime then
      # with no grace after terminating the threads and with the default (NOTES v0.16); Deno's
      # runtime (the probe's servers are not given --allow-ffi, which Dawn needs).
      for rt in deno; do
        for g in 0 300; do
          # shellcheck disable=SC2086
          TAIL=1 ATTN_WEBGPU_RUNTIME=$rt ATTN_THREAD_EXIT_GRACE_MS=$g run "exit-$rt-$g" 90 \
            deno run -A bench/exit_probe.ts ${EXIT_PROBE_ARGS:---threads 8 --rounds 5}
        done
      done ;;&
    mma-ceiling)
      # shellcheck disable=SC2086
      TAIL=${TAIL:-60} run mma-ceiling "${MMA_CEILING_TIMEOUT:-240}" \
        deno run -A bench/mma_ceiling.ts --iters 20 ${MMA_CEILING_ARGS:-} ;;&
    group-probe)
      # shellcheck disable=SC2086
      TAIL=${TAIL:-40} run group-probe "${GROUP_PROBE_TIMEOUT:-240}" \
        deno run -A bench/group_prefill_probe.ts ${GROUP_PROBE_ARGS:-} ;;&
    anchor | all)
      rm -f "$out/anchor.json"
      run anchor "${ANCHOR_TIMEOUT:-60}" python3 bench/torch_anchor.py --json "$out/anchor.json"
      if [ -s "$out/anchor.json" ]; then anchor_json=$out/anchor.json; fi ;;&
    bench | all)
      # shellcheck disable=SC2086
      run bench "${BENCH_TIMEOUT:-150}" deno task bench ${anchor_json:+--anchor "$anchor_json"} \
        ${BENCH_ARGS:-} ;;&
    bench-deno)
      # shellcheck disable=SC2086
      run bench-deno "${BENCH_TIMEOUT:-150}" deno task bench --runtime deno \
        ${anchor_json:+--anchor "$anchor_json"} ${BENCH_DENO_ARGS:-} ;;&
    http | all)
      TAIL=${TAIL:-100} run http "${HTTP_TIMEOUT:-170}" \
        deno run --allow-net --allow-read --allow-env --allow-run --allow-write \
        bench/http_bench.ts --runtimes "${HTTP_RUNTIMES:-dawn,deno}" \
        --json-out "$out/http.json" ${HTTP_ARGS:-} ;;&
    http-warm)
      # Dawn's HTTP bench once per keep-warm setting (gpu/keep_warm.ts): KEEP_WARM_VARIANTS lists
      # HOLD_MS[:SPIN_ITERS[:WORKGROUPS[:DEPTH[:MODE[:PERIOD_MS]]]]] (0: off; MODE timer, the
      # default, or await, v0.6's loop; an empty field keeps the server's default), each a server
      # of its own, e.g. "0 3000:10000:1:2:await" (default: bench/NOTES.md's two timer variants).
      for kw in ${KEEP_WARM_VARIANTS:-3000:10000:1:8:timer:1 3000:40000:1:8:timer:1}; do
        IFS=: read -r hold iters wgs depth mode period <<<"$kw"
        # shellcheck disable=SC2086
        TAIL=${TAIL:-30} run "http-warm-${kw//:/-}" "${HTTP_TIMEOUT:-170}" \
          deno run --allow-net --allow-read --allow-env --allow-run --allow-write \
          bench/http_bench.ts --runtimes dawn --server-arg="--keep-warm-ms=$hold" \
          ${iters:+--server-arg="--keep-warm-spin-iters=$iters"} \
          ${wgs:+--server-arg="--keep-warm-workgroups=$wgs"} \
          ${depth:+--server-arg="--keep-warm-depth=$depth"} \
          ${mode:+--server-arg="--keep-warm-mode=$mode"} \
          ${period:+--server-arg="--keep-warm-period-ms=$period"} ${HTTP_ARGS:-}
      done ;;&
    http-ab)
      # Interleaved A/B runs of Dawn's HTTP bench, each a server of its own and a log of its own
      # (http-ab-N-ENGINE-KEEPWARM-LLAYERS[-wWORKERS].log/.json): HTTP_AB lists
      # ENGINE:KEEPWARM:LAYERS:CLIENTS:STEPS[:WORKERS[:ARGS]] (ENGINE deno or http1; KEEPWARM
      # off, process or timer, 3000 ms; WORKERS: the server's --http-workers, may be empty; ARGS:
      # more server flags, comma-separated, e.g. --device-threads=4,--device-threads-http),
      # default two pairs of the
      # engines with the process keep-warm, then a pair without (bench/NOTES.md v0.29). The summary
      # lines of each run are printed: p50/p99, calls/s, and the sequential phases that decide them.
      n_ab=0
      for ab in ${HTTP_AB:-http1:process:1:8:64 deno:process:1:8:64 http1:process:1:8:64 deno:process:1:8:64 http1:off:1:8:64 deno:off:1:8:64}; do
        IFS=: read -r eng kw layers clients steps workers extra <<<"$ab"
        n_ab=$((n_ab + 1))
        name="http-ab-$n_ab-$eng-$kw-L$layers${workers:+-w$workers}${extra:+-args}"
        kwargs=()
        [ "$kw" != off ] && kwargs=(--server-arg=--keep-warm-ms=3000 --server-arg="--keep-warm-mode=$kw")
        [ -n "$workers" ] && kwargs+=(--http-workers "$workers") # the bench's own: in its JSON
        IFS=, read -r -a more <<<"$extra"
        for a in "${more[@]}"; do kwargs+=("--server-arg=$a"); done
        [ -n "$extra" ] && echo "== $name: server flags $extra"
        # Each layer is a cache to fill per client: a 4-layer run was cut at 100 s (NOTES v0.39).
        TAIL=${TAIL:-40} run "$name" "${HTTP_TIMEOUT:-$((55 + 45 * layers))}" \
          deno run --allow-net --allow-read --allow-env --allow-run --allow-write \
          bench/http_bench.ts --runtimes dawn --json-out "$out/$name.json" --steps "$steps" \
          --layers "$layers" --clients "$clients" --server-arg="--http-engine=$eng" "${kwargs[@]}" |
          grep -E "^== |rc=|SM clock|decode step|^  (parse|plan|bind|encode|gpu_and_readback|gpu|readback_map|total) |round trip|^dawn|^server CPU"
      done ;;&
    gap-ab)
      # Dawn's poll gap within the spin (gpu/dawn_tick_pace.ts, NOTES v0.31): GAP_AB runs of
      # ENGINE:GAP[:ARGS] (ATTN_DAWN_TICK_GAP_MS; off = a poll every turn, as before v0.31; ARGS
      # more server flags, comma-separated, e.g. --device-threads=4,--device-threads-http), no
      # keep-warm, 8 clients, each server traced (gap-ab-N-trace.txt beside its log and JSON).
      n=0
      for spec in ${GAP_AB:-http1:0.01 http1:off deno:0.01 deno:off http1:0.01 http1:off}; do
        n=$((n + 1))
        IFS=: read -r engine gap extra <<<"$spec"
        name="gap-ab-$n-$engine-$gap"
        [ -n "$extra" ] && name="$name-threads"
        sargs=("--server-arg=--http-engine=$engine")
        IFS=, read -r -a more <<<"$extra"
        for a in "${more[@]}"; do sargs+=("--server-arg=$a"); done
        rm -f "$out/$name-trace.txt"
        ATTN_DAWN_TICK_GAP_MS=$gap ATTN_TRACE_FILE="$out/$name-trace.txt" TAIL=${TAIL:-40} \
          run "$name" "${HTTP_TIMEOUT:-100}" \
          deno run --allow-net --allow-read --allow-env --allow-run --allow-write \
          bench/http_bench.ts --runtimes dawn --json-out "$out/$name.json" --steps 64 --clients 8 \
          "${sargs[@]}" |
          grep -E "^== |rc=|SM clock|decode step|poll ticks|^  (parse|plan|encode|gpu|readback_map|total) |^dawn"
      done ;;&
    http-prof)
      # Where the serving thread's time goes under the HTTP bench (bench/NOTES.md v0.13, "Next").
      rm -rf "$out/prof" && mkdir -p "$out/prof"
      port=18321
      # shellcheck disable=SC2086
      deno run --cpu-prof --cpu-prof-dir="$out/prof" -A server/main.ts --port "$port" \
        --webgpu-runtime "${HTTP_PROF_RUNTIME:-dawn}" --keep-warm-ms 3000 --keep-warm-mode "${HTTP_PROF_KEEP_WARM:-timer}" \
        ${HTTP_PROF_SERVER_ARGS:-} >"$out/http-prof-server.log" 2>&1 &
      srv=$!
      for _ in $(seq 120); do
        grep -q "listening on" "$out/http-prof-server.log" && break
        kill -0 "$srv" 2>/dev/null || break
        sleep 1
      done
      # shellcheck disable=SC2086
      TAIL=${TAIL:-40} run http-prof "${HTTP_TIMEOUT:-170}" \
        deno run --allow-net --allow-read --allow-env --allow-run --allow-write \
        bench/http_bench.ts --url "http://127.0.0.1:$port" ${HTTP_PROF_ARGS:---steps 128}
      kill -INT "$srv"
      wait "$srv"
      deno run --allow-read bench/cpuprofile_summary.ts --top 50 "$out"/prof/*.cpuprofile \
        >"$out/http-prof-summary.txt" 2>&1
      head -60 "$out/http-prof-summary.txt"
      rm -rf "$out/prof" ;;&
    stub-ab)
      # The HTTP stack alone on this host (bench/http_overhead.ts: the real handler on the http1
      # engine in front of a stub service), sequential decode calls, once per STUB_AB entry: the
      # stub's busy wait per call in ms (default "0 0.7 0 0.7"; 0.7 ~ a real call's server total),
      # so the time outside a real call's total can be set beside the stack's own (NOTES v0.37).
      for d in ${STUB_AB:-0 0.7 0 0.7}; do
        TAIL=3 run "stub-ab-$d" "${STUB_TIMEOUT:-60}" deno run -A bench/http_overhead.ts --no-codec \
          --http-engine http1 --calls "${STUB_CALLS:-3000}" --clients 0 --stub-delay-ms "$d"
      done ;;&
    host-costs)
      # What the WebGPU API costs the host per decode-like call on Dawn (bench/webgpu_host_costs.ts:
      # writeBuffer patterns, dispatches, clearBuffer, error scope; NOTES v0.38), HOST_COSTS_CALLS.
      # Once per HOST_COSTS_BETWEEN entry (KiB of host work between calls; default "0 800").
      for kb in ${HOST_COSTS_BETWEEN:-0 800}; do
        TAIL=14 run "host-costs-$kb" "${HOST_COSTS_TIMEOUT:-90}" deno run -A \
          bench/webgpu_host_costs.ts --runtime dawn --calls "${HOST_COSTS_CALLS:-400}" --between-kb "$kb"
      done ;;&
    threads)
      for rt in dawn deno; do
        # shellcheck disable=SC2086
        run "threads-$rt" "${THREADS_TIMEOUT:-60}" deno run -A bench/device_threads_probe.ts \
          --runtime "$rt" ${THREADS_ARGS:---threads 1,2,4,8 --seconds 3}
      done ;;&
  esac
done
