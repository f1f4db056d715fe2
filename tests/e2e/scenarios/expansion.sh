# Expansion while the pod runs: the claim is edited, csi-resizer and kubelet grow the volume, and
# the pod sees the new size (a block device's size; a filesystem claim's capacity).
# e2e-lane: growth
source "$(dirname "$0")/../lib/scenario.sh"

claim fs 1Gi
pod fs-user fs
BLOCK=1 claim raw 64Mi stickyvol Block
BLOCK=1 pod raw-user raw
wait_pod_running fs-user
wait_pod_running raw-user

step "grow both claims while their pods run"
kn patch pvc fs --type=merge -p '{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}' >/dev/null
kn patch pvc raw --type=merge -p '{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}' >/dev/null
capacity() { kn get pvc "$1" -o jsonpath='{.status.capacity.storage}'; }
# kubelet grows a mounted volume at its next look at the pod (up to a minute and a half).
until_ok 180 "the filesystem claim's capacity becomes 2Gi" '[[ $(capacity fs) == 2Gi ]]'
until_ok 180 "the block claim's capacity becomes 128Mi" '[[ $(capacity raw) == 128Mi ]]'
until_ok 60 "the pod sees a 128 MiB device" \
    '[[ $(pexec raw-user blockdev --getsize64 /dev/xvda) == $((128 << 20)) ]]'
expect_eq "$(k get pv "$(pv_of fs)" -o jsonpath='{.spec.capacity.storage}')" 2Gi "the filesystem PV's capacity"

step "the pod writes past the old end of the device"
pexec raw-user dd if=/dev/zero of=/dev/xvda bs=1M seek=100 count=8 conv=fsync 2>/dev/null ||
    fail "writing beyond the old 64 MiB failed"
