# onNodeLoss: keep (the default). The second node is switched off and its Node deleted: the
# StatefulSet's pod is made again and waits, its claim and PV stay (the reconciler only reports,
# NodeLossKept); when the node comes back, the pod runs there again with its data.
source "$(dirname "$0")/../lib/scenario.sh"
source "$E2E_DIR/lib/nodeloss.sh"

class keep
step "db-0 and its claim on $LOST"
start_on_lost_node

step "$LOST switched off, its Node deleted: nothing is released"
stop_lost_node
k delete node "$LOST" >/dev/null
waiting() {
    [[ $(kn get pod db-0 -o jsonpath='{.status.phase}' 2>/dev/null) == Pending && -z $(pod_node db-0) ]]
}
until_true 180 "db-0 made again, waiting for its claim" waiting
# About the PV (no claim is acted on), so in namespace default.
until_ok 60 "a NodeLossKept event" \
    '[[ -n $(k -n default get events --field-selector "reason=NodeLossKept,involvedObject.name=$PV" -o name) ]]'
# Several reconciler rounds (5 s each): still nothing changes.
sleep 30
waiting || fail "db-0 is no longer waiting: $(kn get pod db-0 -o wide)"
expect_eq "$(pv_of data-db-0)" "$PV" "the claim's PV"
k get pv "$PV" >/dev/null 2>&1 || fail "the PV of a kept claim went"

step "$LOST comes back: db-0 runs there with its data"
bring_back || fail "$LOST not Ready again"
wait_running_on "$LOST" 300
until_ok 30 "db-0 looked at its volume" 'pexec db-0 test -e /tmp/found-at-start'
expect_eq "$(pexec db-0 cat /tmp/found-at-start)" written "what the volume held when db-0 started again"
