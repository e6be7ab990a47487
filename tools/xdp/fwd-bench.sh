#!/usr/bin/env bash
# 64-byte L2 forwarding rate on veth, side by side in one run (issue 14):
#
#   [ns dpb-gen] g0 --veth-- f0 [FORWARDER] f1 --veth-- s0 [ns dpb-sink]
#
# The generator is DPDK's own `dpdk-testpmd --forward-mode=txonly` on g0 through its
# net_af_xdp driver (64-byte frames as fast as it can); the rate is what arrives at s0
# (its kernel rx_packets counter) over WINDOW seconds after one second of warm-up, and the
# generator's own rate (g0 tx_packets) in the same windows is printed beside: a forwarder
# that keeps up with it is bounded by the generator, not by itself. The
# forwarders, each in turn, ROUNDS times, alternating:
#   dataplane   config/examples/l2fwd.toml on f0/f1 (the xdp provider, copy mode on veth)
#   testpmd     dpdk-testpmd --forward-mode=mac on f0/f1 through net_af_xdp
#   kernel      a Linux bridge of f0 and f1 (no XDP)
# Prints each round and the medians, Mpps and the ratios to testpmd. It also writes a pcap
# of frames forwarded by dataplane (taken at s0) and reads it back with `tcpdump -r`.
#
# This machine has 2 cores for generator, forwarder and receiver: the numbers say how the
# forwarders compare under the same squeeze, not what they do on their own cores.
# Needs root, iproute2, dpdk-dev (dpdk-testpmd) and librte-net-af-xdp23, tcpdump.
#   tools/xdp/fwd-bench.sh [ROUNDS=3] [WINDOW=5]
set -euo pipefail
ROUNDS=${1:-3}
WINDOW=${2:-5}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
[ "$(id -u)" = 0 ] || { echo "fwd-bench: needs root" >&2; exit 1; }
for t in ip dpdk-testpmd tcpdump; do command -v $t >/dev/null || { echo "fwd-bench: needs $t" >&2; exit 1; }; done
BIN=${DATAPLANE_BIN:-target/release/dataplane}
[ -x "$BIN" ] || cargo build -q --release -p dataplane-apps --bin dataplane
TMP=$(mktemp -d)
cleanup() {
    pkill -f "sleep 9999[12]" 2>/dev/null || true
    [ -n "${FWD_PID:-}" ] && kill -INT "$FWD_PID" 2>/dev/null || true
    sleep 0.5
    ip netns del dpb-gen 2>/dev/null || true
    ip netns del dpb-sink 2>/dev/null || true
    ip link del f0 2>/dev/null || true
    ip link del f1 2>/dev/null || true
    ip link del dpbbr 2>/dev/null || true
}
trap 'cleanup; rm -rf "$TMP"' EXIT
cleanup
ip netns add dpb-gen
ip netns add dpb-sink
ip link add f0 type veth peer name g0 netns dpb-gen
ip link add f1 type veth peer name s0 netns dpb-sink
for i in f0 f1; do echo 1 > /proc/sys/net/ipv6/conf/$i/disable_ipv6; ip link set $i up; done
for x in "dpb-gen g0" "dpb-sink s0"; do
    set -- $x
    ip netns exec $1 sh -c "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"
    ip -n $1 link set $2 up
done
sed 's/"dpl0", "dpl1"/"f0", "f1"/' config/examples/l2fwd.toml > "$TMP/l2fwd.toml"

# The generator runs for the whole benchmark.
# testpmd quits when its stdin gives a line: `(sleep; echo) |` keeps it running until then.
# Its main lcore mostly sleeps; the forwarding lcore is the second of -l.
{ (sleep 99991; echo) | ip netns exec dpb-gen dpdk-testpmd -l 0,1 --main-lcore 0 --no-pci --in-memory \
    --file-prefix dpbgen --vdev net_af_xdp0,iface=g0 -- --forward-mode=txonly --txpkts=64 \
    --auto-start --nb-cores=1; } > "$TMP/gen.log" 2>&1 &
sleep 3
grep -q "Start automatic packet forwarding\|txonly packet forwarding" "$TMP/gen.log" ||
    { cat "$TMP/gen.log"; echo "fwd-bench: the generator did not start" >&2; exit 1; }

rx() { ip netns exec dpb-sink cat /sys/class/net/s0/statistics/rx_packets; }
tx() { ip netns exec dpb-gen cat /sys/class/net/g0/statistics/tx_packets; }
OFFERED=$TMP/offered
measure() { # prints Mpps at s0 over WINDOW seconds; appends the generator's rate to $OFFERED
    sleep 1
    local a b c d; a=$(rx); c=$(tx); sleep "$WINDOW"; b=$(rx); d=$(tx)
    awk -v a="$c" -v b="$d" -v w="$WINDOW" 'BEGIN { printf "%.3f\n", (b - a) / w / 1e6 }' >> "$OFFERED"
    awk -v a="$a" -v b="$b" -v w="$WINDOW" 'BEGIN { printf "%.3f", (b - a) / w / 1e6 }'
}
run_dataplane() {
    "$BIN" run "$TMP/l2fwd.toml" --duration 600s > "$TMP/dp.log" 2>&1 &
    FWD_PID=$!
    for _ in $(seq 100); do ip link show f1 | grep -q xdp && break; sleep 0.1; done
    measure
    if [ -n "${PCAP:-}" ]; then
        ip netns exec dpb-sink timeout 3 tcpdump -q -i s0 -c 200 -w "$TMP/fwd.pcap" 2>/dev/null || true
        PCAP=
    fi
    kill -INT "$FWD_PID"; wait "$FWD_PID" || true; FWD_PID=
}
run_testpmd() {
    { (sleep 99992; echo) | dpdk-testpmd -l 1,0 --main-lcore 1 --no-pci --in-memory --file-prefix dpbfwd \
        --vdev net_af_xdp1,iface=f0 --vdev net_af_xdp2,iface=f1 -- --forward-mode=mac --auto-start \
        --nb-cores=1; } > "$TMP/fwd.log" 2>&1 &
    FWD_PID=$!
    sleep 2
    grep -q "Start automatic packet forwarding\|mac packet forwarding" "$TMP/fwd.log" ||
        { cat "$TMP/fwd.log" >&2; echo "fwd-bench: testpmd (the forwarder) did not start" >&2; }
    measure
    pkill -f "sleep 99992" || true; wait "$FWD_PID" 2>/dev/null || true; FWD_PID=
}
run_kernel() {
    ip link add dpbbr type bridge
    ip link set f0 master dpbbr; ip link set f1 master dpbbr; ip link set dpbbr up
    measure
    ip link del dpbbr
}
declare -A all
PCAP=1
for r in $(seq "$ROUNDS"); do
    for f in dataplane testpmd kernel; do
        v=$(run_$f)
        all[$f]="${all[$f]:-} $v"
        echo "round $r: $f $v Mpps"
    done
done
med() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
d=$(med "${all[dataplane]}"); t=$(med "${all[testpmd]}"); k=$(med "${all[kernel]}")
echo "generator (testpmd txonly on g0): median $(med "$(cat "$OFFERED")") Mpps sent during the windows"
echo "medians of $ROUNDS rounds, 64-byte frames arriving at s0:"
awk -v d="$d" -v t="$t" -v k="$k" 'BEGIN {
    printf "  dataplane l2fwd  %.3f Mpps  (%.2fx testpmd)\n", d, (t > 0 ? d / t : 0)
    printf "  dpdk-testpmd mac %.3f Mpps\n", t
    printf "  kernel bridge    %.3f Mpps  (%.2fx testpmd)\n", k, (t > 0 ? k / t : 0)
}'
echo "+ tcpdump -r of frames forwarded by dataplane (the first 3):"
n=$(tcpdump -r "$TMP/fwd.pcap" -nn 2>/dev/null | wc -l)
tcpdump -r "$TMP/fwd.pcap" -nn -e 2>/dev/null | head -3 || true
[ "$n" -gt 0 ] || { echo "fwd-bench: no forwarded frame in the pcap" >&2; exit 1; }
