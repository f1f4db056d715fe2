# Restores and clones find their node by themselves: a snapshot of a claim on the second node,
# then restores and a clone used by pods that name no node run there at once (the controller's
# restore placement sets their selected node). Timed against the same restore with a pinned pod
# ("measured: ..."; E2E_PLACEMENT_ROUNDS rounds of each, 3 by default). Then what must not be
# placed: a pod that excludes the source's node (an Event, nothing made), and a cordoned source
# node (an Event, nothing made; placed once uncordoned). Last, a restore of a snapshot whose
# source claim is deleted. A source node that is gone: node_loss_keep.
source "$(dirname "$0")/../lib/scenario.sh"

SOURCE_NODE=${E2E_NODES[1]}
OTHER_NODE=${E2E_NODES[0]}
ROUNDS=${E2E_PLACEMENT_ROUNDS:-3}
defer 'k uncordon "$SOURCE_NODE" >/dev/null 2>&1'

# restore NAME [SOURCE-KIND SOURCE]: a claim restored from snapshot snap (or another source).
restore() {
    local source="{apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}"
    [[ ${2:-} == claim ]] && source="{kind: PersistentVolumeClaim, name: $3}"
    apply <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1}
spec:
  storageClassName: stickyvol
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 64Mi}}
  dataSource: $source
YAML
}
# claim_event CLAIM REASON: the note of our Event REASON about CLAIM, empty while there is none.
claim_event() {
    kn get events --field-selector "involvedObject.name=$1,reason=$2" \
        -o jsonpath='{.items[0].note}{.items[0].message}' 2>/dev/null
}
now() { date +%s.%N; }
since() { python3 -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.2f}")' "$1"; }

step "a claim with data on $SOURCE_NODE, and its snapshot"
claim source 64Mi
pod writer source "$SOURCE_NODE" "echo restore-me > /data/file && sync && sleep 100000"
wait_pod_running writer 180
until_true 30 "the writer wrote" pexec writer test -s /data/file
snapshot snap source

# timed NAME [NODE]: apply of a restore claim and its pod (pinned to NODE if given) to Ready, in
# seconds; the pod must be on the source's node with the snapshot's data.
timed() {
    local t0 took
    t0=$(now)
    restore "$1"
    pod "$1" "$1" "${2:-}"
    wait_pod_running "$1" 120
    took=$(since "$t0")
    expect_eq "$(pod_node "$1")" "$SOURCE_NODE" "$1's node"
    expect_eq "$(pexec "$1" cat /data/file)" restore-me "$1's data"
    # Gone at once: node 2's pool (4 GiB) would not hold every round's claim.
    kn delete pod "$1" --wait=false >/dev/null
    kn delete pvc "$1" --wait=false >/dev/null
    echo "$took"
}
step "$ROUNDS restores with a pinned pod, then $ROUNDS with a pod that names no node, one at a time"
pinned=() unpinned=()
for ((i = 0; i < ROUNDS; i++)); do pinned+=("$(timed "pinned-$i" "$SOURCE_NODE")"); done
for ((i = 0; i < ROUNDS; i++)); do unpinned+=("$(timed "free-$i")"); done
log "measured: restore to Ready, pinned pod: ${pinned[*]} s; unpinned pod: ${unpinned[*]} s"
[[ -n $(claim_event free-0 PlacedOnSourceNode) ]] || fail "no PlacedOnSourceNode event on free-0"

step "5 restores and a clone at once, pods naming no node"
for i in 1 2 3 4 5; do restore "many-$i"; pod "many-$i" "many-$i"; done
restore cloned claim source
pod cloned cloned
for p in many-1 many-2 many-3 many-4 many-5 cloned; do
    wait_pod_running "$p" 120
    expect_eq "$(pod_node "$p")" "$SOURCE_NODE" "$p's node"
done
expect_eq "$(pexec cloned cat /data/file)" restore-me "the clone's data"
kn delete pod many-1 many-2 many-3 many-4 many-5 cloned --wait=false >/dev/null

step "a pod that excludes $SOURCE_NODE: an Event, nothing made"
# The pod first: placement checks the pods there when it looks at the claim (a pod made after
# the claim was placed learns it from the scheduler: "volume node affinity conflict").
pod excluded excluded "$OTHER_NODE"
restore excluded
until_ok 60 "a PodExcludesSourceNode event on the claim" '[[ -n $(claim_event excluded PodExcludesSourceNode) ]]'
grep -q "pod excluded" <<<"$(claim_event excluded PodExcludesSourceNode)" ||
    fail "the event does not name the pod: $(claim_event excluded PodExcludesSourceNode)"
# The provisioner on the other node was asked and said where the source is, without
# rescheduling (FAILED_PRECONDITION): the claim keeps its node and no volume is made.
until_ok 60 "the other node's provisioner refused" \
    '[[ $(claim_event excluded ProvisioningFailed) == *"on another node"* ]]'
expect_eq "$(kn get pvc excluded -o jsonpath='{.spec.volumeName}')" "" "the excluded claim's volume"
kn delete pod excluded --wait=false >/dev/null
kn delete pvc excluded --wait=false >/dev/null

step "$SOURCE_NODE cordoned: an Event, nothing made; uncordoned: placed"
k cordon "$SOURCE_NODE" >/dev/null
restore while-cordoned
pod while-cordoned while-cordoned
until_ok 60 "a SourceNodeCordoned event on the claim" '[[ -n $(claim_event while-cordoned SourceNodeCordoned) ]]'
expect_eq "$(kn get pvc while-cordoned -o jsonpath='{.spec.volumeName}')" "" "the claim's volume while cordoned"
k uncordon "$SOURCE_NODE" >/dev/null
wait_pod_running while-cordoned 120
expect_eq "$(pod_node while-cordoned)" "$SOURCE_NODE" "the node once uncordoned"

step "the source claim deleted: its snapshot still restores there"
kn delete pod writer --wait=true --timeout=60s >/dev/null
kn delete pvc source --wait=true --timeout=120s >/dev/null
restore orphan-restore
pod orphan-restore orphan-restore
wait_pod_running orphan-restore 120
expect_eq "$(pod_node orphan-restore)" "$SOURCE_NODE" "the restore's node"
expect_eq "$(pexec orphan-restore cat /data/file)" restore-me "the restore's data"
metrics=$(k get --raw "/api/v1/namespaces/$DRIVER_NS/pods/stickyvol-controller-0:8080/proxy/metrics")
grep -q '^stickyvol_restore_placements_total{result="placed"}' <<<"$metrics" ||
    fail "no placement counted in the controller's metrics"
