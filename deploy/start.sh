#!/usr/bin/env bash
# Starts N attention-service instances on loopback and nginx in front of them (the config is
# deploy/nginx.conf.template, rendered into PREFIX), then waits; SIGTERM/SIGINT stops nginx and
# every instance. No root needed: every file lives under PREFIX.
#
#   deploy/start.sh [--instances N] [--no-gpu] [--port P] [--base-port B] [--host H]
#                   [--allow-unauthenticated] [--prefix DIR] [--max-body-bytes BYTES]
#                   [-- SERVER_FLAGS...]
#
#   --instances N       instances to start (default: one per GPU that nvidia-smi lists; with
#                       --no-gpu or no GPU, 2)
#   --no-gpu            the instances run without a GPU (CPU_REFERENCE)
#   --port P            nginx's port (default 8080)
#   --host H            nginx's address (default 127.0.0.1; the instances stay on 127.0.0.1).
#                       As with the server's --host, an address that is not loopback needs a
#                       token for the instances (ATTN_TOKEN, or -- --token-file PATH): nginx
#                       passes the client's Host, so without one anyone could send
#                       `Host: localhost` and read, write and delete every cache
#   --allow-unauthenticated  serve a non-loopback --host without a token (prints a warning)
#   --base-port B       instance K (K = 0..N-1) listens on B+K (default 8100)
#   --prefix DIR        where the config, logs, pids and moved_caches.map go (default
#                       /tmp/attn-deploy)
#   --max-body-bytes B  body limit of the instances and of nginx (default 536870912)
#   -- SERVER_FLAGS     passed to every instance (e.g. --memory-budget-bytes, --token-file)
#
# Instance K is named iK (--instance-name iK: its answers carry X-Attention-Instance: iK, and
# nginx serves its /healthz, /metrics and /v1/device at /instances/iK/...) and gets
# ATTN_GPU_INDEX=K in its environment. nginx's client_body_timeout follows the instances' body
# timeout (--body-timeout-ms after --, else ATTN_BODY_TIMEOUT_MS, else 60 s) so that they, not
# nginx, answer a stalled body (below, "nginx's body timeout"; not on POST /v1/attention/forward,
# whose body nginx reads whole first: nginx.conf.template). PREFIX/instances.tsv lists "name port
# pid" once all are listening; PREFIX/ready appears once nginx answers too.
# Environment: NGINX (the nginx binary, default nginx from PATH or /usr/sbin/nginx), DENO
# (default deno).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
n="" gpu=1 port=8080 host=127.0.0.1 base=8100 prefix=/tmp/attn-deploy max_body=536870912
open=0
server_flags=()
# The value of flag $1, which must be there ($# counts the flag too).
need() { [[ $# -ge 2 ]] || { echo "start.sh: $1 needs a value (--help lists them)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --instances) need "$@"; n=$2; shift 2 ;;
    --no-gpu) gpu=0; shift ;;
    --port) need "$@"; port=$2; shift 2 ;;
    --host) need "$@"; host=$2; host=${host#[}; host=${host%]}; shift 2 ;;
    --allow-unauthenticated) open=1; shift ;;
    --base-port) need "$@"; base=$2; shift 2 ;;
    --prefix) need "$@"; prefix=$2; shift 2 ;;
    --max-body-bytes) need "$@"; max_body=$2; shift 2 ;;
    --) shift; server_flags=("$@"); break ;;
    -h | --help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "start.sh: unknown argument $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
for v in port base max_body; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "start.sh: --${v//_/-} must be a number, got ${!v}" >&2; exit 2; }
done

# The server's access rule (server/access_config.ts) for nginx's address: loopback
# (127.0.0.0/8, ::1, localhost) or a token for the instances, else --allow-unauthenticated.
is_loopback() {
  local h=${1,,}
  h=${h#[}
  h=${h%]}
  [[ $h == localhost || $h == ::1 || $h == 0:0:0:0:0:0:0:1 ]] && return 0
  [[ $h =~ ^127\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || return 1
  ((10#${BASH_REMATCH[1]} <= 255 && 10#${BASH_REMATCH[2]} <= 255 && 10#${BASH_REMATCH[3]} <= 255))
}
# Flags start.sh sets on each instance itself: given again after `--`, the later one would win
# on the instances while nginx and the instance table keep start.sh's (a body limit split between
# nginx and the instances; a port or name nginx does not route to).
for f in "${server_flags[@]}"; do
  case $f in
    --port | --port=* | --host | --host=* | --instance-name | --instance-name=* | \
      --max-body-bytes | --max-body-bytes=*)
      echo "start.sh: ${f%%=*} after -- is start.sh's to set on each instance; give start.sh's own (--help lists them)" >&2
      exit 2
      ;;
  esac
done
# nginx's body timeout. The instances answer a body that stalls with their own 408 problem
# (server/body_timeout.ts): a streamed body after --body-timeout-ms T without bytes, one read in
# one piece (a safetensors body with a Content-Length) when not whole by its deadline, T plus 1 s
# per 256 KiB declared (at most --max-body-bytes); a timer that fires late on a busy thread waits
# once more. nginx, which closes the connection with no answer past its client_body_timeout,
# waits twice the longest of those plus 5 s (at most 2^31-1 ms, as the instances): with the
# defaults (60 s, 512 MiB) 4,221 s. The last --body-timeout-ms after -- wins, as on the instances.
body_timeout=${ATTN_BODY_TIMEOUT_MS:-60000}
for ((i = 0; i < ${#server_flags[@]}; i++)); do
  case ${server_flags[i]} in
    --body-timeout-ms) body_timeout=${server_flags[i + 1]:-}; i=$((i + 1)) ;;
    --body-timeout-ms=*) body_timeout=${server_flags[i]#*=} ;;
  esac
done
max_timer_ms=2147483647
# Leading zeros are allowed, as the instances allow them (an integer in decimal digits).
[[ $body_timeout =~ ^0*([0-9]{1,10})$ ]] && body_timeout=${BASH_REMATCH[1]}
if ! [[ $body_timeout =~ ^[0-9]{1,10}$ ]] ||
  ((10#$body_timeout < 1 || 10#$body_timeout > max_timer_ms)); then
  echo "start.sh: the instances' body timeout (--body-timeout-ms or ATTN_BODY_TIMEOUT_MS) must be an integer from 1 to $max_timer_ms, got \"$body_timeout\"" >&2
  exit 2
fi
whole_read_ms=$(((10#$max_body + 262143) / 262144 * 1000))
nginx_body_timeout_ms=$((2 * (10#$body_timeout + whole_read_ms) + 5000))
((nginx_body_timeout_ms > max_timer_ms)) && nginx_body_timeout_ms=$max_timer_ms
token=0
[[ -n ${ATTN_TOKEN:-} ]] && token=1
for f in "${server_flags[@]}"; do
  [[ $f == --token-file || $f == --token-file=* ]] && token=1
done
if ! is_loopback "$host" && [[ $token -eq 0 ]]; then
  if [[ $open -eq 0 ]]; then
    echo "start.sh: refusing to serve on --host $host without a token: nginx passes the client's Host to the instances, so anyone who can reach it could read, write and delete every cache. Give the instances a token (ATTN_TOKEN, or -- --token-file PATH), use a loopback --host, or pass --allow-unauthenticated." >&2
    exit 2
  fi
  echo "start.sh: WARNING: nginx on $host with no authentication (--allow-unauthenticated): anyone who can reach it can read, write and delete every cache" >&2
fi
if [[ -z $n ]]; then
  n=2
  if [[ $gpu -eq 1 ]] && command -v nvidia-smi >/dev/null 2>&1; then
    g=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    [[ $g -gt 0 ]] && n=$g
  fi
fi
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "start.sh: --instances must be >= 1, got $n" >&2; exit 2; }

nginx_bin=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
[[ -x $nginx_bin ]] || { echo "start.sh: nginx not found (apt-get install nginx, or set NGINX)" >&2; exit 3; }
deno_bin=${DENO:-deno}

mkdir -p "$prefix"/tmp
prefix=$(cd "$prefix" && pwd)
rm -f "$prefix/ready" "$prefix/instances.tsv"
# Pins of an earlier run point at caches that went with its instances (and maybe at instances
# this run does not have: a 502 for those ids): start with none.
: >"$prefix/moved_caches.map"

pids=()
nginx_pid=""
# Stops in the order that loses no call: the instances drain first (each answers the calls it
# took, new ones get 503 shutting_down) while nginx still passes their answers on; then nginx
# stops gracefully (SIGQUIT). nginx's SIGTERM, sent first as before, closed every client
# connection at once, calls in flight included. The instances and nginx run in process groups
# of their own (setsid), so a terminal's Ctrl-C reaches only this script.
stop() {
  trap - EXIT INT TERM
  set +e
  rm -f "$prefix/ready"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  [[ -n $nginx_pid ]] && kill -QUIT "$nginx_pid" 2>/dev/null
  wait 2>/dev/null
  rm -f "$prefix/instances.tsv"
}
trap 'stop; exit 0' INT TERM
trap stop EXIT

# --- instances ---
# The permissions of `deno task serve` (deno.json): Dawn needs --allow-ffi, the keep-warm
# process --allow-run.
serve_perms="--allow-net --allow-read --allow-env --allow-ffi --allow-run"
own_group=""
command -v setsid >/dev/null && own_group=setsid
gpu_flag=()
[[ $gpu -eq 0 ]] && gpu_flag=(--no-gpu)
for ((k = 0; k < n; k++)); do
  ATTN_GPU_INDEX=$k XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} \
    $own_group "$deno_bin" run --config "$repo/deno.json" $serve_perms \
    "$repo/server/main.ts" --host 127.0.0.1 --port $((base + k)) --instance-name "i$k" \
    --max-body-bytes "$max_body" "${gpu_flag[@]}" "${server_flags[@]}" \
    >"$prefix/i$k.log" 2>&1 &
  pids+=($!)
done
for ((k = 0; k < n; k++)); do
  for ((t = 0; t < 600; t++)); do
    grep -q '^listening on ' "$prefix/i$k.log" 2>/dev/null && break
    kill -0 "${pids[k]}" 2>/dev/null || { echo "start.sh: instance i$k exited:" >&2; cat "$prefix/i$k.log" >&2; exit 1; }
    sleep 0.1
  done
  grep -q '^listening on ' "$prefix/i$k.log" || { echo "start.sh: instance i$k did not start" >&2; exit 1; }
  printf 'i%d\t%d\t%d\n' "$k" $((base + k)) "${pids[k]}" >>"$prefix/instances.tsv"
done

# --- nginx ---
pool="" ups="" map="" names="" names_json=""
for ((k = 0; k < n; k++)); do
  pool+="    server 127.0.0.1:$((base + k)) max_fails=0;"$'\n'
  ups+="  upstream attn_i$k {"$'\n'"    server 127.0.0.1:$((base + k)) max_fails=0;"$'\n'"    keepalive 8;"$'\n'"  }"$'\n'
  map+="    i$k attn_i$k;"$'\n'
  names+="${names:+, }i$k"
  names_json+="${names_json:+,}\"i$k\""
done
user=""
[[ $(id -u) -eq 0 ]] && user="user $(id -un) $(id -gn);"
listen=$host:$port
[[ $host == *:* ]] && listen="[$host]:$port"
conf=$(<"$here/nginx.conf.template")
conf=${conf//@PREFIX@/$prefix}
conf=${conf//@LISTEN@/$listen}
conf=${conf//@MAX_BODY_BYTES@/$max_body}
conf=${conf//@USER@/$user}
conf=${conf//@POOL_SERVERS@/${pool%$'\n'}}
conf=${conf//@INSTANCE_UPSTREAMS@/${ups%$'\n'}}
conf=${conf//@INSTANCE_MAP@/${map%$'\n'}}
conf=${conf//@INSTANCE_NAMES@/$names}
conf=${conf//@INSTANCE_NAMES_JSON@/[$names_json]}
conf=${conf//@CLIENT_BODY_TIMEOUT_MS@/$nginx_body_timeout_ms}
printf '%s\n' "$conf" >"$prefix/nginx.conf"
"$nginx_bin" -t -q -p "$prefix" -c "$prefix/nginx.conf" -e "$prefix/error.log"
# Something else on the port would answer the readiness probe below for nginx.
if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
  echo "start.sh: $listen is in use" >&2
  exit 1
fi
$own_group "$nginx_bin" -p "$prefix" -c "$prefix/nginx.conf" -e "$prefix/error.log" \
  -g 'daemon off;' &
nginx_pid=$!
for ((t = 0; t < 100; t++)); do
  if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
    touch "$prefix/ready"
    echo "start.sh: nginx on http://$listen in front of $n instances (prefix $prefix)"
    # An instance that dies is left dead (its caches answer 502 through nginx); nginx exiting
    # ends the deployment.
    wait "$nginx_pid" || true
    echo "start.sh: nginx exited; stopping the instances" >&2
    exit 1
  fi
  kill -0 "$nginx_pid" 2>/dev/null || { echo "start.sh: nginx exited:" >&2; cat "$prefix/error.log" >&2; exit 1; }
  sleep 0.1
done
echo "start.sh: nginx did not answer on $listen" >&2
exit 1
