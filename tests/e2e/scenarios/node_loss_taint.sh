# onNodeLoss: release, with the out-of-service taint instead of a deletion. The second node is
# switched off and, once NotReady, tainted node.kubernetes.io/out-of-service: the StatefulSet runs
# again on the first node with a new, empty volume (the time from the taint to Running is logged,
# "measured: …"); the old PV stays while the node may come back. Untainted and started again,
# the node's provisioner deletes the released volume as usual.
source "$(dirname "$0")/../lib/scenario.sh"
source "$E2E_DIR/lib/nodeloss.sh"

class release
step "db-0 and its claim on $LOST"
start_on_lost_node

step "$LOST switched off, tainted out-of-service"
stop_lost_node
k taint node "$LOST" "$OUT_OF_SERVICE=nodeshutdown:NoExecute" >/dev/null
t0=$(now)
wait_running_on "$LIVE" 300
log "measured: out-of-service taint -> db-0 Running on $LIVE in $(since "$t0") s"
expect_new_empty_volume
k get pv "$PV" >/dev/null 2>&1 || fail "the old PV went although its node may come back"

step "$LOST back and untainted: its provisioner deletes the released volume"
k taint node "$LOST" "$OUT_OF_SERVICE-" >/dev/null
bring_back || fail "$LOST not Ready again"
until_ok 300 "the old PV $PV deleted by its node" '! k get pv "$PV" >/dev/null 2>&1'
driver=$(ready_driver_pod "$LOST")
[[ -z $(k -n "$DRIVER_NS" exec "$driver" -c stickyvol -- stickyvol volumes --json |
    python3 -c 'import json, sys; print(*[v["volume_id"] for v in json.load(sys.stdin) if v["volume_id"] == sys.argv[1]])' "$HANDLE") ]] ||
    fail "volume $HANDLE is still on $LOST"
