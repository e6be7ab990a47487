#!/usr/bin/env bash
# Inside tools/rxe-vm: `dataplane run` on the rdma provider over Soft-RoCE.
#   1. config/examples/echo-rdma.toml: loopback echo, both QPs on rxe0;
#   2. config/examples/remote-server-rdma.toml (rxe1, 198.18.0.2) and remote-client-rdma.toml
#      (rxe0) as two processes, endpoints exchanged over TCP, RoCE v2 across the veth pair;
#   3. the same pair with UD QPs (address handles built from the exchanged GIDs).
# Each run must show traffic (> 0 messages at the sink, each carrying exactly its 64 bytes),
# no error, no leaked buffer, no sequence gap and a complete drain (the server side: stopped
# by the client leaving). UD may lose datagrams (an empty SRQ, a busy Soft-RoCE): there, gaps
# and an incomplete drain are reported as losses, not failures. Prints one ok/FAIL line per
# check; exit status = number of failures. ~1-2 min under TCG.
#   tools/rxe-vm/rxe-vm -- tools/rxe-vm/run.sh [target/debug/dataplane]
set -u
DP=${1:-target/debug/dataplane}
DUR=${RUN_DURATION:-3s}
EX=config/examples
OUT=$(mktemp -d)
fails=0
[ -x "$DP" ] || { echo "FAIL $DP is not built (cargo build -p dataplane-apps --bin dataplane)"; exit 1; }
command -v python3 >/dev/null || { echo "FAIL python3 is needed to read the JSON summaries"; exit 1; }

# check NAME JSON-FILE STDERR-FILE EXIT-STATUS ROLE [lossy]: ROLE "sink" needs traffic at a
# sink, "echo" at an echo stage; "lossy" (UD) tolerates gaps and an incomplete drain (exit 2).
check() {
  local name=$1 json=$2 err=$3 rc=$4 role=$5 lossy=${6:-} why
  why=$(python3 - "$json" "$role" "$lossy" <<'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no JSON summary ({e})"); sys.exit(0)
role, lossy = sys.argv[2], sys.argv[3] == "lossy"
stages = [s for w in j["workers"] for s in w["stages"] if s["kind"] == role]
msgs = sum(s["msgs"] for s in stages)
nbytes = sum(s["bytes"] for s in stages)
errors = sum(w["errors"] for w in j["workers"])
bad = []
if not stages or msgs == 0: bad.append(f"no traffic at the {role} stage")
if nbytes != 64 * msgs: bad.append(f"{nbytes} bytes in {msgs} 64-byte messages")
if j["leaked"] != 0: bad.append(f"{j['leaked']} leaked buffers")
if errors != 0: bad.append(f"{errors} errors")
if not lossy and j["gaps"] != 0: bad.append(f"{j['gaps']} sequence gaps")
if not lossy and not j["drained"]: bad.append("drain incomplete")
lost = f", {j['gaps']} lost" if lossy else ", 0 gaps"
print("; ".join(bad) if bad else f"OK {msgs} messages at the {role}{lost}, 0 leaked")
EOF
)
  if { [ "$rc" = 0 ] || { [ -n "$lossy" ] && [ "$rc" = 2 ]; }; } && [ "${why#OK }" != "$why" ]; then
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

# pair TAG SERVER-CONFIG CLIENT-CONFIG: the server on rxe1 first (it listens), then the
# client on rxe0 (it retries its connection until the server listens). The server stops
# when the client's process ends.
pair() {
  local tag=$1 scfg=$2 ccfg=$3 lossy=${4:-} srv crc src
  timeout 180 "$DP" run "$scfg" --json >"$OUT/$tag-srv.json" 2>"$OUT/$tag-srv.err" &
  srv=$!
  timeout 120 "$DP" run "$ccfg" --duration "$DUR" --json >"$OUT/$tag-cli.json" 2>"$OUT/$tag-cli.err"
  crc=$?
  # If the client failed, do not wait for a peer that will never come.
  [ $crc = 0 ] || kill $srv 2>/dev/null
  wait $srv
  src=$?
  check "$tag client (rxe0 -> 198.18.0.2)" "$OUT/$tag-cli.json" "$OUT/$tag-cli.err" $crc sink $lossy
  check "$tag server (rxe1, listening)" "$OUT/$tag-srv.json" "$OUT/$tag-srv.err" $src echo $lossy
}

# 2. Two processes, RC.
pair "remote rc" $EX/remote-server-rdma.toml $EX/remote-client-rdma.toml

# 3. Two processes, UD: the examples with transport = "ud" on both QPs, paced lower.
sed 's/^listen = /transport = "ud"\nlisten = /' $EX/remote-server-rdma.toml >"$OUT/ud-server.toml"
sed 's/^peer = /transport = "ud"\npeer = /; s/^rate = 5_000 /rate = 1_000 /' $EX/remote-client-rdma.toml >"$OUT/ud-client.toml"
pair "remote ud" "$OUT/ud-server.toml" "$OUT/ud-client.toml" lossy
rm -rf "$OUT"
exit $fails
