#!/usr/bin/env bash
# Builds a two-namespace topology, runs config/examples/l2fwd.toml (the xdp provider's L2
# forwarder) between them, and checks that `ping` and an `iperf3` TCP stream pass through it:
#
#   [netns dpl-a] dpl0a 10.77.0.1 --veth-- dpl0 [dataplane: port 1 <-> port 2] dpl1 --veth-- dpl1a 10.77.0.2 [netns dpl-b]
#
# The namespaces can only reach each other through the forwarder: dpl0 and dpl1 have no
# address and are not bridged. Needs root, iproute2, ping (iputils-ping), iperf3 and ethtool; touches
# nothing but the interfaces and namespaces it creates, and removes them on exit. Prints the
# forwarder's summary. Exit status: non-zero if ping or iperf3 failed, or the pipeline did.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
[ "$(id -u)" = 0 ] || { echo "l2fwd-ping: needs root" >&2; exit 1; }
for t in ip ping iperf3 ethtool; do command -v $t >/dev/null || { echo "l2fwd-ping: needs $t" >&2; exit 1; }; done
BIN=${DATAPLANE_BIN:-target/release/dataplane}
[ -x "$BIN" ] || cargo build -q --release -p dataplane-apps --bin dataplane
LOG=$(mktemp)
cleanup() {
    [ -n "${DP_PID:-}" ] && kill -INT "$DP_PID" 2>/dev/null && wait "$DP_PID" 2>/dev/null || true
    ip netns del dpl-a 2>/dev/null || true
    ip netns del dpl-b 2>/dev/null || true
    ip link del dpl0 2>/dev/null || true
    ip link del dpl1 2>/dev/null || true
    rm -f "$LOG"
}
trap cleanup EXIT
cleanup
ip netns add dpl-a
ip netns add dpl-b
ip link add dpl0 type veth peer name dpl0a netns dpl-a
ip link add dpl1 type veth peer name dpl1a netns dpl-b
for i in dpl0 dpl1; do
    echo 1 > /proc/sys/net/ipv6/conf/$i/disable_ipv6
    ip link set $i up
done
ip -n dpl-a addr add 10.77.0.1/24 dev dpl0a
ip -n dpl-b addr add 10.77.0.2/24 dev dpl1a
for ns in dpl-a dpl-b; do ip -n $ns link set lo up; done
ip -n dpl-a link set dpl0a up
ip -n dpl-b link set dpl1a up
# A veth hands its peer's XDP program frames whose TCP/UDP checksum the sender left to
# offload (CHECKSUM_PARTIAL): unfinished on the wire once XDP takes them. Turn TX checksum
# offload off on the hosts' side so that they send finished checksums (as one does for any
# AF_XDP or XDP_REDIRECT setup on veth).
ip netns exec dpl-a ethtool -K dpl0a tx off >/dev/null
ip netns exec dpl-b ethtool -K dpl1a tx off >/dev/null

"$BIN" run config/examples/l2fwd.toml --duration 60s > "$LOG" 2>&1 &
DP_PID=$!
# Ready when both interfaces carry the forwarder's XDP program.
for _ in $(seq 100); do
    if ip link show dpl0 | grep -q xdp && ip link show dpl1 | grep -q xdp; then break; fi
    kill -0 "$DP_PID" 2>/dev/null || { cat "$LOG"; echo "l2fwd-ping: the forwarder exited early" >&2; exit 1; }
    sleep 0.1
done
sleep 0.5
rc=0
echo "+ ping 10.77.0.1 -> 10.77.0.2 through the forwarder"
ip netns exec dpl-a ping -c 5 -i 0.2 -W 2 10.77.0.2 || rc=1
echo "+ iperf3 TCP 10.77.0.1 -> 10.77.0.2 through the forwarder (3 s)"
ip netns exec dpl-b iperf3 -s -1 -D -B 10.77.0.2 >/dev/null
sleep 0.3
timeout 15 ip netns exec dpl-a iperf3 -c 10.77.0.2 -t 3 -f m --connect-timeout 3000 | tail -4 || rc=1
kill -INT "$DP_PID"
wait "$DP_PID" || { echo "l2fwd-ping: the forwarder failed" >&2; rc=1; }
DP_PID=
echo "+ the forwarder's summary"
cat "$LOG"
exit $rc
