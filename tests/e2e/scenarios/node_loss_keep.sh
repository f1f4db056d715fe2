# onNodeLoss: keep (the default). The second node is switched off and its Node deleted: the
# StatefulSet's pod is made again and waits, its claim and PV stay (the reconciler only reports,
# NodeLossKept); when the node comes back, the pod runs there again with its data. A claim restored
# from a snapshot on that node meanwhile is not placed (SourceNodeGone, nothing made) until the
# node is back, and then runs there. Meanwhile another StatefulSet's claim is taken off the dead
# node from its disk: the disk (the node's pool image) mounted on the live node under the data
# dir's adopt/, `stickyvol cluster move --from-disk` brings the data there and re-binds the claim,
# and the pod runs on the live node with it.
source "$(dirname "$0")/../lib/scenario.sh"
source "$E2E_DIR/lib/nodeloss.sh"

class keep
step "db-0 and its claim on $LOST"
start_on_lost_node
step "vault-0 and its claim on $LOST, with a file whose checksum is kept"
statefulset vault "test -e /data/deep/er/blob || { mkdir -p /data/deep/er && head -c 8388608 /dev/urandom > /data/deep/er/blob && sync; }; sleep 100000"
until_ok 60 "vault-0 made" 'kn get pod vault-0'
wait_pod_running vault-0 180
expect_eq "$(pod_node vault-0)" "$LOST" "vault-0's node (it prefers $LOST)"
until_ok 30 "vault-0 wrote its blob" 'pexec vault-0 test -s /data/deep/er/blob'
vault_sum=$(pexec vault-0 sha256sum /data/deep/er/blob | cut -d' ' -f1)
VAULT_PV=$(pv_of data-vault-0)

step "a snapshot of db-0's claim, on $LOST"
snapshot db-snap data-db-0

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

step "$LOST's disk attached to $LIVE: vault-0's claim moved there from it"
# The disk is mounted where an operator would (/mnt/disk-lost), and the data directory in it (the
# disk's root, or a directory in it where the disk holds kubelet's whole directory) bound under
# adopt/. Unmounted at exit too, before the node comes back (its disk must not be mounted twice).
DISK=/var/lib/kubelet/volumes/stickyvol.csi.io/adopt/disk-lost
read -r image pool_dir <<<"$(lost_disk)"
detach_disk() {
    cluster exec "$LIVE" sh -c "umount $DISK 2>/dev/null; rmdir $DISK 2>/dev/null; umount /mnt/disk-lost 2>/dev/null; rmdir /mnt/disk-lost 2>/dev/null; true"
}
defer detach_disk
cluster exec "$LIVE" sh -c "mkdir -p /mnt/disk-lost $DISK && mount -o loop $image /mnt/disk-lost && mount --bind /mnt/disk-lost/$pool_dir $DISK"
t0=$(now)
moved=$(k -n "$DRIVER_NS" exec stickyvol-controller-0 -c stickyvol -- \
    stickyvol cluster move "$NS/data-vault-0" --to "$LIVE" --from-disk disk-lost --timeout 240 2>&1) ||
    fail "cluster move --from-disk: $moved"
log "measured: vault-0's claim moved from $LOST's disk in $(since "$t0") s: ${moved##*$'\n'}"
[[ $(pv_node "$(pv_of data-vault-0)") == "$LIVE" ]] || fail "data-vault-0 is not on $LIVE: $(pv_of data-vault-0)"
wait_pod_running vault-0 180
expect_eq "$(pod_node vault-0)" "$LIVE" "vault-0's node after the move"
expect_eq "$(pexec vault-0 sha256sum /data/deep/er/blob | cut -d' ' -f1)" "$vault_sum" "the blob's checksum on $LIVE"
detach_disk

step "a restore of the snapshot while $LOST is gone: not placed, nothing made"
apply <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: restored}
spec:
  storageClassName: $CLASS
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 64Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: db-snap}
YAML
pod restored restored
until_ok 60 "a SourceNodeGone event on the restore" \
    '[[ -n $(kn get events --field-selector involvedObject.name=restored,reason=SourceNodeGone -o name) ]]'
expect_eq "$(kn get pvc restored -o jsonpath='{.spec.volumeName}')" "" "the restore's volume while $LOST is gone"

step "$LOST comes back: db-0 runs there with its data, and the restore with the snapshot's"
bring_back || fail "$LOST not Ready again"
wait_running_on "$LOST" 300
wait_pod_running restored 300
expect_eq "$(pod_node restored)" "$LOST" "the restore's node"
expect_eq "$(pexec restored cat /data/written)" db-0 "the restore's data"
until_ok 30 "db-0 looked at its volume" 'pexec db-0 test -e /tmp/found-at-start'
expect_eq "$(pexec db-0 cat /tmp/found-at-start)" written "what the volume held when db-0 started again"
