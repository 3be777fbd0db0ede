#!/usr/bin/env bash
# Starts N local ranks of a program, as torchrun does for one node:
#   tools/launch.sh N prog [args...]
# Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR (default 127.0.0.1) and
# MASTER_PORT (default: a free port), and OMP_NUM_THREADS=1 unless set. Rank r's output
# is prefixed "[r] ". If a rank fails, the others are stopped and the launcher exits with
# that rank's status; tcap::distributed::init_from_env() reads the variables.
set -euo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
  echo "usage: tools/launch.sh N prog [args...]" >&2
  exit 2
fi
n=$1
shift
addr=${MASTER_ADDR:-127.0.0.1}
port=${MASTER_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup INT TERM
for ((r = 0; r < n; r++)); do
  ( RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n MASTER_ADDR=$addr MASTER_PORT=$port "$@" 2>&1 | sed -u "s/^/[$r] /" ; exit "${PIPESTATUS[0]}" ) &
  pids+=($!)
done
status=0
# The first rank to fail stops the others (they would otherwise wait out their timeout).
while [ ${#pids[@]} -gt 0 ]; do
  set +e
  wait -n -p done_pid "${pids[@]}"
  rc=$?
  set -e
  remaining=()
  for p in "${pids[@]}"; do [ "$p" != "$done_pid" ] && remaining+=("$p"); done
  pids=("${remaining[@]+"${remaining[@]}"}")
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$rc
    echo "[launch] a rank exited with status $rc; stopping the others" >&2
    cleanup
  fi
done
exit "$status"
