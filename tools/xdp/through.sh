#!/usr/bin/env bash
# Runs an xdp pipeline between two network namespaces and checks that `ping` and an `iperf3`
# TCP stream pass through it. MODE is
#
#   l2fwd     config/examples/l2fwd.toml: an L2 forwarder, one IPv4 network on both sides
#             [ns a] 10.77.0.1 -- dpl0 [port 1 <-> port 2] dpl1 -- 10.77.0.2 [ns b]
#   l3router  config/examples/packet/l3router.toml: an IPv4 router between two networks
#             [ns a] 10.1.0.1/24 -- dpr0 [router] dpr1 -- 10.2.0.1/24 [ns b]
#             also checks that the TTL drops by one (ping sees ttl=63) and that a TTL of 1
#             is not forwarded (counted as drop_ttl_expired).
#
# The namespaces can only reach each other through the pipeline: the root-side ends have no
# address and no bridge. Needs root, iproute2, ping, iperf3 and ethtool; touches only what it
# creates and removes it on exit. Prints the pipeline's summary. Exit status non-zero if a
# check failed or the pipeline did.
set -euo pipefail
MODE=${1:-}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
case "$MODE" in
    l2fwd) P=dpl; CFG=config/examples/l2fwd.toml; A=10.77.0.1; B=10.77.0.2; NET=24 ;;
    l3router) P=dpr; CFG=config/examples/packet/l3router.toml; A=10.1.0.1; B=10.2.0.1; NET=24 ;;
    *) echo "usage: through.sh l2fwd|l3router" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "through.sh: needs root" >&2; exit 1; }
for t in ip ping iperf3 ethtool; do command -v $t >/dev/null || { echo "through.sh: needs $t" >&2; exit 1; }; done
BIN=${DATAPLANE_BIN:-target/release/dataplane}
[ -x "$BIN" ] || cargo build -q --release -p dataplane-apps --bin dataplane
LOG=$(mktemp)
cleanup() {
    [ -n "${DP_PID:-}" ] && kill -INT "$DP_PID" 2>/dev/null && wait "$DP_PID" 2>/dev/null || true
    ip netns del $P-a 2>/dev/null || true
    ip netns del $P-b 2>/dev/null || true
    ip link del ${P}0 2>/dev/null || true
    ip link del ${P}1 2>/dev/null || true
}
trap 'cleanup; rm -f "$LOG"' EXIT
cleanup
ip netns add $P-a
ip netns add $P-b
ip link add ${P}0 type veth peer name ${P}0a netns $P-a
ip link add ${P}1 type veth peer name ${P}1a netns $P-b
for i in ${P}0 ${P}1; do echo 1 > /proc/sys/net/ipv6/conf/$i/disable_ipv6; done
if [ "$MODE" = l3router ]; then
    # Fixed MACs: the router's routes and the hosts' neighbour entries name them.
    ip link set ${P}0 address 02:00:00:00:00:a1
    ip link set ${P}1 address 02:00:00:00:00:b1
    ip -n $P-a link set ${P}0a address 02:00:00:00:0a:01
    ip -n $P-b link set ${P}1a address 02:00:00:00:0b:01
fi
ip link set ${P}0 up
ip link set ${P}1 up
for side in a b; do
    ns=$P-$side; dev=${P}$([ $side = a ] && echo 0 || echo 1)a; addr=$([ $side = a ] && echo $A || echo $B)
    ip netns exec $ns sh -c "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"
    ip -n $ns link set lo up
    ip -n $ns addr add $addr/$NET dev $dev
    ip -n $ns link set $dev up
    # A veth hands its peer's XDP program frames whose TCP/UDP checksum the sender left to
    # offload (CHECKSUM_PARTIAL), unfinished once XDP takes them: turn TX checksum offload
    # off on the hosts' side (as for any AF_XDP or XDP_REDIRECT setup on veth).
    ip netns exec $ns ethtool -K $dev tx off >/dev/null
    if [ "$MODE" = l3router ]; then
        gw=${addr%.*}.254
        mac=$([ $side = a ] && echo 02:00:00:00:00:a1 || echo 02:00:00:00:00:b1)
        ip -n $ns neigh add $gw lladdr $mac dev $dev nud permanent
        ip -n $ns route add default via $gw dev $dev
    fi
done

"$BIN" run "$CFG" --duration 120s > "$LOG" 2>&1 &
DP_PID=$!
# Ready when both interfaces carry the pipeline's XDP program.
for _ in $(seq 100); do
    if ip link show ${P}0 | grep -q xdp && ip link show ${P}1 | grep -q xdp; then break; fi
    kill -0 "$DP_PID" 2>/dev/null || { cat "$LOG"; echo "through.sh: the pipeline exited early" >&2; exit 1; }
    sleep 0.1
done
sleep 0.5
rc=0
fail() { echo "through.sh $MODE: FAILED: $*" >&2; rc=1; }
echo "+ ping $A -> $B through the pipeline"
out=$(ip netns exec $P-a ping -c 5 -i 0.2 -W 2 $B) || fail "ping"
echo "$out"
if [ "$MODE" = l3router ]; then
    grep -q "ttl=63" <<<"$out" || fail "the reply's TTL is not 63 (64 minus one hop)"
    echo "+ ping with TTL 1: the router must not forward it"
    if ip netns exec $P-a ping -c 3 -i 0.2 -W 1 -t 1 $B >/dev/null; then fail "a TTL-1 packet went through"; fi
fi
echo "+ iperf3 TCP $A -> $B through the pipeline (3 s)"
ip netns exec $P-b iperf3 -s -1 -D -B $B >/dev/null
# The daemon forks: wait until it listens rather than guessing how long that takes.
for _ in $(seq 50); do ip netns exec $P-b ss -ltn | grep -q ":5201 " && break; sleep 0.1; done
timeout 20 ip netns exec $P-a iperf3 -c $B -t 3 -f m --connect-timeout 3000 | tail -4 || fail "iperf3"
kill -INT "$DP_PID"
wait "$DP_PID" || fail "the pipeline's exit status"
DP_PID=
echo "+ the pipeline's summary"
cat "$LOG"
grep -Eq "0 leaked" "$LOG" || fail "buffers leaked"
if [ "$MODE" = l3router ]; then
    ttl=$(grep -o "drop_ttl_expired[ =:]*[0-9]*" "$LOG" | grep -o "[0-9]*$" | awk '{s+=$1} END {print s+0}')
    [ "$ttl" -ge 3 ] || fail "drop_ttl_expired = $ttl, expected >= 3"
fi
exit $rc
