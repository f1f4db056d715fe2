# A volume's data copied straight from one node's plugin to the other's (docs/operations.md,
# "Moving a volume to another node"): a claim written on one node, an empty claim on the other,
# then `stickyvol volume pull` in the target node's driver pod. Refused while the source's PV
# does not name the target node in stickyvol.csi.io/move-to; then the same bytes arrive, over
# TLS from the source node's plugin, never through the API server.
# e2e-lane: growth
source "$(dirname "$0")/../lib/scenario.sh"

claim source 64Mi
pod writer source "" "cd /data && dd if=/dev/urandom of=blob bs=1M count=24 2>/dev/null && mkdir -p tree/deep && echo kept > tree/deep/note && sha256sum blob > sum && sync && sleep 100000"
wait_pod_running writer
node=$(pod_node writer)
other=$(other_node "$node")
claim target 64Mi
pod holder target "$other"
wait_pod_running holder
until_true 60 "the writer wrote" pexec writer test -s /data/sum
sum=$(pexec writer cat /data/sum)
# An export (and an import) takes an unpublished volume where the pool has no cheap snapshots.
kn delete pod writer holder --wait=true --timeout=60s >/dev/null
source_pv=$(pv_of source)
target_id=$(k get pv "$(pv_of target)" -o jsonpath='{.spec.csi.volumeHandle}')
pull() {
    k -n "$DRIVER_NS" exec "$(ready_driver_pod "$other")" -c stickyvol -- \
        stickyvol volume pull "$target_id" --from "$source_pv" 2>&1
}

step "refused while the source's PV does not name $other"
if out=$(pull); then
    fail "pulled without stickyvol.csi.io/move-to: $out"
fi
[[ $out == *"is not to move"* ]] || fail "refused, but not for the annotation: $out"

step "pulled from $node's plugin once the PV names $other"
k annotate pv "$source_pv" "stickyvol.csi.io/move-to=$other" >/dev/null
out=$(pull) || fail "the pull failed: $out"
[[ $out == *"from PV $source_pv on node $node into $target_id, sha256 "* ]] || fail "the pull said: $out"
k -n "$DRIVER_NS" logs "$(ready_driver_pod "$node")" -c stickyvol | grep -q "transfer: volume sent" ||
    fail "the source's plugin did not log the transfer"

step "the data arrived whole"
pod reader target "$other"
wait_pod_running reader
expect_eq "$(pexec reader sh -c 'cd /data && sha256sum blob')" "$sum" "the copy's checksum"
expect_eq "$(pexec reader cat /data/tree/deep/note)" kept "a file deep in the tree"
