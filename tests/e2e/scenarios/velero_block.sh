# A Block claim through Velero's data mover (block volume mode, which needs the node agent
# privileged): a backup with --snapshot-move-data, the namespace deleted, a restore: the device
# holds the same bytes.
# e2e-lane: velero
source "$(dirname "$0")/../lib/scenario.sh"
source "$E2E_DIR/lib/velero.sh"

step "Velero and its object store"
velero_install

step "a StatefulSet with a Block claim holding $VELERO_MIB MiB of data"
velero_statefulset Block "$(velero_claim_size)"
sum=$(write_data Block)

step "backup with the data mover"
velero_backup "$NS" --snapshot-move-data
log "measured: Velero data-mover backup of a $VELERO_MIB MiB block device: $TOOK s (data path $(data_path_seconds datauploads "velero.io/backup-name=$NS") s)"
expect_eq "$(k -n "$VELERO_NS" get datauploads -l "velero.io/backup-name=$NS" -o jsonpath='{range .items[*]}{.status.phase}{end}')" \
    Completed "the DataUpload's phase"

step "the namespace deleted"
delete_namespace

step "restore"
velero_restore "$NS" "$NS"
restore_took=$TOOK
wait_pod_running db-0 180
log "measured: Velero data-mover restore of a $VELERO_MIB MiB block device: $restore_took s (data path $(data_path_seconds datadownloads "velero.io/restore-name=$NS") s)"
expect_eq "$(kn get pvc data-db-0 -o jsonpath='{.spec.volumeMode}')" Block "the restored claim's mode"
expect_eq "$(read_checksum Block)" "$sum" "the restored data"
