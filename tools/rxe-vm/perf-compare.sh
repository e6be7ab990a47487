#!/usr/bin/env bash
# Inside tools/rxe-vm: perftest and dp-perf (rdma provider) with the same parameters, in one VM
# run: server on rxe1 (198.18.0.2, GID index 1), client on rxe0. Prints one table (test, metric,
# perftest value, dp-perf value, ratio dp-perf/perftest); with --json, also one JSON object on
# the last line. Exit status = number of runs that failed (an error or a hang, never a slow
# number). Emulated rxe numbers compare the tools within one run, not to hardware.
#   tools/rxe-vm/rxe-vm -- tools/rxe-vm/perf-compare.sh [--json] [--quick] [--repeat N] [target/release/dp-perf]
# --quick: few iterations (CI). PERF_LAT_ITERS / PERF_BW_ITERS override the iteration counts.
# --repeat N: each pair N times, perftest and dp-perf alternating; the table shows each tool's
# median and the median of the per-pair ratios (rxe rates swing ~30% from run to run).
set -u
JSON=0 QUICK=0 DP=target/release/dp-perf REPEAT=1 want_n=0
for a in "$@"; do
  if [ "$want_n" = 1 ]; then REPEAT=$a; want_n=0; continue; fi
  case "$a" in
    --json) JSON=1 ;;
    --quick) QUICK=1 ;;
    --repeat) want_n=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    -*) echo "perf-compare.sh: unknown option $a" >&2; exit 2 ;;
    *) DP=$a ;;
  esac
done
case "$REPEAT" in ''|*[!0-9]*|0) echo "perf-compare.sh: --repeat needs a positive count, got '$REPEAT'" >&2; exit 2 ;; esac
G=${RXE_GID_INDEX:-1}
IP_B=${RXE_IP_B:-198.18.0.2}
if [ "$QUICK" = 1 ]; then LAT_N=300 BW_N=2000; else LAT_N=5000 BW_N=50000; fi
LAT_N=${PERF_LAT_ITERS:-$LAT_N} BW_N=${PERF_BW_ITERS:-$BW_N}
[ -x "$DP" ] || { echo "perf-compare.sh: $DP is not an executable (cargo build --release -p dataplane-apps --bin dp-perf)" >&2; exit 1; }
for p in ib_send_lat ib_send_bw ib_write_bw; do
  command -v $p >/dev/null || { echo "perf-compare.sh: $p not found (apt-get install perftest)" >&2; exit 1; }
done
case " ${RXE_DEVS:-} " in *" rxe1 "*) ;; *) echo "perf-compare.sh: needs rxe0 and rxe1 (RXE_DEVS='${RXE_DEVS:-}'; run inside tools/rxe-vm/rxe-vm)" >&2; exit 1 ;; esac
LOG=$(mktemp -d /tmp/perf-compare.XXXXXX)
fails=0 port=19500 rows=() json=()

wait_tcp() { # port pid
  local i; for ((i = 0; i < 400; i++)); do
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
    kill -0 "$2" 2>/dev/null || return 1; sleep 0.05
  done; return 1
}
# pair NAME "SERVER CMD" "CLIENT CMD": runs both, leaves the client's output in $LOG/NAME.cli.
# Returns non-zero (and prints why) when either side fails or hangs.
pair() {
  local name=$1 srv=$2 cli=$3 spid crc src
  timeout 150 $srv >"$LOG/$name.srv" 2>&1 & spid=$!
  if ! wait_tcp $port $spid; then
    wait $spid; echo "FAIL $name: server did not listen: $(tail -n 3 "$LOG/$name.srv")" >&2; return 1
  fi
  timeout 140 $cli "$IP_B" >"$LOG/$name.cli" 2>&1; crc=$?
  [ $crc = 0 ] || kill $spid 2>/dev/null
  wait $spid; src=$?
  if [ $crc != 0 ] || [ $src != 0 ]; then
    echo "FAIL $name (client rc=$crc, server rc=$src)" >&2
    tail -n 4 "$LOG/$name.cli" | sed 's/^/  client: /' >&2
    tail -n 4 "$LOG/$name.srv" | sed 's/^/  server: /' >&2
    return 1
  fi
}
# col FILE N: column N of the last result row (both tools print perftest's row layout).
col() { grep -E '^ *[0-9]+ +[0-9]+ ' "$1" | tail -n 1 | awk -v n="$2" '{print $n}'; }

# median of the arguments (empty when none)
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

# compare LABEL PERFTEST-PROG DP-TEST SIZE ITERS COLUMN METRIC
compare() {
  local label=$1 prog=$2 test=$3 size=$4 n=$5 c=$6 metric=$7 pt dp ratio r a b
  local common="-x $G -s $size -n $n -I 0 -F" # -I 0: perftest's inline on rxe
  local pts=() dps=() ratios=()
  for ((r = 1; r <= REPEAT; r++)); do
    port=$((port + 1)); a=; b=
    if pair "pt-$test-$size-$r" "$prog -d rxe1 -p $port $common" "$prog -d rxe0 -p $port $common"; then
      a=$(col "$LOG/pt-$test-$size-$r.cli" "$c"); pts+=("$a")
    else fails=$((fails + 1)); fi
    port=$((port + 1))
    if pair "dp-$test-$size-$r" "$DP $test --provider rdma -d rxe1 -p $port $common" \
                                "$DP $test --provider rdma -d rxe0 -p $port $common"; then
      b=$(col "$LOG/dp-$test-$size-$r.cli" "$c"); dps+=("$b")
    else fails=$((fails + 1)); fi
    if [ -n "$a" ] && [ -n "$b" ]; then
      ratios+=("$(awk -v d="$b" -v p="$a" 'BEGIN { if (d > 0 && p > 0) print d / p }')")
    fi
  done
  pt=$(median "${pts[@]}"); dp=$(median "${dps[@]}"); ratio=$(median "${ratios[@]}")
  if [ -n "$ratio" ]; then ratio=$(printf '%.2f' "$ratio"); else ratio=-; fi
  if [ "$REPEAT" -gt 1 ]; then echo "# $label: perftest ${pts[*]:-} | dp-perf ${dps[*]:-}"; fi
  rows+=("$(printf '%-18s %-22s %12s %12s %8s' "$label" "$metric" "${pt:--}" "${dp:--}" "$ratio")")
  json+=("{\"test\":\"$label\",\"metric\":\"$metric\",\"perftest\":${pt:-null},\"dp_perf\":${dp:-null},\"ratio\":$([ "$ratio" = - ] && echo null || echo "$ratio")}")
}

echo "# perftest vs dp-perf on rxe ($(uname -r), $(nproc) vCPU); latency $LAT_N iterations, bandwidth $BW_N"
compare "send_lat 8 B"     ib_send_lat send_lat 8    "$LAT_N" 5 "t_typical[usec]"
compare "send_bw 8 B"      ib_send_bw  send_bw  8    "$BW_N"  5 "MsgRate[Mpps]"
compare "send_bw 4 KiB"    ib_send_bw  send_bw  4096 "$BW_N"  4 "BW average[MB/sec]"
compare "write_bw 8 B"     ib_write_bw write_bw 8    "$BW_N"  5 "MsgRate[Mpps]"
compare "write_bw 4 KiB"   ib_write_bw write_bw 4096 "$BW_N"  4 "BW average[MB/sec]"

echo
printf '%-18s %-22s %12s %12s %8s\n' test metric perftest dp-perf ratio
printf '%s\n' "${rows[@]}"
echo "# ratio = dp-perf / perftest (latency: lower is better; rates: higher is better)"
[ "$REPEAT" = 1 ] || echo "# $REPEAT alternating runs each: medians, ratio = median of the per-pair ratios"
echo "# cross-interop (dp-perf client against an ib_*_bw server): not run, the exchanges differ"
echo "# (perftest negotiates versions and parameters in its own format; see docs/dp-perf.md)"
[ $fails = 0 ] || echo "# $fails run(s) failed; logs in $LOG"
if [ "$JSON" = 1 ]; then
  (IFS=,; echo "{\"lat_iters\":$LAT_N,\"bw_iters\":$BW_N,\"repeat\":$REPEAT,\"failures\":$fails,\"results\":[${json[*]}]}")
fi
exit $fails
