# A directory volume whose pool cannot limit its size (the e2e nodes' pool, plain ext4) behaves
# like an emptyDir with a sizeLimit: filled past its size, its pod is evicted (the node plugin
# asks on the PV, the controller evicts through the Eviction API) with an Event on its claim,
# while another pod on the node keeps running; a claim
# of an `onOverflow: report` class filled the same way evicts nothing, and its Event and the
# driver's metrics say so. The overflow check acts when kubelet's periodic NodeGetVolumeStats
# (every minute) finds a volume above its size, or at its own round (--overflow-check-interval,
# 60 s in deploy/), whichever comes first: the waits allow both and a margin. Then hostile pods
# a 100% PodDisruptionBudget keeps from eviction are fenced read-only after the grace, beside an
# image volume that keeps its blocks (below). Takes 4-7 min.
# e2e-lane: volumes
source "$(dirname "$0")/../lib/scenario.sh"

k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: e2e-overflow-report}
provisioner: stickyvol.csi.io
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
parameters: {onOverflow: report}
YAML
defer 'k delete storageclass e2e-overflow-report --ignore-not-found >/dev/null'

claim full 16Mi
pod filler full
wait_pod_running filler
node=$(pod_node filler)
claim kept 16Mi e2e-overflow-report
claim other 16Mi
pod reporter kept "$node"
pod bystander other "$node"
wait_pod_running reporter
wait_pod_running bystander

driver=$(ready_driver_pod "$node")
pool=$(k -n "$DRIVER_NS" logs "$driver" -c stickyvol | grep -m1 'pool ready pool=default ' || true)
[[ -n $pool ]] || fail "the driver on $node did not log its default pool"
[[ $pool == *'enforcement="none'* ]] || skip "the default pool on $node limits sizes: $pool"

step "filling both volumes past their 16Mi"
for p in filler reporter; do
    pexec "$p" dd if=/dev/zero of=/data/big bs=1M count=32 conv=fsync 2>/dev/null ||
        fail "writing 32 MiB into the volume of $p"
done
pexec bystander dd if=/dev/zero of=/data/small bs=1M count=4 conv=fsync 2>/dev/null

step "the filler is evicted, with Events on its claim"
events() { # events CLAIM REASON: the messages of the claim's Events of that reason
    kn get events --field-selector "involvedObject.kind=PersistentVolumeClaim,involvedObject.name=$1,reason=$2" \
        -o jsonpath='{range .items[*]}{.message}{"\n"}{end}'
}
until_ok 240 "an OverflowEvicted event on claim full" '[[ -n $(events full OverflowEvicted) ]]'
[[ $(events full OverflowEvicted) == *"evicted pod $NS/filler"* ]] ||
    fail "the eviction event names another pod: $(events full OverflowEvicted)"
[[ $(events full VolumeOverflow) == *"more than its size"* ]] ||
    fail "no VolumeOverflow event saying why on claim full: $(events full VolumeOverflow)"
until_ok 60 "the filler gone" '[[ -z $(kn get pod filler -o name --ignore-not-found) ]]'

step "onOverflow: report evicts nothing and says so"
until_ok 120 "a VolumeOverflow event on claim kept" '[[ -n $(events kept VolumeOverflow) ]]'
[[ $(events kept VolumeOverflow) == *"onOverflow: report: no pod is evicted"* ]] ||
    fail "the report event: $(events kept VolumeOverflow)"
driver_metrics() { k get --raw "/api/v1/namespaces/$DRIVER_NS/pods/$driver:8080/proxy/metrics"; }
# Set just after the round that sent the Event.
until_ok 30 "stickyvol_overflowing_volumes counting the report volume" \
    'grep -q "^stickyvol_overflowing_volumes{on_overflow=\"report\"} [1-9]" <<<"$(driver_metrics)"'
# The controller evicts (the node plugin asks on the PV): the controller counts.
metrics=$(k get --raw "/api/v1/namespaces/$DRIVER_NS/pods/stickyvol-controller-0:8080/proxy/metrics") ||
    fail "the controller's metrics endpoint did not answer"
grep -q '^stickyvol_overflow_evictions_total{result="evicted"} [1-9]' <<<"$metrics" ||
    fail "stickyvol_overflow_evictions_total does not count the eviction: $(grep overflow <<<"$metrics")"

step "the other pods on $node are untouched"
for p in reporter bystander; do
    expect_eq "$(kn get pod "$p" -o jsonpath='{.status.phase}{.metadata.deletionTimestamp}')" Running \
        "pod $p"
done
[[ -z $(events other OverflowEvicted)$(events kept OverflowEvicted) ]] || fail "another claim's pod was evicted"

# Hostile tenants on the same node and pool: a PodDisruptionBudget of minAvailable 100% keeps
# each from eviction, one hides its usage in a file it deleted but keeps open, the other makes
# its tree deeper than any walk enters. Neither is left writing: each volume is fenced read-only
# within the grace (--overflow-fence-after, 120 s in deploy/) after the check found it, while a
# neighbour's image volume on the pool keeps every block it was promised (thick by default here).
step "hostile pods behind a 100% PodDisruptionBudget, and a neighbour's image volume"
k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: e2e-overflow-image}
provisioner: stickyvol.csi.io
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
parameters: {csi.storage.k8s.io/fstype: ext4}
YAML
defer 'k delete storageclass e2e-overflow-image --ignore-not-found >/dev/null'
# The budget: minAvailable 1 of the one pod, i.e. 100% (a percentage needs a pod a controller
# manages; for a bare pod the disruption controller asks for an integer).
hostile() { # hostile NAME COMMAND: a pod on $node with a 16Mi claim NAME, guarded by a 100% budget
    claim "$1" 16Mi
    apply <<YAML
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: $1}
spec:
  minAvailable: 1
  selector: {matchLabels: {hostile: $1}}
---
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {hostile: $1}}
spec:
  nodeSelector: {kubernetes.io/hostname: $node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: $TEST_IMAGE
    command: [sh, -c, "$2"]
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - name: data
    persistentVolumeClaim: {claimName: $1}
YAML
}
# The ghost keeps its deleted file open for writing: the kernel will not make a mount read-only
# while it does, so the fence stops the container and kubelet restarts it on the read-only
# target, where the writer cannot start again (the outer sleep keeps the pod up).
hostile ghost '(exec 3>/data/ghost && rm /data/ghost && dd if=/dev/zero bs=1M count=48 >&3 2>/dev/null && sync && exec sleep 100000) || true; exec sleep 100000'
# Deeper than any path: each level is added on top by renames of short names (a shell's cd
# would need the whole path).
hostile deep 'cd /data && if [ ! -d c ]; then mkdir c && i=0 && while [ $i -lt 4100 ]; do mkdir n && mv c n/c && mv n c || exit 1; i=$((i+1)); done; fi; sleep 100000'
claim neighbour 64Mi e2e-overflow-image
pod neighbour neighbour "$node"
wait_pod_running ghost
wait_pod_running deep
wait_pod_running neighbour 180

step "the neighbour's image holds its whole size from the start"
handle=$(k get pv "$(pv_of neighbour)" -o jsonpath='{.spec.csi.volumeHandle}')
used=$(k -n "$DRIVER_NS" exec "$driver" -c stickyvol -- stickyvol volume show "$handle" --json |
    python3 -c 'import json, sys; print(json.load(sys.stdin).get("used_bytes") or 0)')
(( used >= 63 * 1024 * 1024 )) || fail "the neighbour's image has $used bytes allocated, not its 64Mi"

step "each hostile volume is refused eviction, then fenced read-only"
for c in ghost deep; do
    until_ok 240 "an OverflowEvictionRefused event on claim $c" '[[ -n $(events '"$c"' OverflowEvictionRefused) ]]'
done
[[ $(events ghost VolumeOverflow) == *"in deleted files its pods keep open"* ]] ||
    fail "the ghost's overflow does not count its deleted file: $(events ghost VolumeOverflow)"
[[ $(events deep VolumeOverflow) == *"cannot be measured"* ]] ||
    fail "the deep tree is not counted as overflowing: $(events deep VolumeOverflow)"
cannot_write() { [[ $(pexec "$1" sh -c 'touch /data/after 2>&1' || true) == *"Read-only file system"* ]]; }
until_ok 240 "an OverflowFenced event on claim deep" '[[ -n $(events deep OverflowFenced) ]]'
cannot_write deep || fail "pod deep still writes after its fence"
expect_eq "$(kn get pod deep -o jsonpath='{.status.phase}')" Running "pod deep, fenced, not killed"
until_ok 240 "an OverflowFenced event on claim ghost" '[[ -n $(events ghost OverflowFenced) ]]'
[[ $(events ghost OverflowFenced) == *"kept files open for writing on it were stopped"* ]] ||
    fail "the ghost's writer was not stopped: $(events ghost OverflowFenced)"
[[ $(events ghost OverflowFenced) == *"expand the claim"* ]] ||
    fail "the fence's event does not say how to get out: $(events ghost OverflowFenced)"
until_ok 150 "the ghost restarted, unable to write" \
    '[[ $(kn get pod ghost -o jsonpath="{.status.containerStatuses[0].restartCount}") -ge 1 ]] && cannot_write ghost'

step "the neighbour writes its whole filesystem"
avail=$(pexec neighbour df -k /data | awk 'NR == 2 { print int($4 / 1024) }')
pexec neighbour dd if=/dev/zero of=/data/fill bs=1M count="$avail" conv=fsync 2>/dev/null ||
    fail "the neighbour could not write ${avail} MiB into its image"
kn delete pod ghost deep neighbour --wait=false >/dev/null
