#!/usr/bin/env bash
# ThreadSanitizer over the dataplane crate's concurrency tests (issue 15): the shm rings
# (MPMC and head-tracked, the bounded-SRQ case), the buffer pool and its caches, the event
# and CQ rings, run by the crate's unit tests on several threads; with `--test conformance`
# also every verbs case on shm (senders and pollers on several threads, SRQs shared by QPs
# of two senders, channels woken from another thread). CI runs `--lib --test conformance`. Needs the nightly toolchain
# with rust-src (std is rebuilt with TSan: -Zbuild-std); installs rust-src if missing and
# fails loudly if it cannot. Any race report fails the run (halt_on_error).
#   tools/tsan.sh [extra cargo test args, e.g. --test conformance]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo +nightly --version >/dev/null 2>&1 || { echo "tsan: the nightly toolchain is missing" >&2; exit 1; }
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
    rustup component add rust-src --toolchain nightly || { echo "tsan: cannot install rust-src for nightly" >&2; exit 1; }
fi
target=$(rustc -vV | sed -n 's/^host: //p')
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--lib)
RUSTFLAGS="-Zsanitizer=thread" RUSTDOCFLAGS="-Zsanitizer=thread" TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    cargo +nightly test -Zbuild-std --target "$target" --target-dir target/tsan -p dataplane "${args[@]}" -- --test-threads 2
