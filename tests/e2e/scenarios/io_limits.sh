# IO limits through a VolumeAttributesClass (docs/operations/storage.md, "IO limits"): a block
# claim made with a class of 20 writes a second is held to it in its pod (the pod's cgroup on the
# node has the limit on the volume's device, and 60 direct writes take about 3 s); the claim's
# class changed to 400 a second while the pod runs (csi-resizer -> the controller -> the node
# through the PV) is the claim's current class once the node has set it, and the same writes go
# at least three times as fast; a directory claim of a limited class is refused, saying why.
# The nodes are cgroup v1: direct writes are what v1 can limit (buffered writeback is not).
# e2e-lane: volumes
source "$(dirname "$0")/../lib/scenario.sh"
export BLOCK=1

slow=$NS-20 fast=$NS-400
# Not waited for: a class in use keeps its vac-protection finalizer until the claims go with the
# namespace, after the deferred steps.
defer 'k delete volumeattributesclass "$slow" "$fast" --ignore-not-found --wait=false >/dev/null'
k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {name: $slow}
driverName: stickyvol.csi.io
parameters: {writeIOPS: "20"}
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {name: $fast}
driverName: stickyvol.csi.io
parameters: {writeIOPS: "400"}
YAML

apply <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: raw}
spec:
  storageClassName: stickyvol
  volumeAttributesClassName: $slow
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 64Mi}}
YAML
pod writer raw "" "sleep 100000"
wait_pod_running writer 120
node=$(pod_node writer)
uid=$(kn get pod writer -o jsonpath='{.metadata.uid}')

# The pod's cgroup on its node.
pod_cgroup() {
    local dir
    dir=$(find "/sys/fs/cgroup/blkio/$node/kubepods" -maxdepth 2 -type d -name "pod$uid" | head -1)
    [[ -n $dir ]] || fail "no cgroup of pod $uid under /sys/fs/cgroup/blkio/$node/kubepods"
    echo "$dir"
}
# The limit on writes, as the pod's cgroup on its node holds it ("" if none).
write_iops() { awk '{print $2}' "$(pod_cgroup)/blkio.throttle.write_iops_device" | head -1; }
# Whether each of the pod's containers' cgroups has the write limit N too: cgroup v1 throttles
# no deeper than the cgroup limited, and the driver gives a new container the limit within
# about 2 s.
containers_limited() {
    local dir
    for dir in "$(pod_cgroup)"/*/; do
        [[ $(awk '{print $2}' "$dir/blkio.throttle.write_iops_device" | head -1) == "$1" ]] || return 1
    done
}
# Milliseconds for 60 direct 4 KiB writes to the device, in the pod (busybox's date has no %N:
# the clock is /proc/uptime's, in hundredths of a second).
write_ms() {
    pexec writer sh -c 'a=$(cut -d" " -f1 /proc/uptime); dd if=/dev/zero of=/dev/xvda bs=4096 count=60 oflag=direct 2>/dev/null; b=$(cut -d" " -f1 /proc/uptime); awk "BEGIN { printf \"%d\", ($b - $a) * 1000 }"'
}

step "made with $slow: its pod's cgroup has the limit, and it holds"
expect_eq "$(write_iops)" 20 "the pod's write IOPS limit"
until_ok 30 "the limit on the pod's containers' cgroups" 'containers_limited 20'
slow_ms=$(write_ms)
((slow_ms >= 2000)) || fail "60 writes at 20 a second took $slow_ms ms"

step "changed to $fast while the pod runs"
kn patch pvc raw --type merge -p "{\"spec\":{\"volumeAttributesClassName\":\"$fast\"}}" >/dev/null
until_ok 90 "the claim's current class $fast" \
    '[[ $(kn get pvc raw -o jsonpath="{.status.currentVolumeAttributesClassName}") == "$fast" ]]'
expect_eq "$(write_iops)" 400 "the pod's write IOPS limit after the change"
containers_limited 400 || fail "the pod's containers' cgroups do not have the new limit"
fast_ms=$(write_ms)
((fast_ms * 3 <= slow_ms)) || fail "at 400 a second 60 writes took $fast_ms ms, at 20 $slow_ms ms"
log "measured: 60 direct 4 KiB writes in the pod: $slow_ms ms at writeIOPS 20, $fast_ms ms at 400 (after the class changed on the running pod)"

step "a directory claim of a limited class is refused, saying why"
export BLOCK=0
apply <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: dir}
spec:
  storageClassName: stickyvol
  volumeAttributesClassName: $slow
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 64Mi}}
YAML
pod user dir
until_ok 120 "a ProvisioningFailed event saying why" \
    '[[ $(provisioning_failure dir) == *"apply to block and image volumes"* ]]'
log "the directory claim's event: $(provisioning_failure dir)"
