#!/usr/bin/env bash
# Builds the conformance suite on the host (debug) and runs its `rdma::` cases inside the
# Soft-RoCE VM (rxe0 <-> rxe1 over a veth pair, GID index 1). The output ends with
# `conformance: P passed, F failed, N not run` (conformance-summary.sh: libtest alone counts
# the NOT RUN cases as passed; the binary runs with --show-output so their reasons show).
# Exit status: rxe-vm's when it failed (125 = VM failure, 124 = timeout), else 1 if a case
# failed or the run did not finish. Extra arguments go to the test binary (e.g. a case name
# filter such as `rdma::send_recv_basic`).
#
#   tools/rxe-vm/conformance.sh                 # ~1 min incremental build + ~16 s VM run
#   RXE_VM_TIMEOUT=600 tools/rxe-vm/conformance.sh -- --show-output
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
[ "${1:-}" = "--" ] && shift
bin=$(cargo test -p dataplane --test conformance --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*conformance-[^"]*\)".*/\1/p' | tail -1)
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "conformance.sh: building the conformance suite failed:" >&2
  cargo test -p dataplane --test conformance --no-run >&2 || true
  exit 1
fi
"$HERE/rxe-vm" --prepare
filter=rdma::
show=--show-output
for a in "$@"; do
  case "$a" in
    rdma::*) filter=;;
    --show-output|--nocapture) show=;;
  esac
done
set +e
"$HERE/rxe-vm" --timeout "${RXE_VM_TIMEOUT:-900}" -- \
  env DP_CONFORMANCE_RDMA=1 RUST_BACKTRACE=1 "$bin" $filter --test-threads 2 $show "$@" \
  | "$HERE/conformance-summary.sh"
st=("${PIPESTATUS[@]}")
set -e
[ "${st[0]}" -eq 0 ] || exit "${st[0]}"
exit "${st[1]}"
