# Group snapshots (deploy/components/group-snapshots): a StatefulSet's pod appends numbered records
# to two claims, each record to its data claim and then to its log claim, and a VolumeGroupSnapshot
# of both (a label selector) is taken ten times while it writes. Each becomes ready with one
# VolumeSnapshot per claim; the twenty are restored into new claims, read by one pod: in every
# round the two restored logs end at the same record, or the data log one record ahead (the cut
# fell between the two writes), never further apart, which a cut that is not one instant would
# show. A group of claims on both nodes is refused with a sentence on the VolumeGroupSnapshot, the
# other node's plugin cannot take a group to itself, and deleting the groups removes their
# members. The claims are image volumes (fsType ext4) on the node whose pool has reflinks.
# e2e-lane: growth
source "$(dirname "$0")/../lib/scenario.sh"

ROUNDS=10

# The node whose default pool copies by reference, from its driver's log (read whole first: a
# grep that stops at its first match would cut kubectl's pipe, and pipefail take that for a no).
reflink_node=""
for n in "${E2E_NODES[@]}"; do
    driver_log=$(k -n "$DRIVER_NS" logs "$(ready_driver_pod "$n")" -c stickyvol)
    if grep 'pool ready pool=default ' <<<"$driver_log" | grep -q 'snapshots="reflink'; then
        reflink_node=$n
        break
    fi
done
[[ -n $reflink_node ]] || fail "no node's default pool has reflinks (E2E_POOL_FS)"
other=$(other_node "$reflink_node")

k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $NS-image}
provisioner: stickyvol.csi.io
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
parameters: {csi.storage.k8s.io/fstype: ext4}
YAML
defer "k delete storageclass $NS-image --ignore-not-found >/dev/null"

step "a StatefulSet writing numbered records to two claims"
apply <<YAML
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  replicas: 1
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      nodeSelector: {kubernetes.io/hostname: $reflink_node}
      terminationGracePeriodSeconds: 1
      containers:
      - name: app
        image: $TEST_IMAGE
        command: [sh, -c, 'n=0; while :; do echo \$n >> /data/log; echo \$n >> /wal/log; n=\$((n+1)); done']
        volumeMounts: [{name: data, mountPath: /data}, {name: wal, mountPath: /wal}]
  volumeClaimTemplates:
  - metadata: {name: data, labels: {group: db}}
    spec: {storageClassName: $NS-image, accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
  - metadata: {name: wal, labels: {group: db}}
    spec: {storageClassName: $NS-image, accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
YAML
until_ok 180 "db-0 runs" 'kn get pod db-0 >/dev/null 2>&1'
wait_pod_running db-0 180
until_true 30 "both logs have records" pexec db-0 sh -c 'test -s /data/log && test -s /wal/log'

# group NAME SELECTOR-LABEL: a VolumeGroupSnapshot of the claims labelled group=SELECTOR-LABEL,
# in the class the controller keeps for their node.
group() {
    apply <<YAML
apiVersion: groupsnapshot.storage.k8s.io/v1
kind: VolumeGroupSnapshot
metadata: {name: $1}
spec:
  volumeGroupSnapshotClassName: stickyvol-$reflink_node
  source: {selector: {matchLabels: {group: $2}}}
YAML
}
# member GROUP CLAIM: the VolumeSnapshot snapshot-controller made of CLAIM for GROUP (it owns it).
member() {
    kn get volumesnapshot -o json | python3 -c '
import json, sys
group, claim = sys.argv[1], sys.argv[2]
for vs in json.load(sys.stdin)["items"]:
    owners = [o["name"] for o in vs["metadata"].get("ownerReferences", []) if o["kind"] == "VolumeGroupSnapshot"]
    if group in owners and vs["spec"]["source"].get("persistentVolumeClaimName") == claim:
        print(vs["metadata"]["name"])
' "$1" "$2"
}

step "a VolumeGroupSnapshotClass per node, labelled with it"
for n in "${E2E_NODES[@]}"; do
    until_ok 60 "the class of $n" \
        "[[ \$(k get volumegroupsnapshotclass stickyvol-$n -o jsonpath='{.metadata.labels.snapshot\\.storage\\.kubernetes\\.io/managed-by}') == $n ]]"
done

step "$ROUNDS group snapshots while the pod writes"
started=$SECONDS
for ((i = 1; i <= ROUNDS; i++)); do
    group "g$i" db
    kn wait --for=jsonpath='{.status.readyToUse}'=true "volumegroupsnapshot/g$i" --timeout=180s >/dev/null ||
        fail "group g$i not ready: $(kn get volumegroupsnapshot "g$i" -o jsonpath='{.status}')"
done
log "measured: $ROUNDS group snapshots of two claims ready in $((SECONDS - started)) s"
gc=$(kn get volumegroupsnapshot g1 -o jsonpath='{.status.boundVolumeGroupSnapshotContentName}')
expect_eq "$(k get volumegroupsnapshotcontent "$gc" -o jsonpath='{.metadata.labels.snapshot\.storage\.kubernetes\.io/managed-by}')" \
    "$reflink_node" "the node the controller sent the group to"
refused_to "$other" "managed by its own node" "take $reflink_node's group to itself" \
    label volumegroupsnapshotcontent "$gc" --overwrite --dry-run=server "snapshot.storage.kubernetes.io/managed-by=$other"

step "every group restored: two new claims each, read by one pod"
mounts="" volumes="" readers=""
for ((i = 1; i <= ROUNDS; i++)); do
    for part in data wal; do
        vs=$(member "g$i" "$part-db-0")
        [[ -n $vs ]] || fail "group g$i has no member of the $part claim: $(kn get volumesnapshot -o name)"
        apply <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: r$i-$part}
spec:
  storageClassName: $NS-image
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 64Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: $vs}
YAML
        mounts+="{name: r$i-$part, mountPath: /r/$i/$part},"
        volumes+="{name: r$i-$part, persistentVolumeClaim: {claimName: r$i-$part}},"
    done
    readers+="echo $i \$(tail -n1 /r/$i/data/log) \$(tail -n1 /r/$i/wal/log); "
done
apply <<YAML
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  nodeSelector: {kubernetes.io/hostname: $reflink_node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: $TEST_IMAGE
    command: [sh, -c, "sleep 100000"]
    volumeMounts: [${mounts%,}]
  volumes: [${volumes%,}]
YAML
wait_pod_running reader 300
lasts=$(pexec reader sh -c "$readers")
same=0 ahead=0
while read -r round data wal; do
    [[ $data =~ ^[0-9]+$ && $wal =~ ^[0-9]+$ ]] || fail "round $round: unreadable logs (data '$data', log '$wal')"
    if ((data == wal)); then
        same=$((same + 1))
    elif ((data == wal + 1)); then
        ahead=$((ahead + 1))
    else
        fail "round $round: the restored data ends at record $data and the log at $wal: not one instant"
    fi
done <<<"$lasts"
((same + ahead == ROUNDS)) || fail "read $((same + ahead)) rounds of $ROUNDS: $lasts"
log "measured: $ROUNDS restored groups: both logs at the same record in $same, the data one record ahead in $ahead"

step "a group of claims on both nodes is refused, saying why"
claim span-a 64Mi "$NS-image"
claim span-b 64Mi "$NS-image"
kn label pvc span-a span-b group=span >/dev/null
pod span-a-user span-a "$reflink_node"
pod span-b-user span-b "$other"
wait_pod_running span-a-user 180
wait_pod_running span-b-user 180
group span span
until_ok 180 "the group's error saying why" \
    '[[ $(kn get volumegroupsnapshot span -o jsonpath="{.status.error.message}") == *"same node"* ]]'

step "deleting the groups removes their members"
kn delete pod reader --wait=true --timeout=120s >/dev/null
for ((i = 1; i <= ROUNDS; i++)); do kn delete pvc "r$i-data" "r$i-wal" --wait=false >/dev/null; done
kn delete volumegroupsnapshot --all --wait=true --timeout=300s >/dev/null ||
    fail "groups not deleted: $(kn get volumegroupsnapshot -o name)"
until_ok 120 "the members are gone" '[[ -z $(kn get volumesnapshot -o name) ]]'
# Their contents too: snapshot-controller makes them without a node's label, the controller
# gives them their node's, and only that node's csi-snapshotter lets them go.
contents_left() {
    k get volumesnapshotcontent -o \
        jsonpath="{range .items[?(@.spec.volumeSnapshotRef.namespace=='$NS')]}{.metadata.name} {end}"
}
until_ok 120 "the members' VolumeSnapshotContents are gone" '[[ -z $(contents_left) ]]'
driver=$(ready_driver_pod "$reflink_node")
deleted=$(k -n "$DRIVER_NS" logs "$driver" -c stickyvol | grep -c 'deleted group snapshot' || true)
((deleted >= ROUNDS)) || fail "the driver on $reflink_node logged $deleted group deletions, not $ROUNDS"
