# Moving a StatefulSet's claims to the other node with their data (docs/operations/moving.md, "Moving a
# volume to another node"): a filesystem, a block and an image claim of one pod, asked to move
# with `stickyvol cluster move` while the pod runs (the moves wait for it), then the StatefulSet
# scaled down: its persistentVolumeClaimRetentionPolicy whenScaled: Delete deletes the claims,
# and the data stays, kept by the moves from their first step. The copies go node to node; the
# claims are made again bound to the new PVs, with their labels, annotations and the owner that
# still exists; scaled up, the pod runs on the other node with the same bytes. No PV of the
# namespace is Available at any moment (a watch records every phase), and the old PVs are gone.
# e2e-lane: moves
source "$(dirname "$0")/../lib/scenario.sh"

k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: e2e-move-image}
provisioner: stickyvol.csi.io
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
parameters: {csi.storage.k8s.io/fstype: ext4}
YAML
defer "k delete storageclass e2e-move-image --ignore-not-found >/dev/null"
defer release_kept_pvs

write='if [ ! -f /data/sums ]; then
  dd if=/dev/urandom of=/data/blob bs=1M count=24 2>/dev/null &&
  mkdir -p /data/tree/deep && echo kept > /data/tree/deep/note &&
  dd if=/dev/urandom of=/img/blob bs=1M count=16 2>/dev/null &&
  dd if=/dev/urandom of=/dev/xvda bs=1M count=16 2>/dev/null && sync &&
  { sha256sum /data/blob /img/blob; head -c 16777216 /dev/xvda | sha256sum; } > /data/sums.new &&
  mv /data/sums.new /data/sums && sync;
fi; sleep 100000'
apply <<YAML
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 1
  selector: {matchLabels: {app: db}}
  persistentVolumeClaimRetentionPolicy: {whenScaled: Delete, whenDeleted: Delete}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: app
        image: $TEST_IMAGE
        command: [sh, -c, $(printf '%s' "$write" | python3 -c 'import json, sys; print(json.dumps(sys.stdin.read()))')]
        volumeMounts: [{name: data, mountPath: /data}, {name: img, mountPath: /img}]
        volumeDevices: [{name: raw, devicePath: /dev/xvda}]
  volumeClaimTemplates:
  - metadata: {name: data, labels: {tier: db}, annotations: {team: payments}}
    spec: {storageClassName: stickyvol, accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
  - metadata: {name: raw}
    spec: {storageClassName: stickyvol, volumeMode: Block, accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
  - metadata: {name: img}
    spec: {storageClassName: e2e-move-image, accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
YAML
defer "kn delete statefulset db --ignore-not-found --wait=true --timeout=60s >/dev/null"
until_ok 120 "the StatefulSet's pod" 'kn get pod db-0 >/dev/null 2>&1'
wait_pod_running db-0 180
until_true 60 "the pod wrote its data" pexec db-0 test -s /data/sums
sums=$(pexec db-0 cat /data/sums)
node=$(pod_node db-0)
other=$(other_node "$node")
claims=(data-db-0 raw-db-0 img-db-0)
declare -A old_pv
for c in "${claims[@]}"; do old_pv[$c]=$(pv_of "$c"); done

move() { k -n "$DRIVER_NS" exec stickyvol-controller-0 -c stickyvol -- stickyvol cluster move "$@" 2>&1; }

step "refused at once: a claim already on the node, a node that does not exist"
out=$(move "$NS/data-db-0" --to "$node") && fail "a move to the claim's own node was asked: $out"
[[ $out == *"is on node $node already"* ]] || fail "refused, but said: $out"
out=$(move "$NS/data-db-0" --to no-such-node) && fail "a move to no node was asked: $out"
[[ $out == *"there is no node no-such-node"* ]] || fail "refused, but said: $out"

step "every phase of the namespace's PVs watched"
watch_pv_phases

step "three moves to $other asked while the pod runs"
started=$SECONDS
declare -A mover
for c in "${claims[@]}"; do
    move "$NS/$c" --to "$other" --timeout 300 >"$E2E_STATE/results/$NS-$c.move" &
    mover[$c]=$!
done
for c in "${claims[@]}"; do
    until_ok 60 "PV ${old_pv[$c]} kept (Retain) by its move" \
        '[[ $(k get pv "${old_pv[$c]}" -o jsonpath="{.spec.persistentVolumeReclaimPolicy}") == Retain ]]'
done
until_ok 30 "the moves wait for the pod" \
    'kn get events --field-selector reason=MoveWaiting -o name | grep -q .'
expect_eq "$(pod_node db-0)" "$node" "the pod's node while the moves wait (never yanked)"

step "scaled down: whenScaled: Delete deletes the claims; the moves go on"
kn scale statefulset db --replicas=0 >/dev/null
for c in "${claims[@]}"; do
    # On one line, so that the run's summary keeps it whole.
    wait "${mover[$c]}" || fail "the move of $c failed: $(tr '\n' ' ' <"$E2E_STATE/results/$NS-$c.move") -- the controller's moves said: $(k -n "$DRIVER_NS" logs stickyvol-controller-0 -c stickyvol --since=10m | grep -F "moves:" | tail -12 | tr '\n' ' ')"
    log "$c: $(tail -n 1 "$E2E_STATE/results/$NS-$c.move")"
done
log "measured: three 64 MiB claims moved in $((SECONDS - started)) s (from the request, the pod's stop included)"

step "the claims are bound on $other, as they were"
ours="${old_pv[*]} "
for c in "${claims[@]}"; do
    wait_pvc_bound "$c" 30
    new=$(pv_of "$c")
    ours+="$new "
    [[ $new != "${old_pv[$c]}" ]] || fail "$c is still bound to its old PV"
    expect_eq "$(pv_node "$new")" "$other" "the node of $c's new PV"
    expect_eq "$(k get pv "$new" -o jsonpath='{.spec.persistentVolumeReclaimPolicy}')" Delete \
        "$c's new PV's reclaim policy (the old one's)"
    until_ok 120 "the old PV ${old_pv[$c]} deleted" '! k get pv "${old_pv[$c]}" >/dev/null 2>&1'
done
expect_eq "$(kn get pvc data-db-0 -o jsonpath='{.metadata.labels.tier}/{.metadata.annotations.team}')" \
    db/payments "data-db-0's label and annotation"
expect_eq "$(kn get pvc data-db-0 -o jsonpath='{.metadata.ownerReferences[*].kind}')" StatefulSet \
    "data-db-0's owners (the StatefulSet; the deleted pod dropped)"
# The controller says Moved just after it finishes the move, which is what the mover waits for:
# the Event may land a moment after the claim is bound.
until_ok 30 "a Moved Event on data-db-0" \
    "kn get events --field-selector involvedObject.name=data-db-0 -o jsonpath='{range .items[*]}{.reason}{\"\\n\"}{end}' | grep -qx Moved"

step "scaled up: the pod runs on $other with the same bytes"
kn scale statefulset db --replicas=1 >/dev/null
until_ok 60 "the StatefulSet's pod" 'kn get pod db-0 >/dev/null 2>&1'
wait_pod_running db-0 180
expect_eq "$(pod_node db-0)" "$other" "the pod's node"
now=$(pexec db-0 sh -c '{ sha256sum /data/blob /img/blob; head -c 16777216 /dev/xvda | sha256sum; }')
expect_eq "$now" "$sums" "the checksums of the filesystem, the image and the block device"
expect_eq "$(pexec db-0 cat /data/tree/deep/note)" kept "a file deep in the tree"

step "no PV of the namespace was Available at any moment"
expect_never_available $ours
