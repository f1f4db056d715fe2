# onNodeLoss: release. A StatefulSet's claim lives on the second node; the node is switched off
# and its Node deleted: the reconciler deletes the claim and the pod waiting for it, and the
# StatefulSet runs again on the first node with a new, empty volume; the old PV is removed. The
# time from the deletion to Running is logged ("measured: …"). Then the node comes back: its
# driver finds the volume whose PV is gone and moves its data to lost+found, and reports it
# (`stickyvol volumes`, the metrics, its report that `stickyvol cluster orphans` lists), which
# the other node's driver may not delete. The controller's release notice for the node is taken
# back by its driver, which may read no Node.
source "$(dirname "$0")/../lib/scenario.sh"
source "$E2E_DIR/lib/nodeloss.sh"

class release
step "db-0 and its claim on $LOST"
start_on_lost_node

step "$LOST switched off, its Node deleted"
stop_lost_node
k delete node "$LOST" >/dev/null
t0=$(now)
wait_running_on "$LIVE" 300
log "measured: Node deleted -> db-0 Running on $LIVE in $(since "$t0") s"
expect_new_empty_volume
until_ok 120 "the old PV $PV removed" '! k get pv "$PV" >/dev/null 2>&1'
# Written before the PV's delete: what tells a driver that ran through the loss to read its PVs.
NOTICE=stickyvol.csi.io-released-$LOST
k -n "$DRIVER_NS" get configmap "$NOTICE" >/dev/null || fail "no release notice $NOTICE"
[[ -n $(kn get events --field-selector reason=NodeLossReleased -o name) ]] ||
    fail "no NodeLossReleased event in $NS"

step "$LOST comes back: the volume whose PV is gone goes to lost+found"
bring_back || fail "$LOST not Ready again"
driver=$(ready_driver_pod "$LOST" 420)
t1=$(now)
# lost_path: where `stickyvol volumes` says the volume's data is, once it is orphaned.
lost_path() {
    k -n "$DRIVER_NS" exec "$driver" -c stickyvol -- stickyvol volumes --json | python3 -c '
import json, sys
for v in json.load(sys.stdin):
    if v["volume_id"] == sys.argv[1] and v["orphaned"]:
        print(v["host_path"])
' "$HANDLE"
}
# Two looks at least two intervals apart (60 s in deploy/): about two minutes.
until_ok 420 "volume $HANDLE reported orphaned" '[[ -n $(lost_path) ]]'
log "measured: driver on $LOST Ready -> volume in lost+found in $(since "$t1") s"
path=$(lost_path)
[[ $path == */lost+found/* ]] || fail "the orphaned volume's data is at $path, not in lost+found"
expect_eq "$(cluster exec "$LOST" cat "$path/written")" db-0 "the data in lost+found"
k -n "$DRIVER_NS" exec "$driver" -c stickyvol -- stickyvol volumes | grep "$HANDLE" | grep -q orphaned ||
    fail "stickyvol volumes does not show $HANDLE as orphaned"
metrics=$(k get --raw "/api/v1/namespaces/$DRIVER_NS/pods/$driver:8080/proxy/metrics")
grep -qx 'stickyvol_orphaned_volumes 1' <<<"$metrics" || fail "stickyvol_orphaned_volumes is not 1"
grep -q '^stickyvol_node_loss_actions_total{action="orphan_to_lost_found",result="done"} 1' <<<"$metrics" ||
    fail "no orphan_to_lost_found action counted"

step "stickyvol cluster orphans lists it, from $LOST's report"
# listed_orphan: node, state and place of the volume in `cluster orphans --json`, run where an
# operator may run it: in the controller's pod, with its service account.
listed_orphan() {
    k -n "$DRIVER_NS" exec stickyvol-controller-0 -c stickyvol -- stickyvol cluster orphans --json |
        python3 -c '
import json, sys
for v in json.load(sys.stdin)["volumes_without_pv"]:
    if v["volume_id"] == sys.argv[1]:
        print(v["node"], v["state"], v.get("lost_path", "-"))
' "$HANDLE"
}
until_ok 90 "$HANDLE in cluster orphans" '[[ $(listed_orphan) == "$LOST orphaned $path" ]]'
REPORT=stickyvol.csi.io-orphans-$LOST
# Owned by the Node made again, whose uid the driver learns from its own token (it reads no Node).
[[ $(k -n "$DRIVER_NS" get configmap "$REPORT" -o jsonpath='{.metadata.ownerReferences[0].name}/{.metadata.ownerReferences[0].uid}') == \
    "$LOST/$(k get node "$LOST" -o jsonpath='{.metadata.uid}')" ]] ||
    fail "the report $REPORT is not owned by Node $LOST as it is now"
until_ok 240 "the release notice taken back by $LOST's driver" \
    '! k -n "$DRIVER_NS" get configmap "$NOTICE" >/dev/null 2>&1'
refused_to "$LOST" 'cannot get resource "nodes"' "read its Node" get node "$LOST"

step "the driver on $LIVE cannot delete $LOST's report (ValidatingAdmissionPolicy)"
refused_to "$LIVE" "a node writes only its own report" "delete $LOST's report" \
    -n "$DRIVER_NS" delete configmap "$REPORT"
k -n "$DRIVER_NS" get configmap "$REPORT" >/dev/null || fail "the report $REPORT is gone"

step "the operator removes it by hand; the report goes"
k -n "$DRIVER_NS" exec "$driver" -c stickyvol -- stickyvol volume delete "$HANDLE" >/dev/null
expect_eq "$(cluster exec "$LOST" cat "$path/written")" db-0 "lost+found after the record's deletion"
cluster exec "$LOST" rm -rf "$path"
# The next look (60 s in deploy/) finds nothing left to report.
until_ok 150 "the report $REPORT deleted" '! k -n "$DRIVER_NS" get configmap "$REPORT" >/dev/null 2>&1'
[[ -z $(listed_orphan) ]] || fail "cluster orphans still lists $HANDLE"
