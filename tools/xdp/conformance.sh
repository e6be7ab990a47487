#!/usr/bin/env bash
# Runs the conformance suite's `xdp::` cases (RAW_PACKET over AF_XDP): each case unshares a
# network namespace for its thread and creates a veth pair in it (dpxa <-> dpxb), so nothing
# outside is touched and nothing is left behind. Needs root and iproute2. Ends with
# `conformance: P passed, F failed, N not run` (tools/rxe-vm/conformance-summary.sh) and fails
# if a case failed or fewer than MIN_RUN (default 10) cases ran: a run where every case said
# NOT RUN is a failure here, not a pass.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
[ "$(id -u)" = 0 ] || { echo "xdp conformance: needs root (network namespaces, veth, BPF)" >&2; exit 1; }
command -v ip >/dev/null || { echo "xdp conformance: needs iproute2 (ip)" >&2; exit 1; }
set +e
out=$(DP_CONFORMANCE_XDP=1 RUST_BACKTRACE=1 cargo test -q -p dataplane --test conformance xdp:: -- --show-output "$@" 2>&1 \
  | tools/rxe-vm/conformance-summary.sh)
rc=$?
set -e
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || exit "$rc"
ran=$(tail -n 1 <<<"$out" | sed -n 's/^conformance: \([0-9]*\) passed.*/\1/p')
if [ "${ran:-0}" -lt "${MIN_RUN:-10}" ]; then
  echo "xdp conformance: only ${ran:-0} cases ran (expected at least ${MIN_RUN:-10})" >&2
  exit 1
fi
