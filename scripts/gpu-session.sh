#!/usr/bin/env bash
# The GPU check across several device calls: scripts/gpu-check.sh runs in the background, in a
# session of its own (setsid), so that it outlives the call that started it and goes on for as
# long as the machine is held; each call waits for it at most SECONDS, then hands back what it
# has written so far (docs/gpu-check.md, "On the GPU machine"). The GPU machine gives a call
# 10 minutes, and keeps a machine 30 seconds after a call: call `wait` again at once.
#
#   bash scripts/gpu-session.sh start [GPU-CHECK OPTIONS]   start the check, then wait as below
#   bash scripts/gpu-session.sh wait [SECONDS]              wait (default 560 s), then hand back
#
# Handing back: into $OUT (or --out DIR, given first), three files: gpu-check.log (the whole
# log so far), console.txt (what the check printed that is not in its log: its own errors) and
# results.tar.gz (every file the check has written: tables, JSON, plots). Printed: the parts'
# progress lines, then the log's lines since the last call (its last 150).
# Environment: REMAT_SESSION_DIR, where the check writes (default /tmp/remat-gpu-session);
# REMAT_SESSION_WAIT, how long `start` waits (default 560 s).
# Exit status: 0 the check has ended and passed; 1 it has ended and failed (a test, a peak
# above its budget, a failed part); 2 bad arguments, or `start` while a check runs; 3 it is
# still running: call `wait` again; 4 no check was started on this machine (the machine was
# given back in between: `start` again, with --only the parts not yet done).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-}
if [ "${1:-}" = --out ]; then out=$2; shift 2; fi
command=${1:-}
[ $# -gt 0 ] && shift
dir=${REMAT_SESSION_DIR:-/tmp/remat-gpu-session}
usage() { echo "usage: $0 [--out DIR] start [GPU-CHECK OPTIONS] | wait [SECONDS]" >&2; exit 2; }

running() { [ -f "$dir/pid" ] && [ ! -f "$dir/exit-status" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; }

case "$command" in
  start)
    if running; then echo "gpu-session: a check is already running (pid $(cat "$dir/pid"))" >&2; exit 2; fi
    rm -rf "$dir"
    mkdir -p "$dir/out"
    # setsid: a session of its own, which the device machine leaves running after the call.
    setsid nohup bash -c 'bash scripts/gpu-check.sh --out "$0/out" "$@"; echo $? > "$0/exit-status"' \
      "$dir" "$@" > "$dir/console.txt" 2>&1 < /dev/null &
    echo $! > "$dir/pid"
    echo "gpu-session: started scripts/gpu-check.sh $* (pid $!), writing to $dir/out"
    limit=${REMAT_SESSION_WAIT:-560}
    ;;
  wait)
    limit=${1:-560}
    case "$limit" in '' | *[!0-9]*) usage ;; esac
    ;;
  *) usage ;;
esac
[ -n "$out" ] || { echo "gpu-session: no folder to hand back into (set OUT or pass --out DIR)" >&2; exit 2; }
if [ ! -f "$dir/pid" ]; then
  echo "gpu-session: no check was started on this machine (given back since?): start again" >&2
  exit 4
fi

waited=0
while running && [ "$waited" -lt "$limit" ]; do
  sleep 5
  waited=$((waited + 5))
done

# Hand back what there is.
mkdir -p "$out"
log=$dir/out/gpu-check.log
[ -f "$log" ] && cp "$log" "$out/gpu-check.log"
cp "$dir/console.txt" "$out/console.txt"
tar -czf "$out/results.tar.gz" -C "$dir" out
lines=$( [ -f "$log" ] && wc -l < "$log" || echo 0)
shown=$(cat "$dir/shown" 2>/dev/null || echo 0)
echo "---- progress"
[ -f "$log" ] && grep '^== ' "$log"
echo "---- the log's lines $((shown + 1)) to $lines (the last 150 of them)"
[ -f "$log" ] && tail -n +"$((shown + 1))" "$log" | tail -n 150
echo "$lines" > "$dir/shown"
if running; then
  echo "gpu-session: still running after ${waited} s of waiting: call '$0 wait' again now"
  exit 3
fi
if [ ! -f "$dir/exit-status" ]; then
  echo "gpu-session: the check stopped without an exit status; console.txt:" >&2
  tail -n 20 "$dir/console.txt" >&2
  exit 1
fi
code=$(cat "$dir/exit-status")
echo "gpu-session: the check ended: $( [ "$code" = 0 ] && echo passed || echo "FAILED (exit $code)" )"
[ "$code" = 0 ] && exit 0
exit 1
