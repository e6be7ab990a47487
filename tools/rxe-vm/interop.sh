#!/usr/bin/env bash
# Inside tools/rxe-vm: dp-pingpong against rdma-core's ibv_rc_pingpong, ibv_ud_pingpong and
# ibv_srq_pingpong, both directions, plus dp-pingpong against itself; the RC pairings also run
# with -c (--chk: the server validates the received buffer; rdma-core's server prints
# "invalid data in page N" and still exits 0, so that line fails the pairing). Prints one
# ok/FAIL line per pairing; exit status = number of failures. ~1-3 min under TCG.
#   tools/rxe-vm/rxe-vm -- tools/rxe-vm/interop.sh [target/debug/dp-pingpong]
set -u
DP=${1:-target/debug/dp-pingpong}
G=${RXE_GID_INDEX:-1}
IP_B=${RXE_IP_B:-198.18.0.2}
N=${INTEROP_ITERS:-200}
fails=0
pairing() { # name server-cmd client-cmd
  local name=$1 srv=$2 cli=$3 port=$((18515 + RANDOM % 1000))
  $srv -p $port >/tmp/srv.$$ 2>&1 & local sp=$!
  for _ in $(seq 100); do ss -ltn 2>/dev/null | grep -q ":$port " && break; sleep 0.2; done
  if timeout 60 $cli -p $port $IP_B >/tmp/cli.$$ 2>&1 && wait $sp \
     && ! grep -q "invalid data" /tmp/srv.$$ /tmp/cli.$$; then
    echo "ok   $name: $(grep usec/iter /tmp/cli.$$ | head -1)"
  else
    kill $sp 2>/dev/null; wait $sp 2>/dev/null
    echo "FAIL $name"; tail -5 /tmp/srv.$$ | sed 's/^/  server: /'; tail -5 /tmp/cli.$$ | sed 's/^/  client: /'
    fails=$((fails + 1))
  fi
}
pairing "dp server  <- ibv_rc_pingpong client" "$DP -d rxe1 -g $G -n $N" "ibv_rc_pingpong -d rxe0 -g $G -n $N"
pairing "ibv_rc_pingpong server <- dp client" "ibv_rc_pingpong -d rxe1 -g $G -n $N" "$DP -d rxe0 -g $G -n $N"
pairing "dp server  <- dp client" "$DP -d rxe1 -g $G -n $N" "$DP -d rxe0 -g $G -n $N"
pairing "dp -c server <- ibv_rc_pingpong -c client" "$DP -c -s 8192 -d rxe1 -g $G -n $N" "ibv_rc_pingpong -c -s 8192 -d rxe0 -g $G -n $N"
pairing "ibv_rc_pingpong -c server <- dp -c client" "ibv_rc_pingpong -c -s 8192 -d rxe1 -g $G -n $N" "$DP -c -s 8192 -d rxe0 -g $G -n $N"
pairing "dp --ud server <- ibv_ud_pingpong client" "$DP --ud -s 512 -d rxe1 -g $G -n $N" "ibv_ud_pingpong -s 512 -d rxe0 -g $G -n $N"
pairing "ibv_ud_pingpong server <- dp --ud client" "ibv_ud_pingpong -s 512 -d rxe1 -g $G -n $N" "$DP --ud -s 512 -d rxe0 -g $G -n $N"
pairing "dp --srq server <- ibv_srq_pingpong client" "$DP --srq -d rxe1 -g $G -n $N" "ibv_srq_pingpong -d rxe0 -g $G -n $N"
pairing "ibv_srq_pingpong server <- dp --srq client" "ibv_srq_pingpong -d rxe1 -g $G -n $N" "$DP --srq -d rxe0 -g $G -n $N"
exit $fails
