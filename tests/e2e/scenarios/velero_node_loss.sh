# A node lost, its volumes restored elsewhere from Velero: a data-mover backup of a namespace
# whose StatefulSet's claim is on the second node; that node stopped and its Node deleted, the
# namespace deleted, a restore: the pod runs on the first node with the data. The second node
# comes back at exit and its provisioner deletes the old volume.
source "$(dirname "$0")/../lib/scenario.sh"
source "$E2E_DIR/lib/nodeloss.sh"
source "$E2E_DIR/lib/velero.sh"

step "Velero and its object store (on $LIVE)"
[[ $STORE_NODE == "$LIVE" ]] || fail "the object store is on $STORE_NODE, the node this scenario stops"
velero_install

step "a StatefulSet on $LOST with $VELERO_MIB MiB of data"
# The claim can go to the second node only once its driver serves and its capacity is published
# (it may have just come back from another scenario).
ready_driver_pod "$LOST" 300 >/dev/null
until_ok 120 "$LOST's capacity for stickyvol published" \
    '[[ -n $(capacity_of stickyvol "$LOST") && $(capacity_of stickyvol "$LOST") != 0 ]]'
velero_statefulset Filesystem "$(velero_claim_size)" "$LOST"
expect_eq "$(pod_node db-0)" "$LOST" "db-0's node (it prefers $LOST)"
sum=$(write_data Filesystem)
old_pv=$(pv_of data-db-0)

step "backup with the data mover"
velero_backup "$NS" --snapshot-move-data
log "measured: Velero data-mover backup of $VELERO_MIB MiB: $TOOK s (data path $(data_path_seconds datauploads "velero.io/backup-name=$NS") s)"
expect_eq "$(k -n "$VELERO_NS" get datauploads -l "velero.io/backup-name=$NS" -o jsonpath='{range .items[*]}{.status.phase}{" "}{.status.node}{end}')" \
    "Completed $LOST" "the DataUpload's phase and node"

step "$LOST stopped and its Node deleted; the namespace deleted"
# The Node is deleted at once, as an operator does with a machine known to be dead: no need to
# wait the minute the node controller takes to mark it NotReady.
# Its pod is force-deleted, as Kubernetes' documentation tells for a StatefulSet's pod on a node
# known to be gone (the pod garbage collector would take 40 s to a minute and a half here).
cluster stop "$LOST"
k delete node "$LOST" --wait=true --timeout=60s >/dev/null
kn delete pod db-0 --force --grace-period=0 >/dev/null 2>&1
# Its volume stays until the node is back: only that node's provisioner deletes it.
delete_namespace volumes-stay

step "restore"
velero_restore "$NS" "$NS"
restore_took=$TOOK
wait_pod_running db-0 180
log "measured: Velero data-mover restore of $VELERO_MIB MiB, source node lost: $restore_took s (data path $(data_path_seconds datadownloads "velero.io/restore-name=$NS") s)"
expect_eq "$(pod_node db-0)" "$LIVE" "the restored db-0's node"
expect_eq "$(pv_node "$(pv_of data-db-0)")" "$LIVE" "the restored volume's node"
expect_eq "$(read_checksum Filesystem)" "$sum" "the restored data"

step "$LOST back: its provisioner deletes the old volume"
give_node_back || fail "$LOST did not come back"
k wait --for=delete "pv/$old_pv" --timeout="$(wait_limit 180)s" >/dev/null ||
    fail "the lost node's volume $old_pv is still there after it came back"
