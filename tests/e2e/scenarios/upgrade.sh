# An upgrade and a rollback with volumes in use. The previous release (PREVIOUS_RELEASE in
# versions.sh: its image built from that commit, its own deploy/) is applied over today's
# install; a filesystem and a block volume are written by running pods (a write every 0.1 s,
# each failure counted), and snapshotted. Then today's deploy/ is applied: the DaemonSet rolls
# node by node, the pods keep writing without an error, and every old volume can be published
# to another pod, expanded, snapshotted, restored and deleted; new claims work. Then the previous
# release again (the rollback): the pods keep writing, and it serves the volumes of both
# releases: a filesystem and a block volume of today's (the block one written through the
# rollback, then unpublished, published to another pod and deleted by the previous release).
# Today's install is applied again at exit, whatever happened.
source "$(dirname "$0")/../lib/scenario.sh"
source "$E2E_DIR/lib/build-previous.sh"

running_image() { k -n "$DRIVER_NS" get daemonset stickyvol-node -o jsonpath='{.spec.template.spec.containers[0].image}'; }
# The cluster first (so that against no cluster this fails, as the runner's self-test expects),
# then the image: none only in a clone without that commit (see lib/build-previous.sh).
today_image=$(running_image) || fail "cannot read the driver's DaemonSet"
[[ -f $(previous_dir)/image.tar ]] ||
    skip "no image of the previous release $PREVIOUS_RELEASE (a clone without that commit): coverage lost"
PREVIOUS=${PREVIOUS_RELEASE:0:12}
TODAY_OVERLAY=$E2E_STATE/deploy-overlay
PREVIOUS_OVERLAY=$E2E_STATE/previous-overlay
[[ -f $TODAY_OVERLAY/kustomization.yaml ]] || fail "no $TODAY_OVERLAY: the runner installs today's release first"

# The previous release as a user of it installed it (its deploy/examples/pool-on-some-nodes),
# with its image and our sidecar stand-ins.
mkdir -p "$PREVIOUS_OVERLAY"
{
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources: [$(realpath --relative-to="$PREVIOUS_OVERLAY" "$(previous_dir)/deploy/examples/pool-on-some-nodes")]"
    echo "images:"
    echo "- {name: ghcr.io/stickyvol/stickyvol, newName: stickyvol-e2e/stickyvol, newTag: previous-$PREVIOUS}"
    for mapping in "${E2E_STANDIN_IMAGES[@]}"; do
        new=${mapping#*=}
        echo "- {name: ${mapping%%=*}, newName: ${new%:*}, newTag: ${new##*:}}"
    done
} >"$PREVIOUS_OVERLAY/kustomization.yaml"

# apply_release OVERLAY WHAT: applies OVERLAY and waits until both workloads have rolled out.
apply_release() {
    k apply -k "$1" >/dev/null || fail "applying $2"
    k -n "$DRIVER_NS" rollout status daemonset/stickyvol-node --timeout=300s >/dev/null ||
        fail "$2: the DaemonSet did not roll out"
    k -n "$DRIVER_NS" rollout status statefulset/stickyvol-controller --timeout=300s >/dev/null ||
        fail "$2: the StatefulSet did not roll out"
    for node in "${E2E_NODES[@]}"; do ready_driver_pod "$node" 300 >/dev/null; done
}
defer 'apply_release "$TODAY_OVERLAY" "today'"'"'s release, again"'

step "the previous release ($PREVIOUS) applied over today's"
apply_release "$PREVIOUS_OVERLAY" "the previous release"
[[ $(running_image) == *previous-$PREVIOUS ]] || fail "the DaemonSet runs $(running_image)"

step "its volumes in use: a filesystem volume on ${E2E_NODES[0]}, a block volume on ${E2E_NODES[1]}"
claim fs 64Mi
# A write every 0.1 s; a failed one counted in /tmp/errors (outside the volume).
pod fs-writer fs "${E2E_NODES[0]}" \
    "i=0; while :; do i=\$((i+1)); echo \$i >>/data/log || echo \$i >>/tmp/errors; sleep 0.1; done"
BLOCK=1 claim blk 64Mi stickyvol Block
BLOCK=1 pod blk-writer blk "${E2E_NODES[1]}" \
    "i=0; while :; do i=\$((i+1)); echo \$i | dd of=/dev/xvda bs=512 seek=\$((i % 1000)) conv=fsync 2>/dev/null || echo \$i >>/tmp/errors; sleep 0.1; done"
wait_pod_running fs-writer 180
wait_pod_running blk-writer 180
snapshot old-snap fs
writes() { pexec fs-writer sh -c 'wc -l </data/log'; }
errors() { pexec "$1" sh -c 'cat /tmp/errors 2>/dev/null | wc -l'; }

step "today's release applied: the drivers roll node by node while the pods write"
before=$(writes)
apply_release "$TODAY_OVERLAY" "today's release"
expect_eq "$(running_image)" "$today_image" "the DaemonSet's image after the upgrade"
until_ok 30 "the filesystem writer goes on writing" '(( $(writes) > before + 10 ))'
expect_eq "$(errors fs-writer)" 0 "failed writes to the filesystem volume"
expect_eq "$(errors blk-writer)" 0 "failed writes to the block volume"

step "the old volumes with today's driver: published, expanded, snapshotted, restored, deleted"
pod fs-reader fs "${E2E_NODES[0]}"
wait_pod_running fs-reader 120
pexec fs-reader test -s /data/log || fail "a second pod does not see the old volume's data"
kn patch pvc fs --type=merge -p '{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}' >/dev/null
until_ok 120 "the old claim grown to 128Mi" '[[ $(kn get pvc fs -o jsonpath="{.status.capacity.storage}") == 128Mi ]]'
snapshot new-snap fs
for source in old-snap new-snap; do
    apply <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: from-$source}
spec:
  storageClassName: stickyvol
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 128Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: $source}
YAML
    pod "from-$source" "from-$source"
    wait_pod_running "from-$source" 120
    pexec "from-$source" test -s /data/log || fail "the restore of $source has no data"
done
kn delete pod blk-writer --wait=true --timeout=60s >/dev/null
old_pv=$(pv_of blk)
kn delete pvc blk --wait=true --timeout=60s >/dev/null
until_ok 120 "the old block volume deleted" '! k get pv "$old_pv" >/dev/null 2>&1'
claim fresh 64Mi
pod fresh-user fresh
wait_pod_running fresh-user 120
# A block volume today's release made (and staged), written through the rollback.
BLOCK=1 claim fresh-blk 64Mi stickyvol Block
BLOCK=1 pod fresh-blk-writer fresh-blk "" \
    "i=0; while :; do i=\$((i+1)); echo \$i | dd of=/dev/xvda bs=512 seek=\$((i % 1000)) conv=fsync 2>/dev/null || echo \$i >>/tmp/errors; sleep 0.1; done"
wait_pod_running fresh-blk-writer 120

step "rolled back to the previous release: the pods go on writing, and it serves both releases' volumes"
before=$(writes)
apply_release "$PREVIOUS_OVERLAY" "the rollback"
until_ok 30 "the filesystem writer goes on writing" '(( $(writes) > before + 10 ))'
expect_eq "$(errors fs-writer)" 0 "failed writes during the rollback"
# A volume today's release made, and an old one, published by the previous release.
pod fresh-again fresh "$(pod_node fresh-user)"
pod fs-again fs "${E2E_NODES[0]}"
wait_pod_running fresh-again 120
wait_pod_running fs-again 120
kn delete pod fresh-user fresh-again from-old-snap --wait=true --timeout=60s >/dev/null
kn delete pvc fresh from-old-snap --wait=true --timeout=60s >/dev/null
# Today's block volume: the previous release unpublishes it from its writer, publishes it to
# another pod with the data, and deletes it.
expect_eq "$(errors fresh-blk-writer)" 0 "failed writes to today's block volume during the rollback"
blk_node=$(pod_node fresh-blk-writer)
kn delete pod fresh-blk-writer --wait=true --timeout=60s >/dev/null ||
    fail "the previous release did not unpublish today's block volume"
BLOCK=1 pod fresh-blk-reader fresh-blk "$blk_node"
wait_pod_running fresh-blk-reader 120
[[ $(pexec fresh-blk-reader sh -c 'dd if=/dev/xvda bs=512 skip=1 count=1 2>/dev/null | tr -dc 0-9') =~ ^[0-9]+$ ]] ||
    fail "today's block volume, published by the previous release, lacks what its writer wrote"
fresh_blk_pv=$(pv_of fresh-blk)
kn delete pod fresh-blk-reader --wait=true --timeout=60s >/dev/null
kn delete pvc fresh-blk --wait=true --timeout=60s >/dev/null
until_ok 120 "today's block volume deleted by the previous release" '! k get pv "$fresh_blk_pv" >/dev/null 2>&1'
log "measured: upgrade and rollback with $(writes) writes to a volume in use, none failed"
