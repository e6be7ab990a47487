#!/usr/bin/env bash
# Inside tools/rxe-vm: the trading reference application (apps/trading) on the rdma provider,
# both workers on Soft-RoCE rxe0: config/examples/trading/trading.toml with `kind = "rdma"`,
# a fixed number of ITCH messages, queue depths within rxe's limits, and the market data on a
# UD pair instead of the multicast group (multicast sends on rxe are not delivered in this VM:
# see the NOT RUN reason of the conformance case mcast_send_reaches_every_member). Checks: the feed handler
# applied messages (market data is UD: losses are counted as gaps and tolerated, and every
# message is either applied or counted missing), the strategy sent orders, the exchange
# accepted every one of them over RC, no error, no leaked buffer. Prints ok/FAIL lines; exit
# status = number of failures.
#   tools/rxe-vm/rxe-vm -- tools/rxe-vm/trading.sh [target/debug/dataplane-trading]
set -u
BIN=${1:-target/debug/dataplane-trading}
OUT=$(mktemp -d)
[ -x "$BIN" ] || { echo "FAIL $BIN is not built (cargo build -p dataplane-trading)"; exit 1; }
command -v python3 >/dev/null || { echo "FAIL python3 is needed to read the JSON summary"; exit 1; }
sed -e 's/^kind = "shm"$/kind = "rdma"\ndevice = "rxe0"\nport = 1\ngid_index = 1/' \
    -e '/^fabric = /d' -e 's/^count = 32768$/count = 8192/' \
    -e 's/^srq_depth = .*/srq_depth = 2048/' -e 's/^srq_low_watermark = .*/srq_low_watermark = 512/' \
    -e 's/^cq_depth = .*/cq_depth = 8192/' -e 's/^rate = 200_000 .*/rate = 20_000\nmessages = 40_000/' \
    -e 's/^peer = "ff0e::1:1"$/peer = "md-sub"/' -e 's/^mcast = "ff0e::1:1"$/peer = "md-pub"/' \
    config/examples/trading/trading.toml >"$OUT/trading-rdma.toml"
grep -q 'kind = "rdma"' "$OUT/trading-rdma.toml" && grep -q 'messages = 40_000' "$OUT/trading-rdma.toml" \
    && grep -q 'peer = "md-pub"' "$OUT/trading-rdma.toml" \
    || { echo "FAIL the rdma variant of trading.toml was not made"; exit 1; }
"$BIN" check "$OUT/trading-rdma.toml" || { echo "FAIL check refused the rdma variant"; exit 1; }
timeout 120 "$BIN" run "$OUT/trading-rdma.toml" --duration 5s --json >"$OUT/t.json" 2>"$OUT/t.err"
rc=$?
why=$(python3 - "$OUT/t.json" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no JSON summary ({e})"); sys.exit(0)
st = {s["name"]: s for w in j["workers"] for s in w["stages"]}
v = lambda n, k: st[n].get("values", {}).get(k, 0)
bad = []
applied, gaps = v("book", "itch_applied"), st["book"]["gaps"]
if applied == 0: bad.append("the feed handler applied nothing")
if applied + gaps > 40000: bad.append(f"applied {applied} + gaps {gaps} > 40000 messages sent")
if v("gateway", "orders_sent") == 0: bad.append("no order was sent")
if v("acks", "accepted") != v("gateway", "orders_sent"): bad.append(f"accepted {v('acks','accepted')} of {v('gateway','orders_sent')} orders")
errors = sum(w["errors"] for w in j["workers"])
if errors: bad.append(f"{errors} errors")
if j["leaked"]: bad.append(f"{j['leaked']} leaked buffers")
print("; ".join(bad) if bad else f"OK {applied} ITCH messages applied, {gaps} lost (UD), {v('gateway','orders_sent')} orders accepted")
PY
)
if [ "$rc" = 0 ] && [ "${why#OK }" != "$why" ]; then
  echo "ok   trading.toml on rxe0: ${why#OK }"
  exit 0
fi
echo "FAIL trading.toml on rxe0: exit $rc; $why"
sed 's/^/  stderr: /' "$OUT/t.err" | tail -8
exit 1
