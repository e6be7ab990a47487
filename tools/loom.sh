#!/usr/bin/env bash
# Model-checks the lock-free rings (shm::ring, shm::msgq, mem::pool) and the send queue's
# lock (shm::sq_lock) with loom: every interleaving of the `loom_*` tests (up to
# LOOM_MAX_PREEMPTIONS preemptions, default 3). A separate build (`--cfg loom`, its own target
# directory) so it never disturbs the normal one.
#   tools/loom.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/loom}
cargo test --release -p dataplane --lib loom -- --nocapture
