# Velero's CSI snapshot data mover: a backup (--snapshot-move-data) of a namespace whose
# StatefulSet holds checksummed data on a stickyvol claim, the namespace deleted, a restore: the
# pod runs again, on whichever node the scheduler picks, with the same data. Logs the backup's and
# the restore's times ("measured:").
# e2e-lane: velero
source "$(dirname "$0")/../lib/scenario.sh"
source "$E2E_DIR/lib/velero.sh"

step "Velero and its object store"
velero_install

step "a StatefulSet with $VELERO_MIB MiB of data"
velero_statefulset Filesystem "$(velero_claim_size)"
sum=$(write_data Filesystem)
node=$(pod_node db-0)
log "db-0 on $node, data $sum"

step "backup with the data mover"
velero_backup "$NS" --snapshot-move-data
log "measured: Velero data-mover backup of $VELERO_MIB MiB: $TOOK s (data path $(data_path_seconds datauploads "velero.io/backup-name=$NS") s)"
# One DataUpload, done on the node of the source volume (Velero puts its pod there), and the
# snapshot it read is gone.
expect_eq "$(k -n "$VELERO_NS" get datauploads -l "velero.io/backup-name=$NS" -o jsonpath='{range .items[*]}{.status.phase}{" "}{.status.node}{end}')" \
    "Completed $node" "the DataUpload's phase and node"
expect_eq "$(kn get volumesnapshots -o name 2>/dev/null)" "" "VolumeSnapshots left in the namespace"

step "the namespace deleted"
delete_namespace

step "restore"
velero_restore "$NS" "$NS"
restore_took=$TOOK
wait_pod_running db-0 180
log "measured: Velero data-mover restore of $VELERO_MIB MiB: $restore_took s (data path $(data_path_seconds datadownloads "velero.io/restore-name=$NS") s) (db-0 on $(pod_node db-0))"
expect_eq "$(read_checksum Filesystem)" "$sum" "the restored data"
expect_eq "$(pv_node "$(pv_of data-db-0)")" "$(pod_node db-0)" "the restored volume's node"
