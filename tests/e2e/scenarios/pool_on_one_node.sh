# A class whose pool only one node has: the cluster runs deploy/examples/pool-on-some-nodes (the
# optional pool "nvme" at /mnt/disks/nvme/stickyvol), and only node 1 has that disk
# (versions.sh, E2E_NVME_SIZES). The class of deploy/examples/storageclass-pool.yaml then gets
# capacity on node 1 alone, its claims land there even when the pod prefers the other node, and a
# pod held to the other node stays Pending, saying why. Each node's doctor (the node plugin's init
# container) reports on the cluster, the kernel and the disks.
source "$(dirname "$0")/../lib/scenario.sh"

CLASS=stickyvol-nvme
with_disk=${E2E_NODES[0]} without=${E2E_NODES[1]}
k apply -f "$REPO_DIR/deploy/examples/storageclass-pool.yaml" >/dev/null
defer 'k delete storageclass "$CLASS" --ignore-not-found >/dev/null'

step "each driver's doctor says whether its node has the pool"
# The doctor's log of the pod's current run: an earlier scenario may have rebooted a node or
# restarted its driver, and just after that kubelet may not serve the new run's log yet.
doctor_log() { k -n "$DRIVER_NS" logs "$(ready_driver_pod "$1")" -c doctor 2>&1; }
# wait_doctor_says NODE TEXT: the doctor's log on NODE says TEXT, within a minute.
wait_doctor_says() {
    local deadline=$((SECONDS + $(wait_limit 60))) said
    until said=$(doctor_log "$1") && grep -qF "$2" <<<"$said"; do
        ((SECONDS < deadline)) || fail "the doctor on $1 does not say '$2': $(tail -5 <<<"$said")"
        sleep 1
    done
}
wait_doctor_says "$without" "pool nvme (optional) is absent"
wait_doctor_says "$with_disk" "pool nvme filesystem: xfs"

step "each doctor checked the cluster's Kubernetes, its node's kernel and its node's disk"
# The minimums (src/doctor/versions.rs) against what this cluster runs, and the nodes' data
# directories on the filesystems versions.sh gives them (E2E_POOL_FS).
for i in "${!E2E_NODES[@]}"; do
    node=${E2E_NODES[$i]}
    report=$(doctor_log "$node")
    grep -qF "[ok]   Kubernetes $KUBE_VERSION (1.32 or newer is needed)" <<<"$report" ||
        fail "the doctor on $node did not check the cluster's version: $report"
    grep -qF "[ok]   kernel $(uname -r) (Linux 5.12 or newer is needed)" <<<"$report" ||
        fail "the doctor on $node did not check its kernel: $report"
    grep -qF "data directory filesystem: ${E2E_POOL_FS[$i]};" <<<"$report" ||
        fail "the doctor on $node does not find its data directory on ${E2E_POOL_FS[$i]}: $report"
done

step "capacity for the class on $with_disk only"
until_ok 120 "a CSIStorageCapacity of $CLASS for $with_disk" '[[ -n $(capacity_of "$CLASS" "$with_disk") ]]'
bytes=$(to_bytes "$(capacity_of "$CLASS" "$with_disk")")
disk_free=$(cluster exec "$with_disk" df -B1 --output=avail /mnt/disks/nvme | tail -1)
((bytes > 0 && bytes <= disk_free)) ||
    fail "$with_disk's capacity $bytes for $CLASS is not within its disk's free space $disk_free"
other=$(capacity_of "$CLASS" "$without")
[[ -z $other || $(to_bytes "$other") == 0 ]] || fail "$without reports $other for a pool it lacks"

step "a claim of the class lands on $with_disk although its pod prefers $without"
claim fast 256Mi "$CLASS"
kn apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: fast-user}
spec:
  terminationGracePeriodSeconds: 1
  affinity:
    nodeAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        preference:
          matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$without]}]
  containers:
  - name: app
    image: $TEST_IMAGE
    command: [sh, -c, "echo on-nvme >/data/f && sync && sleep 100000"]
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - name: data
    persistentVolumeClaim: {claimName: fast}
YAML
wait_pod_running fast-user 180
expect_eq "$(pod_node fast-user)" "$with_disk" "the node of the pod"
pv=$(pv_of fast)
expect_eq "$(pv_node "$pv")" "$with_disk" "the node the volume is pinned to"
expect_eq "$(pexec fast-user cat /data/f)" on-nvme "what the pod wrote"
handle=$(k get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
listing=$(k -n "$DRIVER_NS" exec "$(ready_driver_pod "$with_disk")" -c stickyvol -- stickyvol volumes --pool nvme)
[[ $listing == *"$handle"* ]] || fail "stickyvol volumes --pool nvme does not list $handle: $listing"

step "a pod of the class held to $without stays Pending, saying why"
claim stuck 256Mi "$CLASS"
pod stuck-user stuck "$without"
until_ok 60 "an event saying $without lacks storage for the claim" \
    '[[ $(kn get events --field-selector involvedObject.name=stuck-user -o jsonpath="{.items[*].message}") == *"did not have enough free storage"* ]]'
expect_eq "$(kn get pod stuck-user -o jsonpath='{.status.phase}')" Pending "the pod held to $without"
