# A directory volume whose pool cannot limit its size (the e2e nodes' pool, plain ext4) behaves
# like an emptyDir with a sizeLimit: filled past its size, its pod is evicted through the
# Eviction API with an Event on its claim, while another pod on the node keeps running; a claim
# of an `onOverflow: report` class filled the same way evicts nothing, and its Event and the
# driver's metrics say so. The overflow check acts when kubelet's periodic NodeGetVolumeStats
# (every minute) finds a volume above its size, or at its own round (--overflow-check-interval,
# 60 s in deploy/), whichever comes first: the waits allow both and a margin. Takes 1.5-3 min.
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
metrics=$(driver_metrics) || fail "the metrics endpoint did not answer"
grep -q '^stickyvol_overflow_evictions_total{result="evicted"} [1-9]' <<<"$metrics" ||
    fail "stickyvol_overflow_evictions_total does not count the eviction: $(grep overflow <<<"$metrics")"

step "the other pods on $node are untouched"
for p in reporter bystander; do
    expect_eq "$(kn get pod "$p" -o jsonpath='{.status.phase}{.metadata.deletionTimestamp}')" Running \
        "pod $p"
done
[[ -z $(events other OverflowEvicted)$(events kept OverflowEvicted) ]] || fail "another claim's pod was evicted"
