#!/usr/bin/env bash
# Runs one Dawn test file in the trixie chroot N times; when its trace file has not grown for
# STALL_S seconds, dumps every thread's stack (host gdb), /proc stat and wchan under OUTDIR.
# Usage (on the host, as root): bash bench/stall/watch.sh TEST_FILE [N] [OUTDIR]
set -u
test=$1; n=${2:-5}; out=${3:-/tmp/stall_out}; stall=${STALL_S:-30}
mkdir -p "$out"
wt=/work/wt/stall
for i in $(seq 1 "$n"); do
  tr=/tmp/stall_trace_$$_$i.txt; rm -f "/opt/trixie$tr"
  start=$(date +%s)
  chroot /opt/trixie bash -c "cd $wt && XDG_RUNTIME_DIR=/tmp ATTN_WEBGPU_RUNTIME=dawn \
    ATTN_TRACE_FILE=$tr ${EXTRA_ENV:-} deno test --allow-all --no-check $test" \
    >"$out/run_$i.log" 2>&1 &
  job=$!
  dumped=0
  while kill -0 $job 2>/dev/null; do
    sleep 5
    pid=$job # chroot and bash exec deno: the job is deno itself
    [ "$(cat /proc/$pid/comm 2>/dev/null)" = deno ] || continue
    f=/opt/trixie$tr
    [ -f "$f" ] || continue
    age=$(( $(date +%s) - $(stat -c %Y "$f") ))
    if [ $age -gt "$stall" ] && [ $dumped -lt 2 ]; then
      dumped=$((dumped+1))
      d="$out/stall_${i}_$dumped"; mkdir -p "$d"
      tail -5 "$f" | cut -c1-200 >"$d/trace_tail.txt"
      for t in /proc/$pid/task/*; do
        echo "$(basename $t) $(cat $t/comm) wchan=$(cat $t/wchan) $(cut -d' ' -f3,14,15 $t/stat)"
      done >"$d/threads.txt"
      /usr/bin/gdb -p "$pid" -batch -ex "thread apply all bt 30" >"$d/bt.txt" 2>&1
      sleep 3
      for t in /proc/$pid/task/*; do
        echo "$(basename $t) $(cat $t/comm) $(cut -d' ' -f3,14,15 $t/stat)"
      done >"$d/threads_after3s.txt"
    fi
  done
  wait $job; rc=$?
  echo "run $i rc=$rc $(( $(date +%s) - start ))s dumped=$dumped" | tee -a "$out/summary.txt"
  cp "/opt/trixie$tr" "$out/trace_$i.txt" 2>/dev/null
done
