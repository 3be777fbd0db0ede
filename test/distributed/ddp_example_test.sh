#!/usr/bin/env bash
# The DDP example through the launcher, as a user starts it: 2 ranks, each mode; every
# rank must finish and print the same weights checksum (the gradients were averaged), and
# the compiled modes must have replayed.
#   test/distributed/ddp_example_test.sh <tools/launch.sh> <ddp_mnist> [mode flag]
set -euo pipefail
launch=$1 prog=$2
shift 2
out=$(TCAP_DIST_TIMEOUT_S=60 "$launch" 2 "$prog" --steps 8 --batch 8 "$@")
echo "$out"
sums=$(echo "$out" | sed -n 's/.*weights checksum \([0-9.]*\).*/\1/p' | sort -u)
ranks=$(echo "$out" | grep -c "weights checksum")
[ "$ranks" -eq 2 ] || { echo "FAIL: $ranks rank(s) finished, expected 2" >&2; exit 1; }
[ "$(echo "$sums" | wc -l)" -eq 1 ] || { echo "FAIL: the ranks' weights differ: $sums" >&2; exit 1; }
if [ $# -gt 0 ]; then
  echo "$out" | grep -Eq "\(compiled( step)?: [1-9][0-9]* replays\)" || { echo "FAIL: nothing was replayed" >&2; exit 1; }
fi
echo "PASS: 2 ranks, checksum $sums"
