# Image volumes: StorageClasses with csi.storage.k8s.io/fstype ext4 and xfs, on nodes whose pool
# cannot limit a directory volume's size. A pod writing past its claim gets ENOSPC, an XFS claim
# grows while its pod runs, and a snapshot of an ext4 claim restores with its data: taken while
# its pod runs where the pool has reflinks, refused then and taken after the pod where it has
# not. (ext4 also grows online, but the kernel wants CAP_SYS_RESOURCE for it, which these
# machines' root lacks: tests/node_image.rs checks it in the VM.)
# e2e-lane: growth
source "$(dirname "$0")/../lib/scenario.sh"

for fs in ext4 xfs; do
    k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: e2e-image-$fs}
provisioner: stickyvol.csi.io
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
allowVolumeExpansion: true
parameters: {csi.storage.k8s.io/fstype: $fs}
YAML
    defer "k delete storageclass e2e-image-$fs --ignore-not-found >/dev/null"
done

claim small-ext4 64Mi e2e-image-ext4
claim small-xfs 300Mi e2e-image-xfs
pod ext4-user small-ext4 "" "echo kept > /data/file && sync && sleep 100000"
pod xfs-user small-xfs
wait_pod_running ext4-user 180
wait_pod_running xfs-user 180

# df's size of /data in the pod, in MiB.
size_mib() { pexec "$1" df -k /data | awk 'NR == 2 { print int($2 / 1024) }'; }
# Writes $2 MiB into /data/fill of pod $1; prints dd's complaint, if any.
write_mib() { pexec "$1" sh -c "dd if=/dev/zero of=/data/fill bs=1M count=$2 conv=fsync 2>&1 >/dev/null | grep -i 'space' || true"; }

step "each pod sees a filesystem of its claim's size"
ext4_size=$(size_mib ext4-user)
(( ext4_size > 48 && ext4_size <= 64 )) || fail "the ext4 volume is ${ext4_size} MiB, not about 64"
# XFS keeps a log of at least 64 MiB inside its 300 MiB minimum: 236 MiB are left for data.
xfs_size=$(size_mib xfs-user)
(( xfs_size > 200 && xfs_size <= 300 )) || fail "the xfs volume is ${xfs_size} MiB, not about 236"
expect_eq "$(k get pv "$(pv_of small-ext4)" -o jsonpath='{.spec.csi.fsType}')" ext4 "the PV's fsType"

step "a write past the claim fails with ENOSPC"
said=$(write_mib ext4-user 128)
[[ $said == *"No space left"* ]] || fail "writing 128 MiB into a 64 MiB ext4 claim: '$said'"
said=$(write_mib xfs-user 400)
[[ $said == *"No space left"* ]] || fail "writing 400 MiB into a 300 MiB xfs claim: '$said'"
pexec ext4-user rm -f /data/fill
pexec xfs-user rm -f /data/fill

step "the xfs claim grows while its pod runs"
kn patch pvc small-xfs --type=merge -p '{"spec":{"resources":{"requests":{"storage":"600Mi"}}}}' >/dev/null
until_ok 180 "the claim's capacity becomes 600Mi" \
    '[[ $(kn get pvc small-xfs -o jsonpath="{.status.capacity.storage}") == 600Mi ]]'
until_ok 60 "the pod sees the grown filesystem" '(( $(size_mib xfs-user) > 500 ))'
said=$(write_mib xfs-user 400)
[[ -z $said ]] || fail "writing 400 MiB after growing to 600 MiB: '$said'"

node=$(pod_node ext4-user)
driver=$(ready_driver_pod "$node")
pool=$(k -n "$DRIVER_NS" logs "$driver" -c stickyvol | grep -m1 'pool ready pool=default ' || true)
if [[ $pool == *'snapshots="full copies'* ]]; then
    # Frozen for a whole copy of its data, the pod's writes would stall: refused, saying why.
    step "a snapshot while the pod runs is refused on a pool without reflinks"
    apply <<YAML
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: busy-snap}
spec:
  volumeSnapshotClassName: stickyvol
  source: {persistentVolumeClaimName: small-ext4}
YAML
    until_ok 120 "the snapshot's error saying why" \
        '[[ $(kn get volumesnapshot busy-snap -o jsonpath="{.status.error.message}") == *"no reflinks"* ]]'
    kn delete volumesnapshot busy-snap --wait=true --timeout=120s >/dev/null
    kn delete pod ext4-user --wait=true --timeout=120s >/dev/null
    step "taken once the pod is gone, the snapshot restores with its data"
else
    step "a snapshot taken while the pod runs restores with its data"
fi
snapshot image-snap small-ext4
apply <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: restored}
spec:
  storageClassName: e2e-image-ext4
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 128Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: image-snap}
YAML
pod restore-reader restored "$node"
wait_pod_running restore-reader 180
expect_eq "$(pexec restore-reader cat /data/file)" kept "the restored file"
restored_size=$(size_mib restore-reader)
(( restored_size > 48 )) || fail "the restored volume is ${restored_size} MiB"
kn delete pod restore-reader --wait=true --timeout=120s >/dev/null
kn delete volumesnapshot image-snap --wait=true --timeout=120s >/dev/null || fail "snapshot not deleted"
