# A VolumeSnapshot of a claim becomes ready; a claim restored from it and a clone of the claim
# land on the source's node with its data.
# e2e-lane: growth
source "$(dirname "$0")/../lib/scenario.sh"

claim source 128Mi
pod writer source "" "echo snapshot-me > /data/file && sync && sleep 100000"
wait_pod_running writer
node=$(pod_node writer)
until_true 30 "the writer wrote" pexec writer test -s /data/file

step "snapshot"
snapshot snap source
pexec writer sh -c 'echo changed-after > /data/file'

step "a restore and a clone"
apply <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: restored}
spec:
  storageClassName: stickyvol
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 128Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: cloned}
spec:
  storageClassName: stickyvol
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 128Mi}}
  dataSource: {kind: PersistentVolumeClaim, name: source}
YAML
# Pinned to the source's node, as users do with restore placement off (restore_placement.sh
# shows the unpinned way).
pod restore-reader restored "$node"
pod clone-reader cloned "$node"
wait_pod_running restore-reader 180
wait_pod_running clone-reader 180
expect_eq "$(pv_node "$(pv_of restored)")" "$node" "the restore's node"
expect_eq "$(pv_node "$(pv_of cloned)")" "$node" "the clone's node"
expect_eq "$(pexec restore-reader cat /data/file)" snapshot-me "the restore's data (as at the snapshot)"
expect_eq "$(pexec clone-reader cat /data/file)" changed-after "the clone's data (as at the clone)"

step "deleting the snapshot"
kn delete volumesnapshot snap --wait=true --timeout=120s >/dev/null || fail "snapshot not deleted"
