#!/usr/bin/env bash
# Passes the conformance binary's output (libtest, run with --show-output) through and ends it
# with one line that counts the cases that said NOT RUN apart from those that passed:
#
#   conformance: 63 passed, 0 failed, 15 not run
#
# libtest counts a case that returned early with "conformance case NAME NOT RUN ..." as passed;
# this line does not. Exit status: 1 if a case failed or no "test result:" line came (the run
# did not finish), else 0. `conformance-summary.sh --self-test` checks the counting on sample
# output and exits non-zero on a mismatch.
set -euo pipefail

summarize() {
    awk '
        { print; fflush() }
        /^test result: / {
            results++
            if (match($0, /[0-9]+ passed/)) passed += substr($0, RSTART, RLENGTH) + 0
            if (match($0, /[0-9]+ failed/)) failed += substr($0, RSTART, RLENGTH) + 0
        }
        /conformance case [A-Za-z0-9_]+ NOT RUN/ {
            if (match($0, /conformance case [A-Za-z0-9_]+ /)) {
                name = substr($0, RSTART + 17, RLENGTH - 18)
                if (!(name in notrun)) { notrun[name] = 1; skipped++ }
            }
        }
        END {
            if (!results) {
                print "conformance: no \"test result:\" line: the run did not finish"
                exit 1
            }
            printf "conformance: %d passed, %d failed, %d not run\n", passed - skipped, failed, skipped
            exit failed > 0 ? 1 : 0
        }'
}

self_test() {
    local sample out rc
    # Two NOT RUN cases (one printed twice, as --show-output and a retry could), one failure.
    sample='running 5 tests
test rdma::a ... ok
test rdma::b ... ok
test rdma::c ... ok
test rdma::d ... FAILED
test rdma::e ... ok

successes:

---- rdma::b stdout ----
conformance case b NOT RUN on rdma: rxe has no tag matching
conformance case b NOT RUN on rdma: rxe has no tag matching

---- rdma::e stdout ----
conformance case e NOT RUN on rdma: rxe rounds its queues up

test result: FAILED. 4 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s'
    rc=0; out=$(printf '%s\n' "$sample" | summarize) || rc=$?
    [[ $(tail -n 1 <<<"$out") == "conformance: 2 passed, 1 failed, 2 not run" && $rc == 1 ]] ||
        { echo "self-test: mixed run: got rc=$rc, last line: $(tail -n 1 <<<"$out")" >&2; return 1; }
    [[ $(printf '%s\n' "$sample" | summarize | wc -l) -eq $(( $(printf '%s\n' "$sample" | wc -l) + 1 )) ]] ||
        { echo "self-test: the output is not passed through whole" >&2; return 1; }
    rc=0; out=$(printf '%s\n' "test rdma::a ... ok" \
        "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out" | summarize) || rc=$?
    [[ $(tail -n 1 <<<"$out") == "conformance: 1 passed, 0 failed, 0 not run" && $rc == 0 ]] ||
        { echo "self-test: clean run: got rc=$rc, last line: $(tail -n 1 <<<"$out")" >&2; return 1; }
    rc=0; out=$(printf '%s\n' "running 3 tests" "test rdma::a ... ok" | summarize) || rc=$?
    [[ $(tail -n 1 <<<"$out") == *"the run did not finish"* && $rc == 1 ]] ||
        { echo "self-test: cut-off run: got rc=$rc, last line: $(tail -n 1 <<<"$out")" >&2; return 1; }
    echo "conformance-summary.sh: self-test ok"
}

case "${1:-}" in
    --self-test) self_test ;;
    "") summarize ;;
    *) echo "usage: conformance-summary.sh [--self-test] < libtest-output" >&2; exit 2 ;;
esac
