#!/usr/bin/env bash
# Inside tools/rxe-vm: `dataplane run` on the rdma provider over Soft-RoCE.
#   1. config/examples/echo-rdma.toml: loopback echo, both QPs on rxe0;
#   2. config/examples/remote-server-rdma.toml (rxe1, 198.18.0.2) and remote-client-rdma.toml
#      (rxe0) as two processes, endpoints exchanged over TCP, RoCE v2 across the veth pair.
# Each run must show traffic (> 0 messages at the sink), no sequence gap, no leaked buffer and
# a complete drain (the server side: stopped by the client leaving, nothing leaked). Prints one
# ok/FAIL line per check; exit status = number of failures. ~30-60 s under TCG.
#   tools/rxe-vm/rxe-vm -- tools/rxe-vm/run.sh [target/debug/dataplane]
set -u
DP=${1:-target/debug/dataplane}
DUR=${RUN_DURATION:-3s}
EX=config/examples
OUT=$(mktemp -d)
fails=0
[ -x "$DP" ] || { echo "FAIL $DP is not built (cargo build -p dataplane-apps --bin dataplane)"; exit 1; }
command -v python3 >/dev/null || { echo "FAIL python3 is needed to read the JSON summaries"; exit 1; }

# check NAME JSON-FILE STDERR-FILE EXIT-STATUS ROLE: ROLE "sink" needs traffic at a sink,
# "echo" at an echo stage.
check() {
  local name=$1 json=$2 err=$3 rc=$4 role=$5 why
  why=$(python3 - "$json" "$role" <<'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no JSON summary ({e})"); sys.exit(0)
role = sys.argv[2]
stages = [s for w in j["workers"] for s in w["stages"] if s["kind"] == role]
msgs = sum(s["msgs"] for s in stages)
errors = sum(w["errors"] for w in j["workers"])
bad = []
if not stages or msgs == 0: bad.append(f"no traffic at the {role} stage")
if j["gaps"] != 0: bad.append(f"{j['gaps']} sequence gaps")
if j["leaked"] != 0: bad.append(f"{j['leaked']} leaked buffers")
if not j["drained"]: bad.append("drain incomplete")
if errors != 0: bad.append(f"{errors} errors")
print("; ".join(bad) if bad else f"OK {msgs} messages at the {role}, 0 gaps, 0 leaked")
EOF
)
  if [ "$rc" = 0 ] && [ "${why#OK }" != "$why" ]; then
    echo "ok   $name: ${why#OK } (${SECONDS}s)"
  else
    echo "FAIL $name: exit $rc; $why (${SECONDS}s)"
    sed 's/^/  stderr: /' "$err" | tail -8
    fails=$((fails + 1))
  fi
}

# 1. Loopback echo on one device.
timeout 120 "$DP" run $EX/echo-rdma.toml --duration "$DUR" --json >"$OUT/echo.json" 2>"$OUT/echo.err"
check "echo-rdma.toml (rxe0 loopback)" "$OUT/echo.json" "$OUT/echo.err" $? sink

# 2. Two processes: server on rxe1 first (it listens), then the client on rxe0 (it retries
# its connection until the server listens). The server stops when the client's process ends.
timeout 180 "$DP" run $EX/remote-server-rdma.toml --json >"$OUT/srv.json" 2>"$OUT/srv.err" &
srv=$!
timeout 120 "$DP" run $EX/remote-client-rdma.toml --duration "$DUR" --json >"$OUT/cli.json" 2>"$OUT/cli.err"
crc=$?
# The server follows within a moment; if the client failed, do not wait for a peer that
# will never come.
[ $crc = 0 ] || kill $srv 2>/dev/null
wait $srv
src=$?
check "remote-client-rdma.toml (rxe0 -> 198.18.0.2)" "$OUT/cli.json" "$OUT/cli.err" $crc sink
check "remote-server-rdma.toml (rxe1, listening)" "$OUT/srv.json" "$OUT/srv.err" $src echo
rm -rf "$OUT"
exit $fails
