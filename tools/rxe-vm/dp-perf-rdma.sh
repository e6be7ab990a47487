#!/usr/bin/env bash
# Inside tools/rxe-vm: every dp-perf test on the rdma provider, as client (rxe0) and server
# (rxe1, 198.18.0.2) and with --loopback on rxe0, plus UC, UD, SRQ, several QPs, post lists,
# -b and -D. Functional only (few iterations): one ok/FAIL line per run; exit status = failures.
# DP_PERF_ALL=1 also runs the other four tests in loopback. ~2 min under TCG.
#   tools/rxe-vm/rxe-vm -- tools/rxe-vm/dp-perf-rdma.sh [target/release/dp-perf]
set -u
DP=${1:-target/release/dp-perf}
G=${RXE_GID_INDEX:-1}
IP_B=${RXE_IP_B:-198.18.0.2}
[ -x "$DP" ] || { echo "dp-perf-rdma.sh: $DP is not an executable" >&2; exit 1; }
LOG=$(mktemp -d /tmp/dp-perf-rdma.XXXXXX)
fails=0 port=19700 n=0

wait_tcp() { # port pid
  local i; for ((i = 0; i < 400; i++)); do
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
    kill -0 "$2" 2>/dev/null || return 1; sleep 0.05
  done; return 1
}
row() { grep -E '^ *[0-9]+ +[0-9]+ ' "$1" | tail -n 1 | tr -s ' ' ' '; }
report() { # label ok? file
  if [ "$2" = 0 ]; then printf 'ok   %-40s %s\n' "$1" "$(row "$3")"
  else fails=$((fails + 1)); printf 'FAIL %-40s\n' "$1"; tail -n 4 "$3" | sed 's/^/     | /'; fi
}
# net TEST ARGS...: server on rxe1, client on rxe0 (the server takes the client's parameters).
net() {
  local test=$1 spid crc src; shift; n=$((n + 1)) port=$((port + 1))
  timeout 90 "$DP" "$test" --provider rdma -d rxe1 -x "$G" -p $port >"$LOG/$n.srv" 2>&1 & spid=$!
  wait_tcp $port $spid
  timeout 80 "$DP" "$test" --provider rdma -d rxe0 -x "$G" -p $port "$@" "$IP_B" >"$LOG/$n.cli" 2>&1; crc=$?
  [ $crc = 0 ] || kill $spid 2>/dev/null
  wait $spid; src=$?
  [ $src = 0 ] || cat "$LOG/$n.srv" >>"$LOG/$n.cli"
  report "$test $* (rxe0 -> rxe1)" $((crc + src)) "$LOG/$n.cli"
}
# loop TEST ARGS...: both ends in one process on rxe0.
loop() {
  local test=$1; shift; n=$((n + 1))
  timeout 80 "$DP" "$test" --provider rdma -d rxe0 -x "$G" --loopback --core -1 --peer-core -1 "$@" \
    >"$LOG/$n.out" 2>&1
  report "$test $* (loopback rxe0)" $? "$LOG/$n.out"
}

for t in send_bw write_bw read_bw atomic_bw; do net $t -s 64 -n 500; done
for t in send_lat write_lat read_lat atomic_lat; do net $t -n 200; done
# Loopback: one test per verb, both kinds (every run costs a few seconds of emulation).
for t in write_bw atomic_bw; do loop $t -s 64 -n 500; done
for t in send_lat read_lat; do loop $t -n 200; done
[ "${DP_PERF_ALL:-0}" = 1 ] && for t in send_bw read_bw; do loop $t -s 64 -n 500; done
[ "${DP_PERF_ALL:-0}" = 1 ] && for t in write_lat atomic_lat; do loop $t -n 200; done
net send_bw -c UC -s 512 -n 500
net write_lat -c UC -n 200
net send_bw -c UD -s 512 -n 500
net send_lat -c UD -s 64 -n 200
net send_bw --use-srq -q 4 -s 256 -n 300
net send_bw -b -q 2 -s 256 -n 300
net write_bw -q 2 -l 8 -s 1024 -n 800
net read_bw -D 1 -s 4096
net send_lat -c UD -a -n 20
echo "# $fails failure(s); logs in $LOG"
exit $fails
