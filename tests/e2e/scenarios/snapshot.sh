# A VolumeSnapshot of a claim becomes ready; the other node's plugin, with its own credentials,
# may not delete the claim's PV, update the claim, relabel the snapshot's content (restores once
# followed the label) or patch another driver's PV, while the owner's plugin may; a claim restored
# from the snapshot and a clone of the claim land on the source's node with its data. No node
# plugin may evict a pod, and the controller refuses a node's request to evict a pod that does
# not use the asking volume.
# e2e-lane: growth
source "$(dirname "$0")/../lib/scenario.sh"

claim source 128Mi
pod writer source "" "echo snapshot-me > /data/file && sync && sleep 100000"
wait_pod_running writer
node=$(pod_node writer)
until_true 30 "the writer wrote" pexec writer test -s /data/file

step "snapshot"
snapshot snap source
pexec writer sh -c 'echo changed-after > /data/file'

step "the other node's plugin cannot touch this node's PV, claim or snapshot content"
# With the credentials each node plugin holds (rbac-node.yaml, stickyvol-node-volumes), as
# server-side dry runs: the owner's plugin may, the other node's may not.
other=$(other_node "$node")
content=$(kn get volumesnapshot snap -o jsonpath='{.status.boundVolumeSnapshotContentName}')
source_pv=$(pv_of source)
label='{"metadata": {"labels": {"e2e": "x"}}}'
refused_to "$other" "pinned to its own node" "delete $node's PV" delete pv "$source_pv" --dry-run=server
refused_to "$other" "managed by its own node" "pull restores of $node's snapshot to itself" \
    label volumesnapshotcontent "$content" --overwrite --dry-run=server "snapshot.storage.kubernetes.io/managed-by=$other"
# The provisioner updates claims (a replace: its role has no patch on them).
refused_to "$other" "claims selected for its own node" "update $node's claim" \
    replace --dry-run=server -f <(kn get pvc source -o json)
as_node_plugin "$node" replace --dry-run=server -f <(kn get pvc source -o json) >/dev/null ||
    fail "the node plugin on $node may not update its own claim"
as_node_plugin "$node" delete pv "$source_pv" --dry-run=server >/dev/null ||
    fail "the node plugin on $node may not delete its own PV"
as_node_plugin "$node" patch volumesnapshotcontent "$content" --type=merge -p "$label" --dry-run=server >/dev/null ||
    fail "the node plugin on $node may not patch its own snapshot content"
# A PV of another driver, pinned to the other node itself.
k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: $NS-foreign}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  csi: {driver: other.csi.example.com, volumeHandle: foreign}
  nodeAffinity: {required: {nodeSelectorTerms: [{matchExpressions: [{key: topology.stickyvol.csi.io/node, operator: In, values: [$other]}]}]}}
YAML
defer 'k delete pv "$NS-foreign" --ignore-not-found >/dev/null'
refused_to "$other" "pinned to its own node" "patch another driver's PV" \
    patch pv "$NS-foreign" --type=merge -p "$label" --dry-run=server

step "a restore and a clone"
apply <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: restored}
spec:
  storageClassName: stickyvol
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 128Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: cloned}
spec:
  storageClassName: stickyvol
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 128Mi}}
  dataSource: {kind: PersistentVolumeClaim, name: source}
YAML
# Pinned to the source's node, as users do with restore placement off (restore_placement.sh
# shows the unpinned way).
pod restore-reader restored "$node"
pod clone-reader cloned "$node"
wait_pod_running restore-reader 180
wait_pod_running clone-reader 180
expect_eq "$(pv_node "$(pv_of restored)")" "$node" "the restore's node"
expect_eq "$(pv_node "$(pv_of cloned)")" "$node" "the clone's node"
expect_eq "$(pexec restore-reader cat /data/file)" snapshot-me "the restore's data (as at the snapshot)"
expect_eq "$(pexec clone-reader cat /data/file)" changed-after "the clone's data (as at the clone)"

step "evictions: no node plugin evicts; the controller evicts only the asking volume's pods"
eviction=$(mktemp)
defer 'rm -f "$eviction"'
printf '{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "writer", "namespace": "%s"}, "deleteOptions": {"preconditions": {"uid": "%s"}}}' \
    "$NS" "$(kn get pod writer -o jsonpath='{.metadata.uid}')" >"$eviction"
evict_writer=(create --raw "/api/v1/namespaces/$NS/pods/writer/eviction?dryRun=All" -f "$eviction")
refused_to "$other" "cannot create resource" "evict a pod on $node" "${evict_writer[@]}"
refused_to "$node" "cannot create resource" "evict a pod on its own node" "${evict_writer[@]}"
# A request (kit::eviction_request) on the source's PV, naming a pod of the same node that uses
# another claim: the controller reads the pod and refuses, with an Event on the claim.
patch=$(python3 -c 'import json, sys, time
ns, uid = sys.argv[1:3]
request = {"pods": [{"namespace": ns, "name": "restore-reader", "uid": uid}],
           "why": "e2e: a request naming another claim'"'"'s pod", "expiresUnixMs": int(time.time() + 300) * 1000}
print(json.dumps({"metadata": {"labels": {"stickyvol.csi.io/eviction-requested": "true"},
                               "annotations": {"stickyvol.csi.io/eviction-request": json.dumps(request)}}}))' \
    "$NS" "$(kn get pod restore-reader -o jsonpath='{.metadata.uid}')")
withdraw='{"metadata": {"labels": {"stickyvol.csi.io/eviction-requested": null}, "annotations": {"stickyvol.csi.io/eviction-request": null}}}'
defer 'k patch pv "$source_pv" --type=merge -p "$withdraw" >/dev/null 2>&1 || true'
as_node_plugin "$node" patch pv "$source_pv" --type=merge -p "$patch" >/dev/null ||
    fail "the node plugin on $node may not ask for evictions on its own PV"
refused() { kn get events --field-selector "involvedObject.name=source,reason=EvictionRequestRefused" -o jsonpath='{.items[*].message}'; }
until_ok 60 "the controller's EvictionRequestRefused event on claim source" '[[ -n $(refused) ]]'
[[ $(refused) == *"does not use claim $NS/source"* ]] || fail "the refusal says: $(refused)"
expect_eq "$(kn get pod restore-reader -o jsonpath='{.status.phase}{.metadata.deletionTimestamp}')" Running \
    "the pod named in the refused request"
k patch pv "$source_pv" --type=merge -p "$withdraw" >/dev/null

step "deleting the snapshot"
kn delete volumesnapshot snap --wait=true --timeout=120s >/dev/null || fail "snapshot not deleted"
