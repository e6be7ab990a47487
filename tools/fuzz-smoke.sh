#!/usr/bin/env bash
# Fuzz smoke: builds the cargo-fuzz targets in fuzz/ and runs each for a short, bounded time
# against its committed corpus (fuzz/corpus/<target>/). Fails on any crash, leak or timeout
# (libFuzzer exits non-zero and leaves the input in fuzz/artifacts/<target>/).
#
#   tools/fuzz-smoke.sh [SECONDS_PER_TARGET] [TARGET...]     (default 20 s, every target)
#
# Needs the nightly toolchain (cargo-fuzz builds with -Zsanitizer=address); installs
# cargo-fuzz if it is missing. Runs under `nice -n 19`: it shares the machine.
set -euo pipefail

cd "$(dirname "$0")/../fuzz"
secs="${1:-20}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(config exchange stats shm_header trading packet)
fi

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz-smoke: FAILED: the nightly toolchain is missing (rustup toolchain install nightly); cargo-fuzz needs it" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: installing cargo-fuzz" >&2
    nice -n 19 cargo install --locked cargo-fuzz
fi

echo "fuzz-smoke: building the fuzz targets"
if ! nice -n 19 cargo +nightly fuzz build -O >/tmp/fuzz-smoke-build.$$ 2>&1; then
    tail -n 40 /tmp/fuzz-smoke-build.$$ >&2
    rm -f /tmp/fuzz-smoke-build.$$
    echo "fuzz-smoke: FAILED: the fuzz targets do not build" >&2
    exit 1
fi
rm -f /tmp/fuzz-smoke-build.$$

failed=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    # A scratch copy: new inputs found during the smoke must not dirty the committed corpus.
    scratch="$(mktemp -d)"
    log="$(mktemp)"
    start=$(date +%s)
    if nice -n 19 cargo +nightly fuzz run -O "$t" "$scratch" "corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
        status=ok
    else
        status=CRASH
        failed+=("$t")
    fi
    # (`|| true`: a target that crashed at once has no "Done" line, and under pipefail the
    # failed grep ended the script silently instead of reporting the crash below.)
    runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -n 1 | awk '{print $2}' || true)
    echo "fuzz-smoke: $t: $status, ${runs:-?} runs in $(($(date +%s) - start)) s"
    if [ "$status" != ok ]; then
        grep -E 'ERROR|panicked|SUMMARY|Test unit written|artifact' "$log" | head -n 20 >&2 || tail -n 40 "$log" >&2
    fi
    rm -rf "$scratch" "$log"
done

if [ ${#failed[@]} -ne 0 ]; then
    echo "fuzz-smoke: FAILED: ${failed[*]} (inputs in fuzz/artifacts/<target>/)" >&2
    exit 1
fi
echo "fuzz-smoke: ${#targets[@]} passed, 0 failed"
