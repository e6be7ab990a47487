#!/usr/bin/env bash
# Builds the conformance suite on the host (debug) and runs its `rdma::` cases inside the
# Soft-RoCE VM (rxe0 <-> rxe1 over a veth pair, GID index 1). Exit status is the test binary's
# (125 = VM failure, 124 = timeout). Extra arguments go to the test binary (e.g. a case name
# filter such as `rdma::send_recv_basic`, or `--show-output` to see the NOT RUN reasons).
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
for a in "$@"; do case "$a" in rdma::*) filter=;; esac; done
exec "$HERE/rxe-vm" --timeout "${RXE_VM_TIMEOUT:-900}" -- \
  env DP_CONFORMANCE_RDMA=1 RUST_BACKTRACE=1 "$bin" $filter --test-threads 2 "$@"
