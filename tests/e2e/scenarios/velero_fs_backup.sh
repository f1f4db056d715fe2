# Velero's file-system backup (kopia, through the node agent) of a stickyvol filesystem volume:
# a backup with --default-volumes-to-fs-backup, the namespace deleted, a restore: Velero's
# restore helper holds the pod until the node agent has written the data back into a new volume.
# e2e-lane: velero
source "$(dirname "$0")/../lib/scenario.sh"
source "$E2E_DIR/lib/velero.sh"

step "Velero and its object store"
velero_install

step "a StatefulSet with $VELERO_MIB MiB of data"
velero_statefulset Filesystem "$(velero_claim_size)"
sum=$(write_data Filesystem)

step "file-system backup"
velero_backup "$NS" --default-volumes-to-fs-backup
log "measured: Velero file-system backup of $VELERO_MIB MiB: $TOOK s (data path $(data_path_seconds podvolumebackups "velero.io/backup-name=$NS") s)"
expect_eq "$(k -n "$VELERO_NS" get podvolumebackups -l "velero.io/backup-name=$NS" -o jsonpath='{range .items[*]}{.status.phase}{" "}{.spec.volume}{end}')" \
    "Completed data" "the PodVolumeBackup's phase and volume"
expect_eq "$(k -n "$VELERO_NS" get datauploads -l "velero.io/backup-name=$NS" -o name)" "" "DataUploads"

step "the namespace deleted"
delete_namespace

step "restore"
velero_restore "$NS" "$NS"
restore_took=$TOOK
wait_pod_running db-0 180
log "measured: Velero file-system restore of $VELERO_MIB MiB: $restore_took s (data path $(data_path_seconds podvolumerestores "velero.io/restore-name=$NS") s) (db-0 on $(pod_node db-0))"
expect_eq "$(k -n "$VELERO_NS" get podvolumerestores -l "velero.io/restore-name=$NS" -o jsonpath='{range .items[*]}{.status.phase}{end}')" \
    Completed "the PodVolumeRestore's phase"
expect_eq "$(read_checksum Filesystem)" "$sum" "the restored data"
